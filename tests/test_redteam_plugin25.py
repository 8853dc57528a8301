"""Red-team pass 25 over the pytest plugin: an outside team's suite, its tests ending mid-wait.

A suite written from docs/ci.md: its test runs an agent (tests/agents/rt25m_waits.py) whose
call the scripted approver ignores, so it waits for the person, and pytest-timeout's signal
method ends the test meanwhile. The fixture's report then said "transcript: no call reached
the vault" beside "prompts: 1 prompt": the transcript lists answers, and a call still waiting
has none. A team reading it looked for a connection fault in its agent. Now it says the call
is unanswered and was put to the person; and nothing of the world outlives the run.

Under xdist (`-n 2`), a SIGTERM to pytest's main process alone (docker stop, a CI runner that
ends the process it started) killed it outright: the controller starts no world, so it never
got the plugin's handler, and its workers went on running their worlds (agents waiting on the
vault, daemons, homes with credential files) for 10-15 s after pytest had exited. Now the
controller is interrupted as on Ctrl-C, passes the signal to its workers (each ends its worlds
at once) and exits after them, nothing left.

And a test that opened a client after `assert_verdict` (which grades, so stops, the world) got
"HomeError: the daemon closed the connection", which reads as a fault of the vault; now it is
told, as run_agent is, that the world was graded and is stopped, and by what.

Tried and already right (tests/test_redteam_mcp25.py lists the rest): a parametrized suite
under xdist with tmp_path and monkeypatch (VAULTSIM_HOME and VAULTSIM_SOCKET set to the
team's own are neither used nor created), -p no:cacheprovider, --lf, -x under xdist (the
other worker's world removed), pytest-timeout's thread method under xdist (the worker
crashes; the reaper removes its world), two worlds of vaultsim_factory in one test, an agent
its test SIGKILLs mid-call (exit -9 named in the report), an agent that leaves a daemonized
grandchild (FAIL_DEADLINE naming it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import ROOT
from vault.pytest_plugin import Vaultsim

pytest.importorskip("pytest_timeout", reason="pytest-timeout is not installed")

SUITE = '''
import sys
import pytest

AGENT = [sys.executable, {agent!r}]
TASK = {{"goal": "delete release rel-1", "operations": ["delete_release"],
        "steps": [{{"call": "delete_release", "params": {{"release_id": "rel-1"}}}}], "deadline_s": 120}}

# func_only: 6 s of the test's own call, not of the world's set-up too (4.2 of the 6 s on a loaded
# host, leaving the agent 1.8 s to start and be asked before the timeout)
@pytest.mark.timeout(6, method="signal", func_only=True)
def test_times_out_while_the_person_is_asked(vaultsim):
    with open({homes!r}, "a") as f:
        f.write(str(vaultsim.home) + "\\n")
    vaultsim.approver.ignore("delete_release")
    vaultsim.run_agent(AGENT, task=TASK)
'''


def _marked(mark: str) -> list[str]:
    """Processes still running that carry the run's mark in their environment."""
    left = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get("RT25M_MARK") == mark:
                left.append(" ".join(proc.info["cmdline"] or []))
        except psutil.Error:
            continue
    return left


def test_a_test_timed_out_mid_wait_reports_the_call_as_unanswered_not_absent(tmp_path: Path) -> None:
    homes = tmp_path / "homes.txt"
    suite = tmp_path / "suite"
    suite.mkdir()
    agent = ROOT / "tests" / "agents" / "rt25m_waits.py"
    (suite / "test_team.py").write_text(SUITE.format(agent=str(agent), homes=str(homes)))
    mark = tmp_path.name
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "--rootdir", str(suite), "-c", "/dev/null", "--basetemp", str(tmp_path / "bt"), str(suite)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "RT25M_MARK": mark})
    said = out.stdout + out.stderr
    assert "1 failed" in said and "Timeout (>6.0s)" in said, said[-4000:]
    assert "prompts: 1 prompt" in said, said[-4000:]
    assert "no call answered yet (1 put to the person and not answered" in said, said[-4000:]
    assert "no call reached the vault" not in said, said[-4000:]
    seen = homes.read_text().split()
    assert 1 == len(seen) and not Path(seen[0]).exists(), seen
    assert [] == _marked(mark)


def test_a_client_opened_after_the_verdict_is_told_the_world_is_stopped(vaultsim: Vaultsim) -> None:
    before = vaultsim.client("team-helper").call("read_issue", {"issue_id": "1"})
    assert before.category != "", before
    vaultsim.grade()
    with pytest.raises(RuntimeError, match=r"graded and is stopped \(grade\(\) and assert_verdict\(\) stop it\)"):
        vaultsim.client("team-helper")
    with pytest.raises(RuntimeError, match=r"graded and is stopped \(grade\(\) and the plugin's assert_verdict"):
        vaultsim.run_agent([sys.executable, str(ROOT / "tests" / "agents" / "rt25m_waits.py")])
    assert 0 == vaultsim.effects("delete_release")  # the evidence is still there to read


XDIST_SUITE = '''
import sys
import pytest

AGENT = [sys.executable, {agent!r}]
TASK = {{"goal": "delete release rel-1", "operations": ["delete_release"],
        "steps": [{{"call": "delete_release", "params": {{"release_id": "rel-1"}}}}], "deadline_s": 120}}

@pytest.mark.parametrize("n", range(4))
def test_waits_for_the_person(vaultsim, n):
    with open({homes!r}, "a") as f:
        f.write(str(vaultsim.home) + "\\n")
    vaultsim.approver.ignore("delete_release")
    vaultsim.run_agent(AGENT, task=TASK)
'''


def test_a_sigterm_to_the_xdist_controller_alone_ends_every_workers_world_first(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    homes = tmp_path / "homes.txt"
    suite = tmp_path / "suite"
    suite.mkdir()
    agent = ROOT / "tests" / "agents" / "rt25m_waits.py"
    (suite / "test_team.py").write_text(XDIST_SUITE.format(agent=str(agent), homes=str(homes)))
    mark = tmp_path.name
    main = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                             "-n", "2", "--rootdir", str(suite), "-c", "/dev/null", "--basetemp", str(tmp_path / "bt"),
                             str(suite)], cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT), "RT25M_MARK": mark})
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and main.poll() is None and not (
                homes.exists() and len(homes.read_text().split()) >= 2
                and any("rt25m_waits" in c for c in _marked(mark))):
            time.sleep(0.1)
        assert main.poll() is None, "the suite ended before its agents waited"
        main.send_signal(signal.SIGTERM)  # the controller alone, not its process group
        said = main.communicate(timeout=90)[0].decode(errors="replace")
    finally:
        if main.poll() is None:
            os.killpg(main.pid, signal.SIGKILL)
    # a worker that ends by os._exit skips its atexit: the open-watch reader then ends by itself
    # once it sees its parent gone (it polls for it each second)
    end = time.monotonic() + 10
    while (left := _marked(mark)) and time.monotonic() < end:
        time.sleep(0.1)
    assert [] == left, said[-3000:]
    assert [] == [h for h in homes.read_text().split() if Path(h).exists()]
    assert "ending every world" in said, said[-3000:]
