"""Red-team pass 23 over the pytest plugin: suites a user writes from docs/ci.md alone.

The fault found, now fixed:

    pytest-timeout's thread     its timer thread calls os._exit(1) mid-test: no teardown runs. The
    method (and any runner      world's directory (vault home, keyring, credential files) stayed
    that dies by SIGKILL or     behind, against docs/ci.md ("the home and its keyring entry are
    os._exit)                   removed ... when pytest is interrupted"), and without the fork
                                server the agent kept running for its whole sleep. Now the
                                runner's Registry keeps a small reaper process told which
                                directories and process groups are live (vault.runner.reaper):
                                when the runner's end of its pipe closes, however it ended, it ends
                                those groups and removes those directories

Tried and already right: an unjailed agent that double-forks a setsid grandchild and exits
(FAIL_DEADLINE, the grandchild killed at teardown); a test that fails mid-trial with a request
still waiting for a person through `vaultsim.client()` (its relay ended and its home removed);
the MCP pipe host of tests/mcp_agents/rt23m_pipe_host.py under `run_agent` (see
tests/test_redteam_mcp23.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ROOT

pytest.importorskip("pytest_timeout", reason="pytest-timeout is not installed")

HANGS = """
import os, sys
import pytest

AGENT = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"]

# func_only: 8 s of the test's own call, not of the world's set-up too (up to 4.2 s on a loaded
# host), so the agent has started and written its pid when pytest ends
@pytest.mark.timeout(8, method="thread", func_only=True)
def test_hangs(vaultsim):
    open({seen!r}, "w").write(str(vaultsim.home))
    vaultsim.run_agent([*AGENT, {pid!r}], task={{"operations": ["read_issue"], "steps": [], "deadline_s": 60}},
                       isolation="none")
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")


def _gone(what: Callable[[], bool], timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.05)
    return bool(what())


@pytest.mark.parametrize("fork_server", [True, False], ids=["fork-server", "no-fork-server"])
def test_pytest_timeouts_thread_method_leaves_no_world_behind(tmp_path: Path, fork_server: bool) -> None:
    """A user's suite with `@pytest.mark.timeout(8, method="thread", func_only=True)` on a test
    whose agent hangs: pytest-timeout ends pytest with os._exit(1) from its timer thread. The
    world's home (under --basetemp) must still go, and the agent with it, within seconds."""
    seen, pid = tmp_path / "home", tmp_path / "agent.pid"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_hangs.py").write_text(HANGS.format(seen=str(seen), pid=str(pid)))
    args = [] if fork_server else ["--vaultsim-no-fork-server"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--rootdir", str(suite), "-c", "/dev/null", "--basetemp", str(tmp_path / "bt"),
                          *args, str(suite)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Timeout" in out.stdout + out.stderr and out.returncode != 0, out.stdout[-3000:]
    home = Path(seen.read_text())
    agent = int(pid.read_text())
    assert _gone(lambda: not home.parent.exists()), sorted(str(p) for p in home.parent.rglob("*"))[:20]
    assert _gone(lambda: not _alive(agent)), f"the agent {agent} is still running"
