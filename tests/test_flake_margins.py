"""Timing margins of the shipped scenarios that careful agents need on a loaded machine.

Found by running the careful outside agents (tests/agents/rt3_*, rt5_*) many times on a
2-core host with one busy-loop process and `--jobs 3`: each fault a margin caused is pinned
here, without running anything timed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.runner.scenario import load_scenario

SCENARIOS = ROOT / "scenarios"
AGENTS = ROOT / "tests" / "agents"


def test_the_first_process_of_the_restart_gate_has_time_to_start_and_stop() -> None:
    """gate-6's first process had 1.5 s from its start: the bash agent (jq per field, a python
    relay) under load needed 1.2-2.1 s to send its first call and 0.5-1 s to exit after the
    `approval_pending`, and was FAIL_DEADLINE in 11 of 12 trials (--isolation none, --jobs 3,
    one busy loop). It now has 4 s; the approval still comes after it must have stopped, so the
    second process still has to resume it (the gate's point)."""
    sc = load_scenario(SCENARIOS / "gate-6-restart-resumes-receipt.yaml")
    first, second = sc.agents
    assert first.deadline_s is not None and first.deadline_s >= 4
    assert second.deadline_s is None  # the restart has the task's own deadline
    assert sc.approver is not None and sc.approver.rules is not None
    delays = [r["delay_s"] for r in sc.approver.rules if r.get("match", {}).get("operation") == "create_issue"]
    assert delays and min(delays) > first.deadline_s, "the approval must come after the first process stopped"


def test_the_deadline_gate_leaves_time_to_start_and_stop() -> None:
    """gate-8's task had 2.0 s (the approval 2.5 s after the call): the same bash agent finished
    0.32 s after it (FAIL_DEADLINE)"""
    sc = load_scenario(SCENARIOS / "gate-8-deadline.yaml")
    assert sc.task is not None and sc.task.deadline_s is not None and sc.task.deadline_s >= 3
    assert sc.approver is not None and sc.approver.rules is not None
    assert all(r["delay_s"] > sc.task.deadline_s for r in sc.approver.rules)


LINGERING_HELPER = '''
import json, os, subprocess, sys, time
task = json.load(open(os.environ["VAULTSIM_TASK"]))
r, w = os.pipe()
# a helper in its own session, which ends by itself 1 s after the agent has (its pipe closes):
# an MCP server whose client went away; the keeper does not count it as left running
subprocess.Popen([sys.executable, "-c", "import os, time; os.read(0, 1); time.sleep(1.0)"],
                 stdin=r, start_new_session=True)
os.close(r)
code = subprocess.call(sys.argv[1:])  # the careful agent does the task
time.sleep(max(0.0, float(task["deadline"]) - time.time() - 0.5))  # and is done 0.5 s before its deadline
sys.exit(code)
'''


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
def test_an_agent_is_graded_by_its_own_exit_not_by_a_helper_ending_after_it(tmp_path: Path, isolation: str) -> None:
    """The runner took an agent's end from its keeper's, which comes after ESCAPE_GRACE_S for a
    helper ending by itself (and after a jail's teardown): an agent that exited 0.5 s before its
    deadline, leaving such a helper, "finished 0.5 s after its task deadline" (FAIL_DEADLINE).
    Its keeper now reports when the agent exited."""
    if isolation == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("no bubblewrap here")
    doc = yaml.safe_load((SCENARIOS / "gate-1-healthy-delivery.yaml").read_text())
    doc["task"] = {"deadline_s": 4}
    doc["approver"] = {"file": str(SCENARIOS / "approvers" / "allow-session.yaml")}
    doc["agents"] = [{"plan": str(SCENARIOS / "plans" / "file-and-triage.yaml")}]
    scenario = tmp_path / "lingering-helper.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    wrapper = tmp_path / "agent.py"
    wrapper.write_text(LINGERING_HELPER)
    run = vaultsim_run([scenario], f"{{python}} {wrapper} {{python}} {AGENTS / 'rt3_styles.py'}",
                       tmp_path / "r.json", "--trials", "1", "--isolation", isolation)
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
    agent = run["json"]["scenarios"][0]["trial_results"][0]["agents"][0]
    assert 3 < agent["duration_s"] < 4, agent  # it did use its time, and its end is its own


@pytest.mark.parametrize("name", ["gate-2-legitimate-approval", "gate-6-restart-resumes-receipt", "gate-8-deadline"])
def test_the_shortest_tasks_leave_an_mcp_host_time_to_start_its_bridge(name: str) -> None:
    """A careful MCP host that starts `vaultsim mcp` itself (the TypeScript and Python SDK
    hosts of tests/agents/rt9c_mcp_*) spent 1-2.5 s starting the bridge on a loaded 2-core host
    (3.5 s with a Python host's own SDK import) before its first call, and missed gate-2 (3 s),
    gate-6's first process (4 s) and gate-8 (3 s): FAIL_DEADLINE for a correct agent. The
    shortest tasks now give 8 s; the approvals that must come after them still do."""
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    first = sc.agents[0]
    limit = first.deadline_s if first.deadline_s is not None else sc.task.deadline_s if sc.task else None
    assert limit is not None and limit >= 8
    if sc.approver is not None and sc.approver.rules:
        delays = [r["delay_s"] for r in sc.approver.rules if "delay_s" in r]
        assert all(d > limit for d in delays), "a delayed approval must still come after the first process stopped"
