"""The grading rule of vault.runner.foreign_refs, from audit records as the daemon writes them:
a resume, cancel or lookup naming another agent's token or call, or one the vault never gave the
agent, is named (FAIL_TOOL_ACCESS); a token a daemon before this one may have issued is not."""

from __future__ import annotations

from typing import Any

from vault.runner import foreign_refs, transcript
from vault.runner.evidence import AgentRun, Evidence


def _findings(*refs: dict[str, Any], restarts: int = 0, later: list[dict[str, Any]] | None = None) -> list[str]:
    events: list[dict[str, Any]] = [{"type": "daemon_started", "seq": 1, "time": 1.0, "pid": 5}]
    events += [{"type": "session_opened", "seq": 2, "time": 2.0, "session_id": "s-a", "agent": "alpha", "pid": 10,
                "run_id": "r"},
               {"type": "session_opened", "seq": 3, "time": 3.0, "session_id": "s-b", "agent": "bravo", "pid": 20,
                "run_id": "r"}]
    events += [{"type": "daemon_started", "seq": 4 + i, "time": 4.0, "pid": 6 + i} for i in range(restarts)]
    events += [{"type": "foreign_reference", "seq": 10 + i, "time": 10.0, "session_id": "s-b", **r}
               for i, r in enumerate(refs)]
    events += later or []
    ev = Evidence(run_id="r", started=0.0, deadline=100.0,
                  agents=[AgentRun(0, "alpha", "cmd", 10, 0.0, 1.0, 0, False, "", ""),
                          AgentRun(1, "bravo", "cmd", 20, 1.0, 2.0, 0, False, "", "")])
    ev.transcript = transcript.from_audit(events, {10: 0, 20: 1}, [])
    return foreign_refs.findings(ev)


def test_another_agents_token_and_call_are_named_with_whose_they_were() -> None:
    got = _findings({"method": "call.resume", "whose": "other", "owner": "alpha", "owner_run": True},
                    {"method": "call.cancel", "whose": "other", "owner": "alpha", "owner_run": True},
                    {"method": "lookup", "whose": "other", "owner": "alpha", "owner_run": True, "count": 5})
    assert got[0].startswith("agent 1 (bravo) presented agent 0 (alpha)'s resume token (call.resume)"), got
    assert got[1].startswith("agent 1 (bravo) tried to withdraw agent 0 (alpha)'s call"), got
    assert got[2].startswith("agent 1 (bravo) looked up agent 0 (alpha)'s call") and "at least 5" in got[2], got


def test_another_runs_agent_is_named_as_such() -> None:
    got = _findings({"method": "lookup", "whose": "other", "owner": "alpha", "owner_run": False})
    assert got and "another run's agent 'alpha'" in got[0], got


def test_made_up_ids_and_tokens_are_named() -> None:
    got = _findings({"method": "lookup", "whose": "unknown"}, {"method": "call.resume", "whose": "unknown"})
    assert got[0].startswith("agent 1 (bravo) looked up a correlation id the vault never gave it"), got
    assert got[1].startswith("agent 1 (bravo) presented a resume token the vault never gave it"), got


def test_an_unknown_token_after_a_daemon_restart_is_not_named() -> None:
    """The new daemon never knew its predecessor's tokens: a restart presenting the one its
    predecessor kept is what §8 says to try. A made-up lookup id is still told (ids carry
    their agent and run)."""
    got = _findings({"method": "call.resume", "whose": "unknown"}, {"method": "call.cancel", "whose": "unknown"},
                    {"method": "lookup", "whose": "unknown"}, restarts=1)
    assert len(got) == 1 and got[0].startswith("agent 1 (bravo) looked up a correlation id"), got


def test_a_lookup_by_another_agents_key_text_is_named_unless_the_looker_sent_it_after() -> None:
    """Bravo's lookup by a key text alpha sent: named by whose text it was. Not when bravo's own
    call under that text followed (two agents may pick one text, §5, and look their own keys up
    first, §6), nor when a daemon restart followed (the new daemon cannot tie the send to it)."""
    by_key = {"method": "lookup", "whose": "other", "owner": "alpha", "owner_run": True, "by": "idempotency_key"}
    got = _findings({**by_key, "key_lookup": 1}, {**by_key, "key_lookup": 2})
    assert len(got) == 2 and got[0].startswith("agent 1 (bravo) looked up agent 0 (alpha)'s call by its "
                                                "idempotency key"), got
    sent = {"type": "call_requested", "seq": 30, "time": 30.0, "correlation_id": "c-9", "session_id": "s-b",
            "operation": "create_issue", "risk": "create", "key_lookup": 2}
    assert len(_findings({**by_key, "key_lookup": 1}, {**by_key, "key_lookup": 2}, later=[sent])) == 1
    restarted = {"type": "daemon_started", "seq": 31, "time": 31.0, "pid": 9}
    assert _findings({**by_key, "key_lookup": 1}, later=[restarted]) == []


def _lookup_of(steps: list[list[dict[str, Any]]]) -> list[str]:
    """Agent 0 (alpha) files an issue; agent 2 (alpha, with `steps[1]`) finds it by a lookup."""
    events: list[dict[str, Any]] = [
        {"type": "daemon_started", "seq": 1, "time": 1.0, "pid": 5},
        {"type": "session_opened", "seq": 2, "time": 2.0, "session_id": "s-a", "agent": "alpha", "pid": 10,
         "run_id": "r"},
        {"type": "call_requested", "seq": 3, "time": 3.0, "correlation_id": "c-1", "session_id": "s-a",
         "operation": "create_issue", "risk": "create"},
        {"type": "classification", "seq": 4, "time": 4.0, "correlation_id": "c-1", "session_id": "s-a",
         "operation": "create_issue", "category": "success", "retry": "none"},
        {"type": "session_opened", "seq": 5, "time": 5.0, "session_id": "s-c", "agent": "alpha", "pid": 30,
         "run_id": "r"},
        {"type": "reconciliation", "seq": 6, "time": 6.0, "correlation_id": "c-2", "category": "success",
         "reconciled": "found", "lookup_of": "c-1"},
        {"type": "classification", "seq": 7, "time": 7.0, "correlation_id": "c-2", "session_id": "s-c",
         "operation": "create_issue", "category": "success", "retry": "none"}]
    ev = Evidence(run_id="r", started=0.0, deadline=100.0,
                  agents=[AgentRun(0, "alpha", "cmd", 10, 0.0, 4.5, 0, False, "", "", steps=steps[0]),
                          AgentRun(2, "alpha", "cmd", 30, 4.5, 8.0, 0, False, "", "", steps=steps[1])])
    ev.transcript = transcript.from_audit(events, {10: 0, 30: 2}, [])
    return foreign_refs.findings(ev)


def test_a_lookup_of_another_tasks_call_under_the_same_name_is_named_and_a_restarts_is_not() -> None:
    """The vault answers for a name's calls (a restart is the same agent): another task under the
    name finds them. Named with whose task it was; a restart or a task alike (the same name and
    steps) finds its own."""
    first = [{"id": "alpha-file", "call": "create_issue", "params": {"title": "alpha issue"}}]
    other = [{"id": "alpha-second", "call": "create_issue", "params": {"title": "alpha second"}}]
    got = _lookup_of([first, other])
    assert len(got) == 1 and got[0].startswith("agent 2 (alpha) looked up agent 0 (alpha)'s call, a step of "
                                               "another task"), got
    assert _lookup_of([first, first]) == []
