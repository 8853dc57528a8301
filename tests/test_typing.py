"""`mypy --strict vault/ tui/` is clean: the seams between the daemon's parts stay typed, and
the TUI's use of them (tui/ went unchecked, and three errors grew in tui/demo.py).

Run as CI runs it, in a fresh interpreter from the repo root, so pyproject.toml's
[tool.mypy] applies (stubs come from the test extra). The cache is the default
.mypy_cache at the root: a later run rechecks only what changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


class TestTyping:
    # a cold run checks ~140 modules: minutes on a loaded two-core machine
    @pytest.mark.timeout(900)
    def test_vault_and_tui_are_mypy_strict_clean(self) -> None:
        """Every module under vault/ and tui/ passes `mypy --strict`; the failure shows mypy's report."""
        out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "vault/", "tui/"], cwd=ROOT,
                             capture_output=True, text=True, timeout=840)
        report = out.stdout + out.stderr
        assert 0 == out.returncode, f"mypy --strict vault/ tui/ failed:\n{report}"
        # rc 0 with nothing checked (a wrong path, an empty `files`) would prove nothing
        assert "Success: no issues found" in out.stdout, report
