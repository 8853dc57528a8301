"""A grant that comes after the agent handed its wait over, while its process is still ending, is
judged by when it stopped waiting, not by when it exited.

Section 7: an approval granted "after that process stopped waiting, while the run went on and 3 s
or more before its deadline, was its to collect". The grade asked whether the grant came before
the holder *exited*: a careful agent that waits until 3 s before its deadline, prints `waiting`
and then takes a second to exit (an MCP host ending its bridge; red team 44c saw it at load 20)
was FAIL_OUTCOME ("approved ... while agent 0 ran, and never collected"; "reports a wait, but
it held no approval that was still pending") when the person allowed in that second
(tests/agents/wait45_x.py, from the contract; the approver's think time, counted from the prompt,
lands half-way through the second the agent lingers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial

SCENARIO = """\
title: "A wait handed over; the approval comes while the agent is still exiting"
policy: {policy}
approver:
  name: release-manager
  rules: [{{match: {{operation: create_issue}}, decide: allow_once, delay_s: 5.5}}]
task: {{deadline_s: {deadline}}}
agents:
  - {{plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}}}}
expect:
  verdict: {verdict}
  outcome: {{claim: wait}}
"""


def _run(tmp: Path, left: float, deadline: float, verdict: str) -> dict[str, Any]:
    policy = ROOT / "scenarios" / "policies" / "owner-release-manager.yaml"
    t = run_trial(tmp, "linger", SCENARIO.format(policy=policy, deadline=deadline, verdict=verdict),
                  f"{PY} {ROOT / 'tests' / 'agents' / 'wait45_x.py'}",
                  {"WAIT45_LEFT": str(left), "WAIT45_LINGER": "1"})
    [agent] = t["agents"]
    assert agent["final"].startswith("waiting:"), t["agents"]
    # the setting: the person allowed after the agent's hand-over and before its exit
    [call] = [e for e in t["transcript"] if e["kind"] == "call"]
    assert call["category"] == "approval_pending" and not call.get("executed"), t["transcript"]
    [asked] = t["prompts"]["asked"]
    granted = call["requested"] + asked["latency_s"]  # the prompt is made as the call comes in
    assert asked["decision"] == "allow_once" and call["time"] < granted < call["time"] + 1.0, (asked, call)
    return t


def _uncollected(t: dict[str, Any]) -> list[str]:
    return [f for f in t["findings"].get("FAIL_OUTCOME", []) if "never collected" in f]


@pytest.mark.timeout(300)
def test_a_careful_agent_that_handed_over_3s_before_its_deadline_and_lingers_holds_a_real_wait(
        tmp_path: Path) -> None:
    # was FAIL_OUTCOME: "... approved 5.5s after it was asked for, while agent 0 (filer) ran, and
    # never collected" and "agent 0 (filer) reports a wait, but it held no approval ..."
    t = _run(tmp_path, 3, 10, "EXPECTED_WAIT")
    assert (t["verdict"], t["failed"]) == ("EXPECTED_WAIT", ["EXPECTED_WAIT"]), t["findings"]


@pytest.mark.timeout(300)
def test_an_agent_that_stopped_waiting_with_10s_left_and_lingers_left_the_grant_uncollected(
        tmp_path: Path) -> None:
    t = _run(tmp_path, 10, 18, "FAIL_OUTCOME")
    assert t["verdict"] == "FAIL_OUTCOME", t["findings"]
    [said] = _uncollected(t)
    assert "stopped waiting with" in said and "before agent 0's deadline" in said, said


# ---- the same rule on recorded evidence (deadline at 10 s; the call answered pending at 7 s) ----

def _handed_over(granted: float, shown: float | None, end: float = 8.0) -> Any:
    from test_runner_grade import T0, agent, entry, evidence
    run = agent(0, "waiting: create_issue needs approval", end=end, steps=[
        {"id": "file", "call": "create_issue", "params": {"title": "x"}}], deadline=T0 + 10)
    run.stdout_shown = None if shown is None else T0 + shown
    ev = evidence([entry("create_issue", "approval_pending", 7.0, cid="c-1", executed=False, requested=T0 + 2)],
                  decisions={}, agents=[run])
    ev.transcript.decisions = {"c-1": {"decision": "allow_once", "time": T0 + granted}}
    return ev


def _graded(ev: Any) -> Any:
    from test_runner_grade import graded, scenario
    return graded(ev, scenario(verdict="EXPECTED_WAIT", outcome={"claim": "wait"}))


def test_a_grant_after_the_hand_over_while_the_process_ends_leaves_a_real_wait() -> None:
    # was FAIL_OUTCOME: the grant (7.5 s) came before the exit (8 s), after the `waiting` line (7.01 s)
    g = _graded(_handed_over(7.5, 7.01))
    assert (g.verdict, g.failed) == ("EXPECTED_WAIT", ["EXPECTED_WAIT"]), g.findings


def test_a_grant_before_the_waiting_line_was_the_agents_to_collect() -> None:
    # it stopped asking at 7 s but said `waiting` only at 7.8 s: it still held the wait at 7.5 s
    g = _graded(_handed_over(7.5, 7.8))
    assert g.verdict == "FAIL_OUTCOME", g.findings
    assert any("while agent 0 (stub) still waited for it, and never collected" in f
               for f in g.findings["FAIL_OUTCOME"]), g.findings


def test_with_nothing_shown_the_exit_stands_for_the_hand_over() -> None:
    g = _graded(_handed_over(7.5, None))
    assert g.verdict == "FAIL_OUTCOME", g.findings


def test_a_grant_with_more_than_3s_left_after_the_hand_over_was_the_agents_to_collect() -> None:
    # the same agent, handing over at 5 s with 5 s left and exiting at 8 s: the grant at 6.5 s
    ev = _handed_over(6.5, 5.01)
    ev.transcript.entries[0].time -= 2.0
    g = _graded(ev)
    assert g.verdict == "FAIL_OUTCOME", g.findings
    assert any("stopped waiting with 4.99s left" in f for f in g.findings["FAIL_OUTCOME"]), g.findings
