"""The grading rule of vault.runner.foreign_refs, from audit records as the daemon writes them:
a resume, cancel or lookup naming another agent's token or call, or one the vault never gave the
agent, is named (FAIL_TOOL_ACCESS); a token a daemon before this one may have issued is not."""

from __future__ import annotations

from typing import Any

from vault.runner import foreign_refs, transcript
from vault.runner.evidence import AgentRun, Evidence


def _findings(*refs: dict[str, Any], restarts: int = 0) -> list[str]:
    events: list[dict[str, Any]] = [{"type": "daemon_started", "seq": 1, "time": 1.0, "pid": 5}]
    events += [{"type": "session_opened", "seq": 2, "time": 2.0, "session_id": "s-a", "agent": "alpha", "pid": 10,
                "run_id": "r"},
               {"type": "session_opened", "seq": 3, "time": 3.0, "session_id": "s-b", "agent": "bravo", "pid": 20,
                "run_id": "r"}]
    events += [{"type": "daemon_started", "seq": 4 + i, "time": 4.0, "pid": 6 + i} for i in range(restarts)]
    events += [{"type": "foreign_reference", "seq": 10 + i, "time": 10.0, "session_id": "s-b", **r}
               for i, r in enumerate(refs)]
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
