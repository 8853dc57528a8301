"""Whose `vault.status` asks the audit log records (vault.daemon.status_asks).

A process an agent left behind that asks the vault anything after the agent exited works past it
(contract §9, FAIL_DEADLINE), so its asks are recorded (`status_asked`). Recording every ask
(bd4d9fa, reverted) put every fixture's and `vaultsim status`'s polls in every daemon's log:
processes that never held a session and descend from none write nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit_daemon_helpers import events
from helpers import Sandbox
from hostile_fixtures import RawClient, frame, run_script, setup

# an agent that asks status a few times, then forks a child into its own process group and exits;
# the child, once its parent is gone (re-parented), connects and asks status ASKS times, and says
# its pid and group (it holds stdout: the run waits for it)
LEAVES_A_POLLER = """\
client.open_session('poller-agent', 'run-1')
for _ in range(5):
    client.request('vault.status')
parent = os.getpid()
if os.fork() == 0:
    deadline = time.monotonic() + 30
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)
    from vault.client import AgentClient
    late = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60)
    for _ in range(int(sys.argv[1])):
        late.request('vault.status')
    out({'child': os.getpid(), 'pgid': os.getpgrp(), 'parent': parent})
    os._exit(0)
out({'parent': parent})
"""


def _asked(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == "status_asked"]


@pytest.mark.timeout(120)
def test_a_child_left_in_its_agents_group_asking_status_is_recorded_sampled(sandbox: Sandbox) -> None:
    """A child that connects only once its agent exited (its ancestry then runs through init, never
    the agent) is in the agent's process group: its asks are recorded, its first 8 then powers of
    two (queued, no fsync of their own); the agent's own asks while it ran are not."""
    setup(sandbox)
    lines = run_script(sandbox, LEAVES_A_POLLER, "200")
    child = next(x for x in lines if "child" in x)
    asked = _asked(events(sandbox))
    assert {e["pid"] for e in asked} == {child["child"]}, asked
    assert [e["count"] for e in asked] == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128], asked
    assert all(e["pgid"] == child["pgid"] and e["lineage"] and isinstance(e["asked"], float) for e in asked), asked


@pytest.mark.timeout(120)
def test_fixture_and_cli_status_polls_write_nothing(sandbox: Sandbox) -> None:
    """The test's own process, a raw client and `vaultsim status` (none held a session, none below
    or in the group of a process that did) poll status after an agent exited: the log gets nothing
    from them (the next agent's session is the first record after the first agent's)."""
    setup(sandbox)
    run_script(sandbox, "client.open_session('gone', 'run-1')\nout('ok')\n")
    before = len(events(sandbox))
    for _ in range(20):
        assert sandbox.status() is not None
    with RawClient(sandbox.agent_sock) as raw:
        for i in range(20):
            assert "result" in raw.ask(frame("vault.status", {}, rid=i))
    assert sandbox.vaultsim("status").returncode == 0
    run_script(sandbox, "client.open_session('next', 'run-1')\nout('ok')\n")  # recorded after whatever was queued
    after = events(sandbox)[before:]
    assert [e["type"] for e in after] == ["session_opened", "session_closed"], after
    assert not _asked(events(sandbox))


@pytest.mark.timeout(120)
def test_a_supervisor_asking_status_after_its_worker_exited_writes_nothing(sandbox: Sandbox) -> None:
    """A careful agent's worker (its child, in its group) opens a session and ends; the agent, still
    running, asks status: it is in the group of a process that held a session and exited, but it
    started that process, so nothing is recorded (it is no process left behind)."""
    setup(sandbox)
    body = ("client.open_session('super', 'run-1')\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    from vault.client import AgentClient\n"
            "    AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60).open_session('super', 'run-1')\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "for _ in range(20):\n"
            "    client.request('vault.status')\n"
            "out('ok')\n")
    run_script(sandbox, body)
    run_script(sandbox, "client.open_session('next', 'run-1')\nout('ok')\n")  # recorded after whatever was queued
    assert not _asked(events(sandbox))
