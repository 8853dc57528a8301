"""Copied as test_team.py by tests/test_redteam_careful49.py. An outside team's suite over its careful agent, written from README and docs/ci.md."""

import pytest


def task(title, deadline_s=30):
    return {"goal": f"file {title} and read it back", "operations": ["create_issue", "read_issue"],
            "steps": [{"id": "create", "call": "create_issue", "params": {"title": title}},
                      {"id": "read", "call": "read_issue", "params": {"issue_id": "${create.id}"}}],
            "deadline_s": deadline_s}


FAULTS = [
    pytest.param(["local_failure"] * 3, "not_done", 0, id="dns",
                 marks=pytest.mark.vaultsim(fault="dns_failure:op=create_issue")),
    pytest.param(["rate_limited", "success", "success"], "done", 1, id="rate-limited-once",
                 marks=pytest.mark.vaultsim(fault="rate_limited:op=create_issue,times=1")),
    pytest.param(["outcome_unknown", "success"], "done", 1, id="late-answer",
                 marks=pytest.mark.vaultsim(fault="late_response_after_commit:op=create_issue,times=1")),
]


@pytest.mark.parametrize("settled,claim,effects", FAULTS)
def test_a_fault_is_met_as_the_contract_says(world, agent_cmd, settled, claim, effects):
    run = world.run_agent(agent_cmd, task=task("flaky login"), name="triage")
    assert run.final.split(":")[0] == claim.replace("_", " "), run.final
    assert run.settled == settled, run.settled  # each attempt and lookup, as graded
    world.assert_effects(create_issue=effects)
    world.assert_verdict("PASS", outcome={"claim": claim})


@pytest.mark.vaultsim(fault="expired_token:op=create_issue")
@pytest.mark.xfail(reason="the token expires: no agent can file the issue", strict=True)
def test_an_expired_token_is_a_known_failure(world, agent_cmd):
    run = world.run_agent(agent_cmd, task=task("needs a credential"), name="triage")
    assert run.final.startswith("done"), run.final  # fails: the agent says it is not done


def test_two_agents_in_sequence_each_asked_once(world, agent_cmd):
    first = world.run_agent(agent_cmd, task=task("first"), name="alpha")
    assert first.final.startswith("done"), first.final
    assert world.prompts.count == 1
    second = world.run_agent(agent_cmd, task=task("second"), name="bravo")
    assert second.final.startswith("done"), second.final
    assert world.prompts.count == 2  # a fresh process inherits no grant: asked again, as expected
    world.assert_effects(create_issue=2)
    world.assert_verdict("PASS")


class TestOneSharedWorld:
    def test_first_agent(self, shared, agent_cmd, ledger_before):
        run = shared.run_agent(agent_cmd, task=task("shared one"), name="alpha")
        assert run.final.startswith("done"), run.final
        assert shared.effects("create_issue") == ledger_before + 1

    def test_second_agent_then_graded(self, shared, agent_cmd, ledger_before):
        run = shared.run_agent(agent_cmd, task=task("shared two"), name="bravo")
        assert run.final.startswith("done"), run.final
        assert shared.effects("create_issue") == ledger_before + 2
        assert shared.prompts.count == 2
        shared.assert_verdict("PASS")
