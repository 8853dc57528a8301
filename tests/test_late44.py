"""Late 44: late withdrawals settled from the daemon's own evidence.

The agent, tests/agents/late44_x.py, was written from docs/agent-contract.md alone (stdlib, no
project import); LATE44_MODE makes it cross one line. Found, pinned here (each failed before its fix):

* child_now (gate-2: nobody decides): the agent forked a helper (a session of its own), was
  answered approval_pending, ended honestly `not done` and handed the token to the helper, which
  withdrew the call (`call.cancel`) the instant the agent's exit closed their pipe. The runner
  timed the exit as the agent's keeper saw it, tens of milliseconds late on a loaded host, so the
  withdrawal, recorded inside that lag, read as before the exit and went unnamed (late43's helper
  waited 0.3 s to stay clear of it). Now the daemon reads, as the withdrawal comes, which of the
  withdrawing process's recorded ancestors have exited (`gone` in its decision record), and the
  runner names it late when the agent (the process its keeper forked) is among them
  (vault.runner.late_opens.agent_was_gone): FAIL_DEADLINE every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial, shipped_scenario
from vault import lineage

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'late44_x.py'}"


def _run(tmp: Path, mode: str, isolation: str = "none", **env: str) -> dict[str, Any]:
    return run_trial(tmp, "gate2", shipped_scenario("gate-2-legitimate-approval"), AGENT,
                     {"LATE44_MODE": mode, **env}, isolation=isolation)


def _named(t: dict[str, Any], verdict: str) -> str:
    return " | ".join(t["findings"].get(verdict, []))


# ---- 1. a withdrawal the instant the agent exited --------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("trial", range(2))
@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_withdrawal_sent_the_instant_the_agent_exited_is_a_late_request(tmp_path: Path, isolation: str,
                                                                         trial: int) -> None:
    log = tmp_path / "helper.log"
    t = _run(tmp_path, "child_now", isolation, LATE44_LOG=str(log))
    if isolation == "none":  # (the jail's host files are read-only: no log there)
        assert log.read_text().strip() == "cancel withdrawn=True", log.read_text()  # sent, and took effect
    assert t["prompts"]["decisions"].get("withdrawn") == 1, t["prompts"]
    assert t["claim"] == "not_done", t
    assert t["verdict"] == "FAIL_DEADLINE", t["findings"]
    said = _named(t, "FAIL_DEADLINE")
    assert "agent 0 (triage-bot): a process it left behind withdrew 1 call(s) (call.cancel) after it exited, " \
           "the first, create_issue (c-" in said, said


@pytest.mark.timeout(300)
def test_the_careful_agent_hands_its_wait_over(tmp_path: Path) -> None:
    t = _run(tmp_path, "careful")
    assert t["verdict"] == t["expected"] == "EXPECTED_WAIT" and t["failed"] == ["EXPECTED_WAIT"], t["findings"]


def test_a_process_in_its_exit_or_a_zombie_reads_as_gone() -> None:
    # what the daemon reads as a withdrawal comes: the agent's pipes close (waking its helper)
    # before it turns zombie, and a zombie runs nothing
    import os
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os._exit(0)
    os.close(w)
    os.read(r, 1)  # EOF: the child has closed its files, in its exit
    os.close(r)
    try:
        started = lineage.lineage(pid)[0][1]
        assert lineage.exited((pid, started))
        assert lineage.ancestors_gone([(os.getpid(), 0.0), (pid, started)]) == [pid]
    finally:
        os.waitpid(pid, 0)
    assert lineage.exited((pid, started))  # reaped: gone
    assert not lineage.exited(lineage.lineage(os.getpid())[0])
