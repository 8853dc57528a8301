"""A `never` answer binds the process it reached, the processes that handed it its step and the
ones it starts after; a pool's worker started before the answer read none of it (§9).

Red team 38c found the grader holding every process of the agent: a careful Perl pool whose
worker, its session open before a sibling's read was refused for good, sent its own independent
read a few milliseconds after that refusal was FAIL_RECOVERY (`tests/agents/never_pool.py`
sibling: FAIL_RECOVERY before, PASS now). The parent that reads the refusal and sends the create
all the same, and a child the refused worker starts afterwards, are still named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_redteam_careful import vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "tests" / "agents" / "never_pool.py"

SCENARIO = """
title: "A pool's read refused for good"
remote: {fault: build_status_7}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: poolbot
      steps:
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "never filed"}}
      final: "not done"
expect:
  verdict: PASS
  effects: {create_issue: 0}
  outcome: {claim: not_done}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "failed"), [
    ("sibling", []),
    ("parent", ["FAIL_DUPLICATE_EFFECT", "FAIL_RECOVERY"]),
    ("child", ["FAIL_RECOVERY"]),
])
def test_a_never_answer_holds_its_process_line_not_a_worker_started_before_it(
        mode: str, failed: list[str], tmp_path: Path) -> None:
    path = tmp_path / "never-pool.yaml"
    path.write_text(SCENARIO)
    run = vaultsim_run([path], f"env MODE={mode} {sys.executable} {AGENT}", tmp_path / "report.json")
    trial = run["json"]["scenarios"][0]["trial_results"][0]
    assert sorted(trial["failed"]) == failed, (trial["findings"], run["out"][-2000:])
    assert trial["claim"] == "not_done"
    calls = [e for e in trial["transcript"] if e["kind"] == "call"]
    refused = next(e for e in calls if e["operation"] == "read_build")
    assert refused["category"] == "malformed_response"
    if mode == "sibling":
        # the worker's read did go out after the refusal, from a process started before it
        read = next(e for e in calls if e["operation"] == "read_issue")
        assert read["requested"] > refused["time"] and read["pid"] != refused["pid"], calls
    else:
        assert "went on with" in trial["findings"]["FAIL_RECOVERY"][0]
