"""The line between the core and the TUI: `vault` never imports Textual, `tui` uses only the client.

Checked in a fresh interpreter (an earlier test may already have imported
Textual into this one) and by reading the import statements of `tui/`.
"""

from __future__ import annotations

import ast
import subprocess

from helpers import PY, ROOT

# what `tui` may use from the core: the client, the home layout, its errors, the CLI's --home,
# the helper that makes agent-chosen text printable, where the shipped files are (the demo's plan),
# the one that closes an approver's memory to other processes of the user (it holds the approver token),
# and the notification models (vault.wire): the contract the TUI reads, the same models the daemon writes
# vault.text and vault.lookalike are pure text helpers (what a person reads on the screen), no core access;
# vault.stop_signals says which stop signals a command catches (one ignored at start stays ignored)
ALLOWED_FROM_VAULT = {"vault.client", "vault.home", "vault.errors", "vault.cli.main", "vault.text", "vault.resources",
                      "vault.proc_guard", "vault.wire", "vault.lookalike", "vault.stop_signals"}
# the demo's set-up (not the TUI) starts its world as every harness does: the runner's live world
SETUP_ONLY = {"tui/demo.py": {"vault.runner.live", "vault.runner.world_procs"}}


class TestBoundary:
    def test_vault_never_imports_textual(self) -> None:
        """Importing every vault module (the daemon, the CLI, the approvers) leaves Textual unloaded."""
        code = (
            "import importlib, pkgutil, sys, vault\n"
            "for m in pkgutil.walk_packages(vault.__path__, 'vault.'):\n"
            "    if m.name.endswith('__main__'):\n"
            "        continue\n"
            "    try:\n"
            "        importlib.import_module(m.name)\n"
            "    except ImportError:\n"
            "        pass  # an optional extra (e.g. mcp) that is not installed\n"
            "print(sorted(n for n in sys.modules if n == 'textual' or n.startswith('textual.')))\n"
        )
        out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert 0 == out.returncode, out.stderr
        assert "[]" == out.stdout.strip()

    def test_tui_reaches_the_core_only_through_the_client(self) -> None:
        """Every `vault` import in tui/ is one of the client-side modules."""
        used: set[str] = set()
        for path in (ROOT / "tui").rglob("*.py"):
            mine: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    mine.add(node.module)
                elif isinstance(node, ast.Import):
                    mine.update(a.name for a in node.names)
            used |= mine - SETUP_ONLY.get(str(path.relative_to(ROOT)), set())
        assert set() == {m for m in used if m.split(".")[0] == "vault"} - ALLOWED_FROM_VAULT
