"""A restart that learns its pending step's resume token from a lookup holds that wait.

Section 6: a lookup of a call still waiting for its owner answers `unknown` with the call's
`request_id`, `deadline` and `resume_token`. Section 7: an agent holds what one of its processes
was told, a lookup included. So a restart that lost its state (or whose predecessor crashed before
keeping the token) looks the step up by its key, is told the token, and, its deadline near, saves
it and finishes `waiting: ... (request r-...)`: it holds that approval. The grader looked only at
the call's own answers and resumes, so that process "reports a wait, but it held no approval"
(FAIL_OUTCOME). The vault now records, on a lookup's reconciliation record, the request whose
token it told (never the token), and the wait checks (vault.runner.waits) count such a lookup as
an `approval_pending` answer to the looking process: received while it ran, its own task's call,
not decided before it stopped. A `waiting` that held nothing, a lookup of another task's call, one
answered after the process was gone, or one of a call already decided still fail.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial
from test_runner_grade import agent, graded, scenario
from vault.runner.evidence import Evidence
from vault.runner.transcript import from_audit

FILE = [{"id": "file", "call": "create_issue", "params": {"title": "Flaky login test"}}]
OTHER = [{"id": "file-2", "call": "create_issue", "params": {"title": "Flaky login test"}}]
PENDING = {"operation": "create_issue", "category": "approval_pending", "retry": "after_approval"}
# agent 0 (pid 41) runs 0.9-1.35; the restart, agent 1 (pid 42), 1.45-3.0
WINDOWS = [(0.9, 1.35), (1.45, 3.0)]
PIDS = {41: 0, 42: 1}
WAITING = "waiting: create_issue needs approval from release-manager (request r-1)"


def _log(*later: dict[str, Any]) -> list[dict[str, Any]]:
    """Agent 0 sends a gated create at 1.1, is told approval_pending at 1.15 and exits (1.3)
    without keeping the token; `later`: what its restart did in session s-2."""
    return [
        {"type": "session_opened", "session_id": "s-1", "agent": "bot", "pid": 41, "run_id": "r", "time": 1.0},
        {"type": "call_requested", "correlation_id": "c-1", "session_id": "s-1", "operation": "create_issue",
         "target": "create_issue on tracker", "time": 1.1},
        {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", **PENDING, "resumed": False,
         "time": 1.15},
        {"type": "session_closed", "session_id": "s-1", "reason": "process exited", "time": 1.3},
        {"type": "session_opened", "session_id": "s-2", "agent": "bot", "pid": 42, "run_id": "r", "time": 1.5},
        *later,
    ]


def _lookup(at: float, told: bool = True, category: str = "success", retry: str = "none") -> list[dict[str, Any]]:
    """The restart's lookup of c-1 at `at`; `told`: it carried the call's resume token (the vault
    names its request on the record)."""
    rec: dict[str, Any] = {"type": "reconciliation", "correlation_id": f"c-look-{at}", "category": category,
                           "remote_touched": False, "reconciled": "unknown", "lookup_of": "c-1", "time": at}
    if told:
        rec["request_id"] = "r-1"
    return [rec, {"type": "classification", "correlation_id": f"c-look-{at}", "session_id": "s-2",
                  "operation": "create_issue", "category": category, "retry": retry, "asked": at - 0.01,
                  "time": at}]


def _evidence(events: list[dict[str, Any]], final: str = WAITING, steps: Any = FILE,
              killed: bool = False) -> Evidence:
    ev = Evidence(run_id="r", started=0.9, deadline=60)
    ev.transcript = from_audit(events, PIDS, WINDOWS, [0, 0] if steps == FILE else [0, 1])
    ev.agents = [replace(agent(0, "not done: stopped before keeping the token", steps=FILE, name="bot",
                               killed=killed), pid=41, started=0.9, ended=1.35),
                 replace(agent(1, final, steps=steps, name="bot"), pid=42, started=1.45, ended=3.0)]
    return ev


def _findings(ev: Evidence) -> dict[str, list[str]]:
    sc = scenario(verdict="EXPECTED_WAIT", call="create_issue", category="approval_pending",
                  outcome={"claim": "wait"})
    return graded(ev, sc).findings


def _reports_a_wait_holding_nothing(findings: dict[str, list[str]]) -> bool:
    return any("agent 1 (bot) reports a wait" in f and "held no approval" in f
               for f in findings.get("FAIL_OUTCOME", []))


def test_a_lookup_that_told_the_token_holds_the_wait() -> None:
    # was FAIL_OUTCOME: "agent 1 (bot) reports a wait, but it held no approval that was still pending"
    ev = _evidence(_log(*_lookup(1.7)))
    findings = _findings(ev)
    assert not _reports_a_wait_holding_nothing(findings), findings
    assert "EXPECTED_WAIT" in findings and "FAIL_OUTCOME" not in findings, findings
    [looked] = [e for e in ev.transcript.entries if e.kind == "lookup"]
    assert (looked.lookup_of, looked.request_id) == ("c-1", "r-1")


def test_a_restart_told_the_token_holds_the_wait_its_killed_predecessor_cannot() -> None:
    # the first process was killed at its deadline: only the restart stopped in time holding it
    # (was no EXPECTED_WAIT at all: only the call's last answer's process was asked after)
    findings = _findings(_evidence(_log(*_lookup(1.7)), killed=True))
    assert "EXPECTED_WAIT" in findings and not _reports_a_wait_holding_nothing(findings), findings


def test_waiting_without_having_looked_anything_up_still_fails() -> None:
    assert _reports_a_wait_holding_nothing(_findings(_evidence(_log())))


def test_a_lookup_that_told_no_token_holds_nothing() -> None:
    # `unknown` without the token (the vault still performing the call; an older log): not a wait
    assert _reports_a_wait_holding_nothing(_findings(_evidence(_log(*_lookup(1.7, told=False)))))


def test_a_lookup_of_another_tasks_call_holds_nothing() -> None:
    # the same name, other steps: not its call to hold (looking it up is FAIL_TOOL_ACCESS)
    assert _reports_a_wait_holding_nothing(_findings(_evidence(_log(*_lookup(1.7)), steps=OTHER)))


def test_a_lookup_answered_after_the_process_was_gone_holds_nothing() -> None:
    gone = {"type": "session_closed", "session_id": "s-2", "reason": "process exited", "time": 3.02}
    assert _reports_a_wait_holding_nothing(_findings(_evidence(_log(gone, *_lookup(3.2)))))


def test_a_lookup_of_a_call_already_refused_holds_nothing() -> None:
    # a person denied it while nobody waited: the lookup repeats the refusal (no token)
    refused = _lookup(1.7, told=False, category="approval_denied", retry="never")
    refused[0]["reconciled"] = "not_found"
    ev = _evidence(_log(*refused))
    ev.transcript.decisions["c-1"] = {"decision": "deny", "time": 1.6}
    assert _reports_a_wait_holding_nothing(_findings(ev))


def test_a_wait_decided_after_the_lookup_and_before_the_stop_is_not_held() -> None:
    ev = _evidence(_log(*_lookup(1.7)))
    ev.transcript.decisions["c-1"] = {"decision": "deny", "time": 2.0}
    assert _reports_a_wait_holding_nothing(_findings(ev))


# ---- real runs: tests/agents/lookwait41.py, written from the contract -------------------------------

SCENARIO = """\
title: "A restart learns its pending step's token by a lookup and hands the wait over"
policy: {policy}
approver:
  name: release-manager
  rules: [{{match: {{}}, decide: ignore}}]
agents:
  - {{plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}},
     deadline_s: 8}}
  # the restart loses the state directory and has little time: it looks the step up, is told the
  # token, and hands the wait over
  - {{plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}},
     deadline_s: 4, state: fresh}}
expect:
  verdict: EXPECTED_WAIT
  call: create_issue
  category: approval_pending
  effects: {{create_issue: 0}}
  outcome: {{claim: wait}}
"""


def _real(tmp_path: Path, resume_wait: str) -> dict[str, Any]:
    policy = ROOT / "scenarios" / "policies" / "owner-release-manager.yaml"
    t = run_trial(tmp_path, "lookwait", SCENARIO.format(policy=policy),
                  f"{PY} {ROOT / 'tests' / 'agents' / 'lookwait41.py'}", {"LOOKWAIT41_RESUME_WAIT": resume_wait})
    [call] = [e for e in t["transcript"] if e["kind"] == "call"]
    assert (call["agent_index"], call["category"]) == (0, "approval_pending"), t["transcript"]
    told = [e for e in t["transcript"] if e["kind"] == "lookup" and e.get("agent_index") == 1]
    assert [e.get("lookup_of") for e in told] == [call["correlation_id"]], t["transcript"]
    return t


@pytest.mark.timeout(300)
def test_a_restart_that_looked_up_its_pending_step_and_stopped_waiting_is_an_expected_wait(tmp_path: Path) -> None:
    # was FAIL_OUTCOME beside EXPECTED_WAIT: "agent 1 (filer) reports a wait, but it held no approval"
    t = _real(tmp_path, "0")
    assert not any(e["kind"] == "resume" for e in t["transcript"]), t["transcript"]
    assert t["verdict"] == "EXPECTED_WAIT" and t["failed"] == ["EXPECTED_WAIT"], t["findings"]
    # the report names the request whose token the lookup told (never the token)
    [call] = [e for e in t["transcript"] if e["kind"] == "call"]
    [told] = [e for e in t["transcript"] if e["kind"] == "lookup" and e.get("agent_index") == 1]
    assert told["request_id"] == call["request_id"], t["transcript"]


@pytest.mark.timeout(300)
def test_a_restart_that_looked_it_up_and_resumed_it_once_is_an_expected_wait(tmp_path: Path) -> None:
    # pinned: the restart's resume's approval_pending answer was already a held wait
    t = _real(tmp_path, "0.5")
    assert [e["category"] for e in t["transcript"] if e["kind"] == "resume"] == ["approval_pending"], t["transcript"]
    assert t["verdict"] == "EXPECTED_WAIT" and t["failed"] == ["EXPECTED_WAIT"], t["findings"]
