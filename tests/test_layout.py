"""The layout shows the architecture, and the import rules keep it (issue #17).

`lint-imports` checks the contracts in `.importlinter` against the real import
graph: the gate and the store speak no JSON-RPC, `vault` imports no Textual, the
daemon's parts never import the runner or the CLI, and no import circle runs
between the daemon's parts. The other checks keep the folder names and the
README's layout section honest.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VAULT = ROOT / "vault"

# what a newcomer should read from the folder names alone
PACKAGES = {
    "daemon": "listens and serves",
    "gate": "decides",
    "store": "holds credentials",
    "audit": "records",
    "executors": "performs calls",
    "remote": "simulates the world",
    "runner": "grades",
    "cli": "command line",
    "approvers": "scripted approver",
}


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("lint-imports is not installed: `pip install -e .[test]` brings import-linter")
    proc = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_each_part_is_a_package_that_says_what_it_is(name: str) -> None:
    module = importlib.import_module(f"vault.{name}")
    assert (VAULT / name / "__init__.py").is_file()
    assert module.__doc__ and len(module.__doc__.strip()) > 40, f"vault/{name}/__init__.py needs a docstring"


def test_every_module_has_a_docstring() -> None:
    missing = []
    for path in sorted(list(VAULT.rglob("*.py")) + list((ROOT / "tui").rglob("*.py"))
                       + list((ROOT / "agent_stub").rglob("*.py"))):
        if "scenarios" in path.relative_to(ROOT).parts:
            continue  # shipped sample files, not modules of the package
        tree = ast.parse(path.read_text())
        if ast.get_docstring(tree) is None and tree.body:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"modules without a docstring: {missing}"


def test_readme_layout_names_every_part() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    for name in PACKAGES:
        assert re.search(rf"^  {name}/ ", section, re.M), f"README's layout section does not name vault/{name}/"


def test_no_flat_daemon_modules_left_behind() -> None:
    # the daemon's parts, the store and the CLIs live in their packages; a module
    # added flat beside them again is caught here
    flat = {p.stem for p in VAULT.glob("*.py")}
    strays = flat & {"daemon", "calls", "agent_api", "approver_api", "rpc_server", "sessions", "store",
                     "keystore", "secret"} | {s for s in flat if s.endswith("_cli")}
    assert not strays, f"modules that belong in a package: {sorted(strays)}"


def test_the_old_keyring_setting_still_selects_the_file_keyring(tmp_path: Path) -> None:
    # `PYTHON_KEYRING_BACKEND=vault.keyring_backend.FileKeyring` is in users' CI configs
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VAULTSIM_KEYRING_DIR": str(tmp_path / "kr"),
           "PYTHON_KEYRING_BACKEND": "vault.keyring_backend.FileKeyring"}
    code = ("import keyring; keyring.set_password('svc', 'u', 'v'); "
            "print(type(keyring.get_keyring()).__module__, keyring.get_password('svc', 'u'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["vault.store.keyring_backend", "v"]
