"""A session opened below the agent in a session or group of its own is still the agent's.

`script -qec CMD` (a pty, as a user logs a run) starts CMD in a new session with the pty as its
controlling terminal, so the agent's Python process has neither the runner-started process's pid,
group nor session: the transcript took its session for a process left behind, and an answer the
vault wrote after the agent had exited (the teardown settling its handed-over wait
`approval_unroutable`) counted as received: gate-8 graded a careful agent that said `waiting`
FAIL_UNROUTED_WAIT and FAIL_CATEGORY (red team 47c, tests/agents/rt47c_launch.sh `script,timeout`).
The daemon records each opener's ancestry (`lineage`): an agent in it owns the session.
"""

from __future__ import annotations

from typing import Any

from vault.runner.transcript import from_audit

WINDOWS = [(0.9, 1.35)]
PIDS = {41: 0}       # the process the runner started (the jail's keeper, or the agent)
PENDING = {"category": "approval_pending", "retry": "after_approval", "operation": "create_issue"}
UNROUTABLE = {"category": "approval_unroutable", "retry": "human_required", "operation": "create_issue"}


def _log(opener: dict[str, Any]) -> list[dict[str, Any]]:
    """A call answered pending at 1.15, a resume sent at 1.2 still in flight when the agent exits
    (its session gone at 1.3), answered unroutable by the teardown at 1.5."""
    return [
        {"type": "session_opened", "session_id": "s-1", "agent": "bot", "run_id": "r", "time": 1.0, **opener},
        {"type": "call_requested", "correlation_id": "c-1", "session_id": "s-1", "operation": "create_issue",
         "target": "create_issue on tracker", "time": 1.1},
        {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", **PENDING, "time": 1.15},
        {"type": "session_closed", "session_id": "s-1", "reason": "process exited", "time": 1.3},
        {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", **UNROUTABLE,
         "asked": 1.2, "time": 1.5},
    ]


def _last(opener: dict[str, Any]) -> Any:
    t = from_audit(_log(opener), PIDS, WINDOWS, [0])
    return t.entries[-1]


def test_an_answer_after_a_pty_child_exited_reached_nobody() -> None:
    # script's child: its own session and group, the agent two levels up
    last = _last({"pid": 77, "pgid": 77, "sid": 77, "lineage": [[77, 5.0], [60, 4.9], [41, 4.8], [1, 0.0]]})
    assert last.category == "approval_unroutable"
    assert last.agent_index == 0
    assert last.unreceived is True


def test_the_agent_in_its_own_group_is_still_found_as_before() -> None:
    assert _last({"pid": 41, "pgid": 41, "sid": 41}).unreceived is True


def test_a_process_of_no_agent_is_still_nobodys() -> None:
    last = _last({"pid": 90, "pgid": 90, "sid": 90, "lineage": [[90, 5.0], [1, 0.0]]})
    assert last.unreceived is not True


def test_the_farthest_agent_in_the_chain_owns_it() -> None:
    # a later agent (pid 42) whose tree holds a process with an earlier agent's pid (41, reused)
    events = _log({"pid": 77, "pgid": 77, "sid": 77, "lineage": [[77, 5.0], [41, 4.95], [42, 4.8], [1, 0.0]]})
    t = from_audit(events, {41: 0, 42: 1}, [(0.1, 0.5), (0.9, 1.35)], [0, 1])
    assert t.sessions["s-1"]["agent_index"] == 1
