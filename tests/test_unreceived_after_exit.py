"""An answer written after the whole agent had exited, that a restart of its task learned.

The vault may answer a call after the agent that sent it has exited (it gave up reading, or died
while the remote was slow): nobody read that answer, and it is `unreceived`. But a restart of
the same task (the same name and steps: `AgentRun.same_task`) that looks the call up afterwards,
by its correlation id or its key, is told that answer (section 6: a `malformed_response` is
repeated, `never`), or resumes it: the agent learned it (section 7: "unless your agent later
looked that call up ... or resumed it"). The rule for an answer to a gone connection
(vault.runner.gone_answers) already made that exception; the older rule for a whole agent gone
did not, so the call stayed "left waiting for its approval: it never settled" (FAIL_OUTCOME) for
a restart that did as section 6 says. Shown on a real run too: tests/agents/told41_gone_restart.py's
first process gives up on an auto create the remote holds past its read timeout (outcome_unknown
written after it exited), and its restart looks the step up by key until it is found.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial
from test_runner_grade import agent, graded, scenario
from vault.runner.evidence import Evidence
from vault.runner.logical import Timeline
from vault.runner.transcript import from_audit

BROKEN = {"category": "malformed_response", "retry": "never", "operation": "read_build"}
READ = [{"id": "build", "call": "read_build", "params": {"build_id": "b-101"}}]
# agent 0 (pid 41) runs 0.9-1.35; the restart, agent 1 (pid 42), 1.45-3.0
WINDOWS = [(0.9, 1.35), (1.45, 3.0)]
PIDS = {41: 0, 42: 1}


def _log(answer_at: float, *later: dict[str, Any]) -> list[dict[str, Any]]:
    """Agent 0 sends a read at 1.1 and exits (its session closed at 1.3); the vault answers it at
    `answer_at`; `later`: what the restart did in its session s-2."""
    return [
        {"type": "session_opened", "session_id": "s-1", "agent": "bot", "pid": 41, "run_id": "r", "time": 1.0},
        {"type": "call_requested", "correlation_id": "c-1", "session_id": "s-1", "operation": "read_build",
         "target": "read_build on ci", "time": 1.1},
        {"type": "session_closed", "session_id": "s-1", "reason": "process exited", "time": 1.3},
        {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", **BROKEN, "time": answer_at},
        {"type": "session_opened", "session_id": "s-2", "agent": "bot", "pid": 42, "run_id": "r", "time": 1.5},
        *later,
    ]


def _lookup(at: float, category: dict[str, Any] = BROKEN, reconciled: str = "unknown") -> list[dict[str, Any]]:
    return [{"type": "reconciliation", "correlation_id": f"c-look-{at}", "reconciled": reconciled,
             "lookup_of": "c-1", "time": at},
            {"type": "classification", "correlation_id": f"c-look-{at}", "session_id": "s-2", **category,
             "asked": at - 0.01, "time": at}]


def _call(events: list[dict[str, Any]], tasks: tuple[int, ...] = (0, 0)) -> Any:
    t = from_audit(events, PIDS, WINDOWS, list(tasks))
    [call] = [e for e in t.entries if e.kind == "call"]
    return t, call


def test_an_answer_after_the_agent_exited_reached_nobody() -> None:
    _, call = _call(_log(1.4))
    assert call.unreceived is True


def test_a_restart_that_looked_the_call_up_learned_its_answer() -> None:
    # was unreceived: the call stayed pending to the grader, the restart having been told never
    t, call = _call(_log(1.4, *_lookup(1.7)))
    assert call.unreceived is None
    [lc] = Timeline.of(t).calls
    assert (lc.cid, lc.category, lc.retry) == ("c-1", "malformed_response", "never")


def test_a_restart_that_looked_the_call_up_is_not_failed_for_leaving_it_pending() -> None:
    # was FAIL_OUTCOME: "read_build was left waiting for its approval: it never settled"
    t, _ = _call(_log(1.4, *_lookup(1.7)))
    ev = Evidence(run_id="r", started=0.9, deadline=60)
    ev.agents = [replace(agent(i, "not done: build read broke", steps=READ, name="bot"), pid=pid,
                         started=WINDOWS[i][0], ended=WINDOWS[i][1]) for pid, i in PIDS.items()]
    ev.transcript = t
    g = graded(ev, scenario(category="malformed_response", retry="never"))
    assert not any("left waiting" in f for f in g.findings.get("FAIL_OUTCOME", [])), g.findings


def test_a_lookup_before_the_answer_told_it_nothing() -> None:
    # the restart asked while the vault still performed the call (unknown): the answer came after
    _, call = _call(_log(1.8, *_lookup(1.6, {**BROKEN, "category": "success", "retry": "none"})))
    assert call.unreceived is True


def test_another_tasks_lookup_teaches_this_one_nothing() -> None:
    _, call = _call(_log(1.4, *_lookup(1.7)), tasks=(0, 1))
    assert call.unreceived is True


PENDING = {"operation": "create_issue", "category": "approval_pending", "retry": "after_approval"}


def _waited(resume_at: float) -> list[dict[str, Any]]:
    """Agent 0 sends a gated create at 1.1 and exits while the vault holds it; the restart resumes
    it at `resume_at` (told approval_pending); the runner's teardown, after every agent, settles
    the call unroutable at 3.5 on agent 0's own waiter."""
    return [
        {"type": "session_opened", "session_id": "s-1", "agent": "bot", "pid": 41, "run_id": "r", "time": 1.0},
        {"type": "call_requested", "correlation_id": "c-1", "session_id": "s-1", "operation": "create_issue",
         "target": "create_issue on tracker", "time": 1.1},
        {"type": "session_closed", "session_id": "s-1", "reason": "process exited", "time": 1.3},
        {"type": "session_opened", "session_id": "s-2", "agent": "bot", "pid": 42, "run_id": "r", "time": 1.5},
        {"type": "classification", "correlation_id": "c-1", "session_id": "s-2", **PENDING, "resumed": True,
         "asked": resume_at - 0.5, "time": resume_at},
        {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", "operation": "create_issue",
         "category": "approval_unroutable", "retry": "human_required", "resumed": False, "time": 3.5},
    ]


def test_a_resume_before_the_teardowns_answer_did_not_read_it() -> None:
    # the restart resumed it, was told pending and stopped; nobody read the teardown's unroutable
    t, call = _call(_waited(2.5))
    assert call.category == "approval_unroutable" and call.unreceived is True


def test_a_resume_after_the_answer_learned_it() -> None:
    # agent 0's wait ended after it exited (approval_pending to nobody); the restart resumed it
    events = _waited(2.5)[:5]
    events.insert(4, {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", **PENDING,
                      "resumed": False, "time": 1.4})
    _, call = _call(events)
    assert call.unreceived is None


# ---- a real run: the first process gives up while the remote holds the call ------------------------

AUTO_POLICY = "default: {mode: auto, deadline_s: 60}\n"
GIVE_UP = """\
title: "An answer the first process left behind, looked up by its restart"
remote:
  fault: "timeout_after_accept:commit=1,op=create_issue,times=1"
  timeouts: {{read_timeout_s: 3.0, total_timeout_s: 4.0}}
policy: {policy}
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_once}}]}}
task: {{deadline_s: 15}}
agents:
  - plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}}
  - plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}}
expect:
  verdict: PASS
  category: outcome_unknown
  effects: {{create_issue: 1}}
  outcome:
    state: [{{collection: issues, where: {{title: "Flaky login test"}}, count: 1}}]
    claim: done
"""


@pytest.mark.timeout(300)
def test_a_restart_that_looked_up_an_answer_its_predecessor_left_passes(tmp_path: Path) -> None:
    # was FAIL_OUTCOME "create_issue was left waiting for its approval": the outcome_unknown the vault
    # wrote after the first process exited stayed unreceived though the restart's lookup found it
    (tmp_path / "auto.yaml").write_text(AUTO_POLICY)
    t = run_trial(tmp_path, "give-up", GIVE_UP.format(policy=tmp_path / "auto.yaml"),
                  f"{PY} {ROOT / 'tests' / 'agents' / 'told41_gone_restart.py'}", {})
    [call] = [e for e in t["transcript"] if e["kind"] == "call"]
    assert call["category"] == "outcome_unknown" and call["agent_index"] == 0, t["transcript"]
    # written after the first process exited: its restart (started once it had) had looked it up by
    # then, or it came later after its request than the first process lived (a loaded host starts
    # the restart late: its first lookup may come after the answer; TOLD41_RESTART_SLOW forces that)
    first_lookup = min(e["time"] for e in t["transcript"] if e["kind"] == "lookup")
    first_lived = t["agents"][0]["duration_s"]
    assert call["time"] > first_lookup or call["time"] - call["requested"] > first_lived, t["transcript"]
    assert t["verdict"] == "PASS" and not t["failed"], t["findings"]
