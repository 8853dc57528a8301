"""The EXPECTED_WAIT finding names the process that held the wait, by pid and its place in the
agent's tree, as other findings name processes (vault.runner.whose.process).

It said only "the agent stopped in time holding it": with a supervisor and a worker, or a first
process and a restart, a reader could not tell whose wait it was.
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

PENDING = {"operation": "create_issue", "category": "approval_pending", "retry": "after_approval"}
STEPS = [{"id": "look", "call": "read_issue", "params": {"issue_id": "ISS-1"}},
         {"id": "file", "call": "create_issue", "params": {"title": "t"}}]


def _log(create_pid: int) -> list[dict[str, Any]]:
    """Agent 0's supervisor (pid 41) reads; its worker (pid 43, started by it) or the supervisor
    itself (`create_pid`) sends the gated create, is told it waits, and the agent stops."""
    sid = "s-2" if create_pid == 43 else "s-1"
    return [
        {"type": "session_opened", "session_id": "s-1", "agent": "bot", "pid": 41, "pgid": 41, "run_id": "r",
         "lineage": [[41, 0.8]], "time": 1.0},
        {"type": "call_requested", "correlation_id": "c-0", "session_id": "s-1", "operation": "read_issue",
         "target": "read_issue on tracker", "time": 1.05},
        {"type": "classification", "correlation_id": "c-0", "session_id": "s-1", "operation": "read_issue",
         "category": "success", "retry": "none", "resumed": False, "time": 1.06},
        {"type": "session_opened", "session_id": "s-2", "agent": "bot", "pid": 43, "pgid": 41, "run_id": "r",
         "lineage": [[43, 1.07], [41, 0.8]], "time": 1.08},
        {"type": "call_requested", "correlation_id": "c-1", "session_id": sid, "operation": "create_issue",
         "target": "create_issue on tracker", "time": 1.1},
        {"type": "classification", "correlation_id": "c-1", "session_id": sid, **PENDING, "resumed": False,
         "time": 1.15},
    ]


def _finding(create_pid: int) -> str:
    ev = Evidence(run_id="r", started=0.9, deadline=60)
    ev.transcript = from_audit(_log(create_pid), {41: 0}, [(0.9, 2.0)], [0])
    ev.agents = [replace(agent(0, "waiting: create_issue needs approval", steps=STEPS, name="bot"),
                         pid=41, started=0.9, ended=2.0)]
    sc = scenario(verdict="EXPECTED_WAIT", call="create_issue", category="approval_pending",
                  outcome={"claim": "wait"})
    [said] = graded(ev, sc).findings["EXPECTED_WAIT"]
    return said


def test_a_workers_wait_is_named_by_its_pid_and_its_parent() -> None:
    said = _finding(43)
    assert said.endswith("(held by agent 0 (bot)'s process 43 (started by its process 41))"), said


def test_the_first_processs_own_wait_is_named_by_its_pid() -> None:
    said = _finding(41)
    assert said.endswith("(held by agent 0 (bot)'s process 41 (the one that called first))"), said


@pytest.mark.timeout(300)
def test_a_restarts_wait_taken_over_by_lookup_is_named_as_the_restarts(tmp_path: Path) -> None:
    # a real run: tests/agents/lookwait41.py's restart (agent 1) was told the token by its lookup
    from test_lookup_wait import SCENARIO
    policy = ROOT / "scenarios" / "policies" / "owner-release-manager.yaml"
    t = run_trial(tmp_path, "lookwait", SCENARIO.format(policy=policy),
                  f"{PY} {ROOT / 'tests' / 'agents' / 'lookwait41.py'}", {"LOOKWAIT41_RESUME_WAIT": "0"})
    [told] = [e for e in t["transcript"] if e["kind"] == "lookup" and e.get("agent_index") == 1]
    [said] = t["findings"]["EXPECTED_WAIT"]
    assert said.endswith(f"(held by agent 1 (filer)'s process {told['pid']} (the one that called first))"), said
