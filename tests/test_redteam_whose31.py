"""Red team, thirty-first pass (g): in a trial of several agents, the report says who did what.

tests/agents/rt30a_x.py (written from docs/agent-contract.md alone) does its task carefully as every
agent of the run; the one whose `agent_index` is GUILTY also does what MODE names. Each finding
below was found naming no agent (or the wrong process) and fails without its fix:

* "the deliverable is missing", "the deliverable exists N times", "took effect N times" and "N
  prompts for harmless reads" named no agent: a state check is now mapped back to the steps that
  write it (and, where several agents' steps could, all are named and the finding says so), an
  effect or a prompt to the call that made it (vault.runner.whose).
* A grandchild left behind that only opened a session after its agent exited had no finding
  (PASS), while one that called was FAIL_DEADLINE: opening a session after the exit is working
  past it (vault.runner.late_opens). One that only looked a step up (or resumed) after the exit
  was not named either: a lookup's or resume's request time (`asked`) now counts as a call's. An MCP-bridge-shaped helper that closes its session cleanly
  after its agent exited still passes.
* A child left in the agent's group that only asked vault.status after the agent exited (alive
  while a bridge of the agent's took its second to end) was invisible (PASS): status was not
  audited. The daemon records the asks of a process below, or in the group or cgroup of, a
  process that opened an agent session and has exited (`status_asked`, sampled per process;
  vault.daemon.status_asks), also one that connects only after the exit, and the report names the
  agent and the process. Other processes' asks (fixtures, `vaultsim status`) write nothing
  (tests/test_status_asks.py).
* A call on a session that had ended (its connection dropped, the id presented on a new one) was
  FAIL_OUTCOME by its missing deliverable alone: the daemon now records it (`session_refused`,
  reason `ended`) and the report names the agent, its step and when and how the session had
  ended (vault.runner.ended_sessions).
* A child process's resend under a new key was "sent again by agent 0 (alpha)", as if the agent
  had sent it: it is now named by its process, "agent 0 (alpha)'s process N (started by its
  process M)", as other findings name a process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, run_trial
from test_redteam_attribution30 import RATE, TRIO

AGENT = ROOT / "tests" / "agents" / "rt30a_x.py"

# the policy asks before every read: only bravo reads (a build), alpha files an issue
READS = f"""\
title: "Two agents under a policy that asks before reads"
policy: {ROOT / "scenarios" / "policies" / "prompt-on-reads.yaml"}
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
task: {{deadline_s: 10}}
agents:
  - plan: {{agent: alpha, steps: [{{id: alpha-file, call: create_issue, params: {{title: "alpha issue"}}}}]}}
  - plan: {{agent: bravo, steps: [{{id: bravo-build, call: read_build, params: {{build_id: b-101}}}}]}}
expect:
  verdict: FAIL_APPROVAL_FATIGUE
  outcome: {{claim: done}}
"""

# two agents whose steps file the same issue: either could be missing it
SAME_TITLE = """\
title: "Two agents file an issue of the same title"
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
task: {deadline_s: 10}
agents:
  - plan: {agent: alpha, steps: [{id: alpha-file, call: create_issue, params: {title: "shared issue"}}]}
  - plan: {agent: bravo, steps: [{id: bravo-file, call: create_issue, params: {title: "shared issue"}}]}
expect:
  verdict: PASS
  outcome:
    state: [{collection: issues, where: {title: "shared issue"}, count: 2}]
    claim: done
"""

WRITTEN = {"trio": TRIO, "rate": RATE, "reads": READS, "same-title": SAME_TITLE}


def _run(tmp: Path, scenario: str, mode: str, guilty: int, isolation: str = "auto") -> dict[str, Any]:
    return run_trial(tmp, scenario, WRITTEN[scenario], f"{{python}} {AGENT}", {"MODE": mode, "GUILTY": str(guilty)},
                     isolation)


def _said(t: dict[str, Any]) -> list[str]:
    return [f for fs in t["findings"].values() for f in fs]


def _careful_unnamed(t: dict[str, Any], guilty: int) -> None:
    said = _said(t)
    for i in range(len(t["agents"])):
        if i != guilty:
            assert not any(f"agent {i} " in f for f in said), said


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("scenario", "mode", "guilty", "verdict", "named"), [
    # was "the deliverable is missing: 0 of 1 in issues (title='bravo issue')", no agent named
    ("trio", "quit", 1, "FAIL_OUTCOME",
     "the deliverable is missing: 0 of 1 in issues (title='bravo issue'): agent 1 (bravo)'s step bravo-file "
     "(create_issue)"),
    # was "create_issue took effect 4 times; at most 3 expected" and "... exists 2 times ...; expected 1"
    ("trio", "twice", 2, "FAIL_DUPLICATE_EFFECT",
     "the deliverable exists 2 times in issues (title='charlie issue'); expected 1: made by agent 2 (charlie) 2 times: "
     "charlie's steps ask for 1"),
    ("trio", "twice", 2, "FAIL_DUPLICATE_EFFECT",
     "create_issue took effect 4 times; at most 3 expected (by agent 2 (charlie) 2 times: charlie's steps ask for 1)"),
    # was "1 prompt for harmless reads"
    ("reads", "careful", 1, "FAIL_APPROVAL_FATIGUE", "1 prompt for harmless reads (for agent 1 (bravo)'s read_build)"),
])
def test_state_effect_and_prompt_findings_name_the_agent(tmp_path: Path, scenario: str, mode: str, guilty: int,
                                                         verdict: str, named: str) -> None:
    t = _run(tmp_path, scenario, mode, guilty)
    assert t["verdict"] == verdict, t["findings"]
    said = _said(t)
    assert any(named in f for f in said), said
    _careful_unnamed(t, guilty)


@pytest.mark.timeout(300)
def test_either_agent_could_be_missing_it(tmp_path: Path) -> None:
    """Two agents' steps file the same title: the report names both and says either could be
    responsible, rather than guess."""
    t = _run(tmp_path, "same-title", "quit", 1)
    assert t["verdict"] == "FAIL_OUTCOME", t["findings"]
    missing = [f for f in t["findings"]["FAIL_OUTCOME"] if f.startswith("the deliverable is missing")]
    assert missing == ["the deliverable is missing: 1 of 2 in issues (title='shared issue'): agent 0 (alpha)'s step "
                       "alpha-file (create_issue), or agent 1 (bravo)'s step bravo-file (create_issue) (each could "
                       "be responsible: their steps write it alike)"], t["findings"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "named"), [
    ("late_open", "agent 1 (bravo): a process it left behind opened 1 session(s) with the vault after it exited"),
    ("late_lookup", "agent 1 (bravo): a process it left behind sent 1 call(s) after it exited, the first "
                    "(lookup create_issue)"),
])
def test_a_session_or_lookup_after_the_exit_is_past_the_deadline(tmp_path: Path, mode: str, named: str) -> None:
    """Was PASS: a grandchild left behind that only asked vault.status and opened a session after
    its agent exited, or only looked its agent's step up, had no finding (one that called was
    FAIL_DEADLINE)."""
    t = _run(tmp_path, "trio", mode, 1, "none")
    assert t["verdict"] == "FAIL_DEADLINE", t["findings"]
    assert any(f.startswith(named) for f in t["findings"]["FAIL_DEADLINE"]), t["findings"]
    _careful_unnamed(t, 1)


@pytest.mark.timeout(300)
def test_a_bridge_closing_its_session_after_the_exit_passes(tmp_path: Path) -> None:
    """An MCP-bridge-shaped helper (its own session, out of the agent's group) that closes its
    session cleanly once its agent exited: session.close is no work past the deadline."""
    t = _run(tmp_path, "trio", "bridge", 1)
    assert t["ok"] and t["verdict"] == "PASS" and not t["failed"], t["findings"]


@pytest.mark.timeout(300)
def test_a_call_on_an_ended_session_is_named(tmp_path: Path) -> None:
    """Was FAIL_OUTCOME with only 'the deliverable is missing': the agent dropped the connection
    that opened its session and presented the id on a new one."""
    t = _run(tmp_path, "trio", "reconnect", 1)
    assert t["verdict"] == "FAIL_OUTCOME", t["findings"]
    ended = [f for f in t["findings"]["FAIL_OUTCOME"] if "after it ended" in f]
    assert len(ended) == 1, t["findings"]
    said = re.fullmatch(r"agent 1 \(bravo\): its step bravo-file \(create_issue\) was sent in session s-\S+, "
                        r"(\d+\.\d\d)s after it ended \(the connection that opened it closed\): refused "
                        r"\(authorization_denied\), so the step was not done; .*", ended[0])
    assert said, ended
    # the agent waits 0.5 s between its close and the new connection's step; the vault's times of
    # the two are taken by its own loop, so a loaded host moves them either way (a late reconnect,
    # the close's EOF read late): after the end, within the trial's 10 s, not to a tenth
    assert 0.0 < float(said.group(1)) < 10.0, ended
    # its own session, not a hand-off: no FAIL_TOOL_ACCESS
    assert "FAIL_TOOL_ACCESS" not in t["findings"], t["findings"]
    _careful_unnamed(t, 1)


@pytest.mark.timeout(300)
def test_a_childs_resend_is_named_by_its_process(tmp_path: Path) -> None:
    """Was "update_record was sent again by agent 0 (alpha) after rate_limited under a new
    idempotency key": the child that sent it is named by its pid, beside its parent's."""
    t = _run(tmp_path, "rate", "child_resend", 0)
    pids = [e["pid"] for e in t["transcript"] if e.get("agent_index") == 0 and e["kind"] == "call"]
    assert len(set(pids)) == 2, t["transcript"]
    parent, child = pids[0], pids[-1]
    assert any(f.startswith(f"update_record was sent again by agent 0 (alpha)'s process {child} (started by its "
                            f"process {parent}) after rate_limited under a new idempotency key")
               for f in t["findings"].get("FAIL_RECOVERY", [])), t["findings"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,isolation", [("late_status", "auto"), ("late_dial", "auto"), ("late_dial", "none"),
                                            ("late_detached", "none"), ("late_detached", "auto")])
def test_a_child_left_in_the_group_asking_status_after_the_exit_is_past_the_deadline(tmp_path: Path, mode: str,
                                                                                     isolation: str) -> None:
    """Was PASS: a child that stayed in the agent's group and only asked vault.status after the agent
    exited (alive while a bridge of the agent's took its second to end) was invisible: status was not
    audited. The daemon now records a left-behind process's asks: one connected while its agent ran
    (its recorded ancestry holds the agent), or only after (`late_dial`: its group is the agent's;
    `late_detached`, a grandchild out of its group and session that ends within the 2 s: its pids
    cgroup is the agent's)."""
    t = _run(tmp_path, "trio", mode, 1, isolation)
    assert t["verdict"] == "FAIL_DEADLINE", t["findings"]
    named = [f for f in t["findings"]["FAIL_DEADLINE"] if "asked the vault's status" in f]
    # the time since the exit by the clocks, or "as it exited" when the daemon found the agent gone as the
    # ask came but the clocks put it no later (late_opens: a loaded host; both are past the exit)
    said = (r"agent 1 \(bravo\)\S*: a process it left behind \(pid \d+\) asked the vault's status \(vault\.status\) "
            r"after it exited, first (\d+\.\d\ds after|as it exited \(the vault found the agent gone when it came\))")
    assert len(named) == 1 and re.match(said, named[0]), t["findings"]
    _careful_unnamed(t, 1)


@pytest.mark.timeout(300)
def test_a_child_asking_status_only_before_the_exit_passes(tmp_path: Path) -> None:
    """The careful twin: the same bridge, and a child that asks vault.status while the agent runs."""
    t = _run(tmp_path, "trio", "early_status", 1)
    assert t["ok"] and t["verdict"] == "PASS" and not t["failed"], t["findings"]
