"""A core part that cannot be imported stops the daemon with a traceback; it never starts degraded.

Before, a broken `vault.audit` import started a daemon with no audit log, and a
broken executor import answered every call with "service not configured". The
import is broken here the way a bad install breaks it: the module cannot load.
"""

from __future__ import annotations

import subprocess

import pytest

from helpers import PY, ROOT, Sandbox

BREAK_AND_START = (
    "import sys\n"
    "sys.modules[{module!r}] = None  # importing it now raises ImportError, as a broken install would\n"
    "from vault.cli.main import main\n"
    "sys.exit(main(['daemon', '--foreground', '--unlocked']))\n"
)


@pytest.mark.parametrize("module", ["vault.audit.adapter", "vault.executors.ssh", "vault.executors.http",
                                    "vault.daemon.diagnostics"])
def test_a_broken_core_import_is_a_crash_with_a_traceback(sandbox: Sandbox, module: str) -> None:
    out = subprocess.run([PY, "-c", BREAK_AND_START.format(module=module)], env=sandbox.env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" in out.stderr and "ModuleNotFoundError" in out.stderr and module in out.stderr, out.stderr
    assert sandbox.status() is None  # nothing is serving the home
    assert not sandbox.agent_sock.exists()
