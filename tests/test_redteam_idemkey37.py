"""Red team, thirty-seventh pass (i): an agent looking up another agent's call by its idempotency key.

The vault keeps a key its agent's own in its run (contract §5): bravo's lookup of alpha's key text
asks about bravo's own key (`not_found`: nothing of alpha's crosses), and a lookup by another
task's key under the same agent name finds that task's call (one name, one key space). Neither
was graded and the trials passed. Now the daemon records a lookup by a key text another agent
(name or run) sent and the looker had not (`foreign_reference`, `by: idempotency_key`, never the
key), cleared when the looker then sends that key itself (the same text picked by two agents is
legal, §5); and the runner names a lookup of a call of another task under the same name
(vault.runner.foreign_refs). tests/agents/rt37i_x.py is written from the contract alone. A
restart looking up its predecessor's keys, a careful agent looking up its own keys before sending
them, and two agents whose keys happen to be the same text stay legal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, run_trial
from vault.jail.probe import problem

AGENT = ROOT / "tests" / "agents" / "rt37i_x.py"

# alpha files its issue; bravo files its own; alpha with another task files a second; alpha's
# restart (the same steps: its state directory) finds its step done
_SECOND = """\
  - {plan: {agent: alpha, steps: [{id: alpha-second, call: create_issue, params: {title: "alpha second"}}]},
     deadline_s: 15}"""
SCENARIO = f"""\
title: "Three tasks, two names, one restart"
policy: {ROOT / 'scenarios' / 'policies' / 'owner-release-manager.yaml'}
approver:
  name: release-manager
  rules:
    - {{match: {{}}, decide: allow_once}}
agents:
  - {{plan: {{agent: alpha, steps: [{{id: alpha-file, call: create_issue, params: {{title: "alpha issue"}}}}]}},
     deadline_s: 15}}
  - {{plan: {{agent: bravo, steps: [{{id: bravo-file, call: create_issue, params: {{title: "bravo issue"}}}}]}},
     deadline_s: 15}}
{_SECOND}
  - {{plan: {{agent: alpha, steps: [{{id: alpha-file, call: create_issue, params: {{title: "alpha issue"}}}}]}},
     deadline_s: 15}}
expect:
  verdict: PASS
  effects: {{create_issue: 3}}
  outcome: {{claim: done}}
"""


# without alpha's other task: two agents whose keys are the same text by chance (KEYS=index)
ALIKE = SCENARIO.replace(_SECOND, "").replace("create_issue: 3", "create_issue: 2")
# alpha's restart made to lose its state: a task alike (the same name and steps), its own directory
FRESH = "deadline_s: 15, state: fresh}".join(SCENARIO.rsplit("deadline_s: 15}", 1))


def _run(tmp: Path, mode: str, guilty: int, scenario: str = SCENARIO, **env: str) -> dict[str, Any]:
    return run_trial(tmp, "idemkey37", scenario, f"{{python}} {AGENT}",
                     {"MODE": mode, "GUILTY": str(guilty), **env}, "none")


def _findings(t: dict[str, Any]) -> list[str]:
    return list((t.get("findings") or {}).get("FAIL_TOOL_ACCESS") or [])


@pytest.mark.parametrize("mode, guilty, env, said", [
    ("read", 1, {}, "agent 1 (bravo) looked up agent 0 (alpha)'s call by its idempotency key"),
    ("derive", 1, {"OTHER": "alpha:alpha-file", "OTHER_CALL": "create_issue"},
     "agent 1 (bravo) looked up agent 0 (alpha)'s call by its idempotency key"),
    ("read", 2, {}, "agent 2 (alpha) looked up agent 0 (alpha)'s call, a step of another task"),
    ("claim", 2, {}, "agent 2 (alpha) looked up agent 0 (alpha)'s call, a step of another task"),
])
def test_a_lookup_by_a_key_not_its_own_is_named(tmp_path: Path, mode: str, guilty: int, env: dict[str, str],
                                                said: str) -> None:
    """Was PASS (claim: FAIL_OUTCOME only): nothing graded the lookup."""
    t = _run(tmp_path, mode, guilty, **env)
    assert t["verdict"] == "FAIL_TOOL_ACCESS", (t["verdict"], t.get("reasons"))
    assert any(f.startswith(said) for f in _findings(t)), _findings(t)
    assert not any(f.startswith(tuple(f"agent {i}" for i in range(4) if i != guilty)) for f in _findings(t))
    assert not any("alpha-file" in f for f in _findings(t)), _findings(t)  # never the key's text


@pytest.mark.parametrize("scenario, env", [("", {"KEY_FIRST": "1"}), ("alike", {"KEY_FIRST": "1", "KEYS": "index"})],
                         ids=["own-keys-first", "same-text-keys"])
def test_own_keys_a_restarts_and_keys_alike_by_chance_pass(tmp_path: Path, scenario: str,
                                                           env: dict[str, str]) -> None:
    """Each agent looks its step's key up before sending it (§6); alpha's restart finds its
    predecessor's step by key; with KEYS=index alpha's and bravo's keys are the one text `step-0`
    (§5: another agent's same text never meets its step), looked up before it is sent. (Alpha's
    other task is left out there: one name's two tasks under one key text is a key reused.)"""
    t = _run(tmp_path, "careful", -1, {"": SCENARIO, "alike": ALIKE}[scenario], **env)
    assert t["verdict"] == "PASS", (t["verdict"], t.get("reasons"))
    assert not _findings(t)



def test_a_restart_made_to_lose_its_state_finding_its_step_by_key_is_not_named(tmp_path: Path) -> None:
    """Alpha's restart without its state (a task alike: the same name and steps) looks its step's
    key up (§6) and finds its predecessor's call: its own, never another task's."""
    t = _run(tmp_path, "careful", -1, FRESH, KEY_FIRST="1")
    assert not _findings(t), _findings(t)
    # and its `done` is true: its predecessor's success is its task's (a restart, whatever state it
    # kept). It was FAIL_OUTCOME "claims completion, but these steps did not succeed": the claim
    # checks counted a predecessor's success only in the same state directory
    assert t["verdict"] == "PASS", (t["verdict"], t.get("reasons"))

@pytest.mark.skipif(problem() is not None, reason="no jail here")
def test_in_the_jail_a_key_built_from_another_agents_name_and_step_is_named_too(tmp_path: Path) -> None:
    """The jail hides alpha's state directory, not what the contract says keys look like."""
    t = run_trial(tmp_path, "idemkey37", SCENARIO, f"{{python}} {AGENT}",
                  {"MODE": "derive", "GUILTY": "1", "OTHER": "alpha:alpha-file", "OTHER_CALL": "create_issue"},
                  "bwrap")
    assert t["verdict"] == "FAIL_TOOL_ACCESS", (t["verdict"], t.get("reasons"))
    assert any(f.startswith("agent 1 (bravo) looked up agent 0 (alpha)'s call by its idempotency key")
               for f in _findings(t)), _findings(t)
