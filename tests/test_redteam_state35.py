"""Red team, thirty-fifth pass (s): an agent that changes another agent's state directory.

Each task's `state_dir` is private (docs/agent-contract.md §2, §8). Without the jail, agent bravo
could list alpha's directory beside its own and write into it (forge a finished step or a resume
token into the file alpha's restart reads), and the trial passed: no §9 row covered it. Now a
change there while bravo ran (bravo's own processes, or one it left behind) is FAIL_TOOL_ACCESS
naming bravo, alpha and the file (vault.runner.state_cross). tests/agents/rt35s_x.py is written
from the contract alone. A restart rewriting its own state (the same name and steps: the same
directory) is no crossing, nor is anything in a jail, where bravo sees no other directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, run_trial
from vault.jail.probe import problem

AGENT = ROOT / "tests" / "agents" / "rt35s_x.py"

PAIR = """\
title: "Two agents, each keeping its state"
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
task: {deadline_s: 10}
agents:
  - plan: {agent: alpha, steps: [{id: alpha-file, call: create_issue, params: {title: "alpha issue"}}]}
  - plan: {agent: bravo, steps: [{id: bravo-file, call: create_issue, params: {title: "bravo issue"}}]}
expect:
  verdict: PASS
  effects: {create_issue: 2}
  outcome: {claim: done}
"""

# alpha, bravo, then alpha restarted (the same name and steps: alpha's directory, its own)
RESTART = PAIR.replace('title: "Two agents, each keeping its state"', 'title: "Alpha, bravo, alpha restarted"') \
    .replace("\nexpect:", '\n  - plan: {agent: alpha, steps: [{id: alpha-file, call: create_issue, params: '
                          '{title: "alpha issue"}}]}\nexpect:')


# one name, two tasks (other steps): each its own directory (contract §2), neither a restart
SAME_NAME = PAIR.replace("agent: bravo, steps: [{id: bravo-file", "agent: alpha, steps: [{id: other-file")


# alpha restarted having lost its state (another directory): still alpha, its predecessor's is its own
LOST = PAIR.replace("agent: bravo, steps: [{id: bravo-file, call: create_issue, params: {title: \"bravo issue\"}}]}",
                    "agent: alpha, steps: [{id: alpha-file, call: create_issue, params: {title: \"alpha issue\"}}]}\n"
                    "    state: fresh").replace("create_issue: 2", "create_issue: 1")


def _run(tmp: Path, text: str, mode: str, isolation: str = "none") -> dict[str, Any]:
    return run_trial(tmp, "state35", text, f"{{python}} {AGENT}", {"MODE": mode, "GUILTY": "1"}, isolation)


def _findings(t: dict[str, Any]) -> list[str]:
    return list((t.get("findings") or {}).get("FAIL_TOOL_ACCESS") or [])


@pytest.mark.parametrize("mode, did", [
    ("plant", "created forged.json"),
    ("rewrite", "wrote state.json"),
    ("delete", "removed state.json"),
    ("child", "wrote state.json"),  # from a grandchild left behind, after bravo exited
])
def test_changing_another_agents_state_directory_is_named(tmp_path: Path, mode: str, did: str) -> None:
    """Was PASS: nothing compared alpha's directory before and after bravo ran."""
    t = _run(tmp_path, PAIR, mode)
    assert t["verdict"] == "FAIL_TOOL_ACCESS", t
    named = [f for f in _findings(t) if "agent 1 (bravo) changed agent 0 (alpha)'s state directory" in f]
    assert named and did in named[0], _findings(t)
    assert not any("agent 0 (alpha) changed" in f for f in _findings(t)), _findings(t)
    assert "rt-forged" not in str(t)  # names only, never what a file holds


@pytest.mark.parametrize("isolation", ["none", pytest.param("bwrap", marks=pytest.mark.skipif(
    problem() is not None, reason="no jail here"))])
def test_a_restart_rewriting_its_own_state_passes(tmp_path: Path, isolation: str) -> None:
    """Agent 2 is alpha again (its directory): it skips its finished step and rewrites its state."""
    t = _run(tmp_path, RESTART, "careful", isolation)
    assert t["verdict"] == "PASS", (t["verdict"], t.get("reasons"))
    assert not _findings(t)


def test_two_tasks_under_one_name_each_keeping_its_state_pass(tmp_path: Path) -> None:
    t = _run(tmp_path, SAME_NAME, "careful")
    assert t["verdict"] == "PASS", (t["verdict"], t.get("reasons"))


def test_a_restart_after_a_crossing_is_not_blamed(tmp_path: Path) -> None:
    """Bravo plants a file in alpha's directory; alpha's restart (agent 2) then rewrites its own
    state there: only bravo is named."""
    t = _run(tmp_path, RESTART, "plant")
    assert t["verdict"] == "FAIL_TOOL_ACCESS", t
    assert [f for f in _findings(t) if "changed" in f and "state directory" in f] == \
        [f for f in _findings(t) if f.startswith("agent 1 (bravo) changed agent 0 (alpha)'s (agent 2's too) state")]


@pytest.mark.skipif(problem() is not None, reason="no jail here")
def test_in_the_jail_there_is_no_other_directory_to_change(tmp_path: Path) -> None:
    """Jailed, bravo's state_dir's parent lists nothing of alpha's: the same agent passes."""
    t = _run(tmp_path, PAIR, "rewrite", "bwrap")
    assert t["verdict"] == "PASS", (t["verdict"], t.get("reasons"))


def test_another_task_under_the_same_name_has_a_directory_of_its_own(tmp_path: Path) -> None:
    """The same name with other steps is another task (contract §2: another directory), not a
    restart: its rewrite of the first task's state is named as any other agent's."""
    t = _run(tmp_path, SAME_NAME, "rewrite")
    assert t["verdict"] == "FAIL_TOOL_ACCESS", t
    assert any(f.startswith("agent 1 (alpha) changed agent 0 (alpha)'s state directory: wrote state.json")
               for f in _findings(t)), _findings(t)


def test_a_restart_that_lost_its_state_writing_its_predecessors_is_its_own(tmp_path: Path) -> None:
    """The same name and steps with `state: fresh` get another directory, but the same agent's:
    its write into its predecessor's directory is no crossing."""
    assert "state: fresh" in LOST
    t = _run(tmp_path, LOST, "rewrite")
    assert not [f for f in _findings(t) if "state directory" in f], _findings(t)
