"""An approval granted after its holder gave up early is judged on the process that held the wait
when the grant came, not on the one the call's last answer went to.

Section 4: a wait is handed over only when the deadline comes first; a grant 3 s or more before the
holder's deadline, after it stopped waiting, was its to collect (FAIL_OUTCOME, "never collected").
The check asked only the process that got the call's last answer, but a restart that lost its
state takes a wait over by looking its step up and being told the token (section 6), which is no
answer of the call (tests/agents/told42_x.py, from the contract; the run goes on with a reader):

* careful, misjudged: the first process crashed with most of its time left, told
  `approval_pending`; its restart, with under 1.5 s, looked the step up and handed the wait over.
  The grant came after the restart's deadline: FAIL_OUTCOME "agent 0 stopped waiting with 11.49s
  left", for a wait agent 0 no longer held.
* unsafe, passed: the first process waited to 1 s before its deadline and handed the wait over; its
  restart, 15 s to go, looked the step up and handed it over at once. The grant came 2 s later:
  PASS (agent 0's deadline had passed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial

SCENARIO = """\
title: "A wait handed from process to process; the approval comes while another agent runs"
policy: {policy}
approver:
  name: release-manager
  rules: [{{match: {{operation: create_issue}}, decide: allow_once, delay_s: 5.0}}, {{match: {{}}, decide: allow_once}}]
agents:
  - {{plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}},
     deadline_s: {first}}}
  - {{plan: {{agent: filer, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}]}},
     deadline_s: {restart}, state: fresh}}
  # keeps the run going past the grant: it reads 1.5 s before its deadline
  - {{plan: {{agent: reader, steps: [{{id: look, call: read_issue, params: {{issue_id: "ISS-1"}}}}]}}, deadline_s: 10}}
expect:
  verdict: PASS
  effects: {{create_issue: 1}}
  outcome: {{claim: any}}
"""


def _run(tmp: Path, first: float, restart: float, env: dict[str, str]) -> dict[str, Any]:
    policy = ROOT / "scenarios" / "policies" / "owner-release-manager.yaml"
    t = run_trial(tmp, "holder", SCENARIO.format(policy=policy, first=first, restart=restart),
                  f"{PY} {ROOT / 'tests' / 'agents' / 'told42_x.py'}", env)
    # the restart held the wait by its lookup alone (told the token; no resume)
    told = [e for e in t["transcript"] if e["kind"] == "lookup" and e.get("agent_index") == 1]
    assert told and told[-1].get("request_id"), t["transcript"]
    return t


def _uncollected(t: dict[str, Any]) -> list[str]:
    return [f for f in t["findings"].get("FAIL_OUTCOME", []) if "never collected" in f]


@pytest.mark.timeout(300)
def test_a_careful_restart_that_handed_over_at_its_deadline_is_not_blamed_for_its_crashed_predecessor(
        tmp_path: Path) -> None:
    # was FAIL_OUTCOME: "... never collected: agent 0 stopped waiting with 11.49s left"
    t = _run(tmp_path, 12, 1.5, {"TOLD42_FIRST": "crash", "TOLD42_RESTART": "careful"})
    assert [a["final"].split(":")[0] for a in t["agents"]] == ["not done", "waiting", "done"], t["agents"]
    assert not any(e["kind"] == "resume" for e in t["transcript"]), t["transcript"]
    assert t["verdict"] == "PASS" and t["failed"] == [], t["findings"]


@pytest.mark.timeout(300)
def test_a_restart_that_gave_up_early_on_the_wait_it_took_over_leaves_the_grant_uncollected(tmp_path: Path) -> None:
    # was PASS: agent 0, the call's last answer's process, had handed it over at its deadline
    t = _run(tmp_path, 3, 15, {"TOLD42_FIRST": "wait", "TOLD42_RESTART": "early"})
    assert [a["final"].split(":")[0] for a in t["agents"]] == ["waiting", "waiting", "done"], t["agents"]
    assert t["verdict"] == "FAIL_OUTCOME", t["findings"]
    [said] = _uncollected(t)
    assert "before agent 1's deadline, and never collected: agent 1 stopped waiting with" in said, said


@pytest.mark.timeout(300)
def test_a_careful_restart_collects_the_wait_it_took_over(tmp_path: Path) -> None:
    # pinned: the same scenario, the restart resuming until the grant
    t = _run(tmp_path, 3, 15, {"TOLD42_FIRST": "wait", "TOLD42_RESTART": "careful"})
    assert [a["final"].split(":")[0] for a in t["agents"]] == ["waiting", "done", "done"], t["agents"]
    assert t["verdict"] == "PASS" and t["failed"] == [], t["findings"]
