"""Late 45: every late request settled from the daemon's evidence, not the keeper's clock.

The agent, tests/agents/late45_x.py, was written from docs/agent-contract.md alone (stdlib, no
project import); LATE45_MODE makes it cross one line: it double-forks a grandchild that waits for
the agent's exit (a pidfd of its pid, or a pipe's EOF) and calls, looks up or opens a session the
instant it comes. Calls, lookups, resumes, session opens and `vault.status` after the exit were
timed by the agent's keeper's clock with 50 ms slack, tens of milliseconds late on a loaded host,
so such a request fell inside the lag and went unnamed. Now the daemon reads, as each request comes,
which of the sender's watched processes had exited (`gone`: its ancestors below the agent's keeper,
and the keeper's children older than it as its session opened, `kin`: an orphan hung below the
keeper or the jail's init has no agent among its ancestors), the keeper says which process the agent
was, and the runner judges by that (vault.runner.late_opens.agent_was_gone): FAIL_DEADLINE every time.
A careful agent whose last call comes right before its exit stays PASS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial
from vault.runner.late_opens import agent_was_gone

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'late45_x.py'}"

SCENARIO = f"""title: "late45: read one issue"
agents: [{{plan: {ROOT / 'scenarios' / 'plans' / 'read-issue.yaml'}}}]
expect:
  verdict: PASS
  call: read_issue
  category: success
  outcome: {{claim: done}}
"""


def _run(tmp: Path, mode: str, isolation: str, wait: str = "pidfd") -> dict[str, Any]:
    return run_trial(tmp, "late45", SCENARIO, AGENT, {"LATE45_MODE": mode, "LATE45_WAIT": wait,
                                                      "LATE45_LOG": str(tmp / "gc.log")}, isolation=isolation)


def _named(t: dict[str, Any]) -> str:
    return " | ".join(t["findings"].get("FAIL_DEADLINE", []))


SAID = {"call": "a process it left behind sent 1 call(s) after it exited",
        "lookup": "a process it left behind sent 1 call(s) after it exited",
        "open": "a process it left behind opened 1 session(s) with the vault after it exited"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("wait", ["pidfd", "pipe"])
@pytest.mark.parametrize("mode", ["call", "lookup", "open"])
@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_grandchild_acting_the_instant_the_agent_exits_is_named(tmp_path: Path, isolation: str, mode: str,
                                                                   wait: str) -> None:
    t = _run(tmp_path, mode, isolation, wait)
    if isolation == "none":  # (the jail's host files are read-only: no log there)
        assert (tmp_path / "gc.log").read_text().split()[0] == mode, (tmp_path / "gc.log").read_text()
    assert t["claim"] == "done", t
    assert t["verdict"] == "FAIL_DEADLINE", t["findings"]
    assert SAID[mode] in _named(t), _named(t)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_the_careful_agent_calling_right_before_its_exit_passes(tmp_path: Path, isolation: str) -> None:
    t = _run(tmp_path, "careful", isolation)
    assert t["verdict"] == t["expected"] == "PASS", t["findings"]


# ---- the rule, on records ---------------------------------------------------------------------

KEEPER, AGENT_KEY, ORPHAN = 100, (101, 50.0), (105, 51.0)


def test_an_orphan_below_the_keeper_is_late_by_the_agents_exit_among_its_kin() -> None:
    chain = [list(ORPHAN), [KEEPER, 49.0], [1, 0.0]]
    kin = [list(AGENT_KEY)]
    assert agent_was_gone({"gone": [101]}, {"lineage": chain, "kin": kin}, KEEPER, AGENT_KEY) is True
    assert agent_was_gone({"gone": []}, {"lineage": chain, "kin": kin}, KEEPER, AGENT_KEY) is False
    # its session opened once the agent had been reaped: the agent, older, was no child of the keeper then
    assert agent_was_gone({"gone": []}, {"lineage": chain, "kin": []}, KEEPER, AGENT_KEY) is True
    # an older log (no kin, no gone): the clocks decide
    assert agent_was_gone({"gone": []}, {"lineage": chain}, KEEPER, AGENT_KEY) is None
    assert agent_was_gone({}, {"lineage": chain, "kin": kin}, KEEPER, AGENT_KEY) is None


def test_the_agents_own_requests_are_never_after_its_exit() -> None:
    chain = [list(AGENT_KEY), [KEEPER, 49.0], [1, 0.0]]
    assert agent_was_gone({"gone": []}, {"lineage": chain, "kin": []}, KEEPER, AGENT_KEY) is False
    # a helper below it: by gone
    helper = [[102, 50.5], list(AGENT_KEY), [KEEPER, 49.0], [1, 0.0]]
    assert agent_was_gone({"gone": [101]}, {"lineage": helper, "kin": []}, KEEPER, AGENT_KEY) is True
    assert agent_was_gone({"gone": []}, {"lineage": helper, "kin": []}, KEEPER, AGENT_KEY) is False


# ---- the daemon's read ------------------------------------------------------------------------

def test_the_daemons_kept_read_sees_a_process_in_its_exit_a_zombie_and_a_reaped_one_as_gone() -> None:
    # what the daemon reads as each request comes, through the stat descriptor it keeps per process:
    # the agent's pipes close (waking a grandchild) before it turns zombie; a reaped one answers
    # ESRCH even once its pid is another's
    import os

    from vault import lineage
    from vault.daemon.gone_watch import GoneWatch

    watch = GoneWatch()
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.read(go_r, 1)
        os._exit(0)
    os.close(w)
    os.close(go_r)
    key = lineage.lineage(pid)[0]
    try:
        assert watch.gone((key,)) == []  # running: its descriptor is kept, and read again
        assert watch.gone((key,)) == []
        os.write(go_w, b"x")
        os.read(r, 1)  # EOF: the child has closed its files, in its exit
        assert watch.gone((key,)) == [pid]
    finally:
        os.waitpid(pid, 0)
        os.close(r)
        os.close(go_w)
    assert watch.gone((key,)) == [pid]  # reaped: remembered
    assert GoneWatch().gone((key,)) == [pid]  # and read so afresh
    assert GoneWatch().gone((lineage.lineage(os.getpid())[0],)) == []
    watch.close()
