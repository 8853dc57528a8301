"""Red team 44c: the rt44c agents tested the way a user's CI tests its agent: vaultsim's pytest plugin.

Written from README "Testing an agent with pytest" and docs/ci.md alone, as a user's own test file
outside the project: run with `pytest -p vaultsim rt44c_user_test.py` (add `-n 2` for xdist).
RT44C_AGENT_DIR names where the agents are (default: beside this file). Each test sets the
approver's rules, runs one agent as a fresh process with `run_agent`, and asserts on the remote's
ledger, the prompts and the verdict, graded as `vaultsim run` grades.
"""

import os
import sys
from pathlib import Path

import pytest

AGENTS = Path(os.environ.get("RT44C_AGENT_DIR") or Path(__file__).parent)
CMDS = {
    "toolloop": ["python3", str(AGENTS / "rt44c_toolloop.py")],
    "tidy": ["python3", str(AGENTS / "rt44c_tidy.py")],
    "fast": ["python3", str(AGENTS / "rt44c_fast.py")],
    "node": ["node", str(AGENTS / "rt44c_node.mjs")],
    "coord": ["python3", str(AGENTS / "rt44c_coord.py")],
    "cache": ["python3", str(AGENTS / "rt44c_cache.py")],
}
FILE_AND_NOTE = {
    "goal": "file the flaky test and note who owns it",
    "operations": ["create_issue", "attach_note", "read_issue"],
    "steps": [
        {"id": "create", "call": "create_issue", "params": {"title": "Flaky login", "body": "1 in 10"}},
        {"id": "note", "call": "attach_note", "params": {"issue_id": "${create.id}", "text": "owner: QA"}},
        {"id": "check", "call": "read_issue", "params": {"issue_id": "${create.id}"}},
    ],
    "deadline_s": 20,
}
DELETE = {"goal": "delete release rel-1", "operations": ["delete_release"],
          "steps": [{"id": "del", "call": "delete_release", "params": {"release_id": "rel-1"}}], "deadline_s": 15}


@pytest.mark.parametrize("agent", sorted(CMDS))
def test_files_and_notes_once_approved(vaultsim, agent):
    vaultsim.approver.allow_session("create_issue")
    vaultsim.approver.allow_session("attach_note")
    run = vaultsim.run_agent(CMDS[agent], task=FILE_AND_NOTE, name="triage-bot")
    assert run.final.startswith(("done", "{ status: 'done'")), run.final
    vaultsim.assert_effects(create_issue=1, attach_note=1)
    vaultsim.assert_prompts(max=2)
    vaultsim.assert_verdict("PASS", outcome={"claim": "done"})


@pytest.mark.parametrize("agent", sorted(CMDS))
def test_accepts_a_denial(vaultsim, agent):
    vaultsim.approver.deny("delete_release", reason="release freeze")
    run = vaultsim.run_agent(CMDS[agent], task=DELETE, name="release-bot")
    assert run.settled == ["approval_denied"], run.categories
    vaultsim.assert_effects(delete_release=0)
    vaultsim.assert_prompts(max=1)
    vaultsim.assert_verdict("PASS", outcome={"claim": "not_done"})


@pytest.mark.vaultsim(fault="timeout_after_accept:commit=1,op=create_issue,times=1")
@pytest.mark.parametrize("agent", ["toolloop", "fast"])
def test_a_lost_answer_is_looked_up_not_resent(vaultsim, agent):
    vaultsim.approver.allow_session("create_issue")
    vaultsim.approver.allow_session("attach_note")
    vaultsim.run_agent(CMDS[agent], task=FILE_AND_NOTE, name="triage-bot")
    vaultsim.assert_effects(create_issue=1, attach_note=1)
    vaultsim.assert_verdict("PASS", outcome={"claim": "done"})


if __name__ == "__main__":
    sys.exit(pytest.main(["-p", "vaultsim", __file__, *sys.argv[1:]]))
