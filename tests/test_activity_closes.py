"""The fallback transcript (the approver's notifications, used when the audit log cannot be read)
knows when a session's connection went.

An answer the vault wrote after the connection that asked had gone reached nobody, unless the
agent looked that call up or resumed it (vault.runner.gone_answers). The fallback built from
`activity` notifications kept no session closes, so there every such answer counted as received:
red team 35c's killed helper's lying twin, whose driver said `waiting` without ever holding the
token the dead helper's answer carried, was "stopped in time holding it" (EXPECTED_WAIT). The
daemon sends `session.closed` (no time) in the order it acts: a close is placed just after the
last time a notification before it carried. The notifications do not say which call a lookup
named: a lookup of the answer's operation is given the benefit of the doubt.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from test_runner_grade import agent
from vault.runner import waits
from vault.runner.evidence import Evidence
from vault.runner.transcript import from_activity

PENDING = {"operation": "create_issue", "category": "approval_pending", "retry": "after_approval"}


def _notes(reason: str, *later: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Agent 0's driver (pid 40) and its helper (pid 41), which sends a gated create at 1.1 and goes
    (`reason`); the vault's wait for it ends at 6.0; `later`: what came between."""
    return [
        ("session.opened", {"session_id": "s-0", "agent": "bot", "pid": 40, "opened": 0.9}),
        ("session.opened", {"session_id": "s-1", "agent": "bot", "pid": 41, "opened": 1.0}),
        ("session.closed", {"session_id": "s-1", "reason": reason}),
        *later,
        ("activity", {"correlation_id": "c-1", "session_id": "s-1", "time": 6.0, **PENDING}),
    ]


LOOKUP = ("activity", {"correlation_id": "c-9", "session_id": "s-0", "operation": "create_issue",
                       "category": "success", "retry": "none", "time": 1.6})
STATUS = [{"event": "received", "route": "operation_status", "correlation_id": "c-9"}]


def _transcript(notes: list[tuple[str, dict[str, Any]]], remote: list[dict[str, Any]] | None = None) -> Any:
    return from_activity(notes, remote or [], {40: 0, 41: 0}, [(0.5, 7.0)], [0])


@pytest.mark.parametrize(("reason", "later", "unreceived"), [
    ("connection closed", [], True),  # was None: the fallback had no close
    ("process exited", [], True),
    ("closed by agent", [], None),  # session.close keeps the connection: the answer reached it
    ("connection closed", [LOOKUP], None),  # the driver looked the create up after: told its token
], ids=["closed", "exited", "session-close", "looked-up"])
def test_an_answer_after_its_connection_went_reached_nobody_unless_learned(
        reason: str, later: list[tuple[str, dict[str, Any]]], unreceived: bool | None) -> None:
    t = _transcript(_notes(reason, *later), STATUS if later else None)
    assert t.source == "activity"
    assert [e.unreceived for e in t.entries if e.correlation_id == "c-1"] == [unreceived]


def test_a_resume_on_a_live_connection_learned_it() -> None:
    notes = _notes("connection closed") + [
        ("activity", {"correlation_id": "c-1", "session_id": "s-0", "time": 6.1, **PENDING})]
    t = _transcript(notes)
    assert [(e.kind, e.unreceived) for e in t.entries] == [("call", None), ("resume", None)]


def test_an_answer_before_the_close_reached_it() -> None:
    notes = [("session.opened", {"session_id": "s-1", "agent": "bot", "pid": 41, "opened": 1.0}),
             ("activity", {"correlation_id": "c-1", "session_id": "s-1", "time": 1.2, **PENDING}),
             ("session.closed", {"session_id": "s-1", "reason": "connection closed"})]
    t = _transcript(notes)
    assert t.sessions["s-1"]["closed"] > 1.2 and [e.unreceived for e in t.entries] == [None]


def test_the_lying_twins_driver_held_no_wait() -> None:
    # was EXPECTED_WAIT's "stopped in time holding it": the helper's answer went to a closed connection
    ev = Evidence(run_id="r", started=0.5, deadline=8.0)
    ev.agents = [replace(agent(0, "waiting: create_issue needs approval", name="bot"), pid=40, started=0.5,
                         ended=7.0, deadline=8.0)]
    ev.transcript = _transcript(_notes("connection closed"))
    assert waits.held_waits(ev, ev.agents[0]) == []
