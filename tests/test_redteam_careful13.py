"""Red team, thirteenth pass: careful agents never seen by the project must not get a false FAIL.

Written from docs/agent-contract.md alone:

    tests/agents/rt13c_async.py  Python asyncio, std only: answers matched by id on a reader task,
                                 a second connection asking `vault.status` meanwhile, `vault.status`
                                 and `catalog` before every step, non-blocking approvals (wait_s 0,
                                 then call.resume every 50-300 ms), an outcome_unknown looked up by
                                 its idempotency key (section 3) or its correlation id, work from
                                 inside state_dir (chdir), 64 KiB of debug lines on stderr per
                                 step, each step (or each read) done by a child process with its
                                 own session, a FIFO, a bound socket, links to /dev/zero and
                                 /dev/null, a link loop, mode-000 files and a 300 MiB sparse file
                                 left in state_dir and $TMPDIR, the final message as markdown
                                 (`__Done__`, `**Status**: done`, `# Done`), as .NET's JSON (`{"Status":"Done"}`), inside a terminal hyperlink (OSC 8), after
                                 `✔️`, printed by a `printf` exec'd in the agent's place, or followed
                                 by os._exit(0)

swept over the whole embedded suite in the jail, with `--isolation none` and with `--jobs 2`.
Found and fixed here: a restart that resumed its predecessor's request, then was asked (and
granted) a second step of the same scope, was FAIL_APPROVAL_FATIGUE "asked again in a session
that holds a grant for it" (the first prompt was put in the restart's session, and the grant its
second prompt's decision made was counted as held before it); a JSON final message with PascalCase fields (`{"Status":"Done"}`, .NET's
default) claimed nothing; a final message labelled in markdown (`**Status**: done`) or as a JSON
member (`"status": "done"`) was not read as the `Status: WORD` line it shows; a final message whose claim word is in markdown's underscore emphasis
(`__Done__: 3 steps`, `_waiting_`) claimed nothing (`_` is a word character to a regex's `\\W`),
and the done agent was graded FAIL_OUTCOME (a waiting one EXPECTED_WAIT with FAIL_OUTCOME).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.runner.claims import claim_of
from vault.runner.evidence import AgentRun

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"


def _final(stdout: str) -> str:
    return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final


def test_a_claim_word_in_underscore_emphasis_is_read() -> None:
    """Markdown's bold and italics are `**x**`/`__x__` and `*x*`/`_x_`; the contract names
    "punctuation or symbols around it, as in `**done**`". The underscore forms read as no claim:
    a done agent FAIL_OUTCOME, a waiting one EXPECTED_WAIT plus FAIL_OUTCOME."""
    for text in ("__Done__: filed ISS-1", "_done_", "__DONE__", "___done___.", "**__done__**"):
        assert "done" == claim_of(_final("log\n" + text + "\n")), text
    for text in ("__Waiting__: create_issue needs approval", "_pending_ r-1", "__awaiting__"):
        assert "wait" == claim_of(_final(text + "\n")), text
    # a word that runs on with `_` into letters is another word, and `not_done` stays not done
    for text in ("done_with_errors", "waiting_room closed", "_not_done_", "not_done", "__init__ done"):
        assert "not_done" == claim_of(_final(text + "\n")), text


def test_a_status_label_in_markdown_or_quotes_is_read_as_the_status_line() -> None:
    """`Status: WORD` reads as a JSON status; an agent writing markdown prints the same label in
    bold (`**Status**: done`), and one echoing a JSON member prints `"status": "done"`. Those read
    as no claim: a done agent FAIL_OUTCOME, a waiting one EXPECTED_WAIT plus FAIL_OUTCOME."""
    for text, want in (("**Status**: done \u2014 3 steps", "done"), ("__Status__: done", "done"),
                       ("*Status*: Done", "done"), ("`status`: done", "done"), ('"status": "done",', "done"),
                       ("- **Status**: done", "done"), ("**Status**: waiting for r-1", "wait"),
                       ("**Status**: not done", "not_done"), ("**Status**: failed", "not_done")):
        assert want == claim_of(_final("log\n" + text + "\n")), text
    # a line that opens as JSON says nothing by a member inside it; other labels are no status
    for text in ('[{"status": "done"}]', '{"status": "done", "message": "cut sh', "status_code: 200",
                 "statuses: done"):
        assert "not_done" == claim_of(_final(text + "\n")), text


def test_a_json_final_message_with_pascal_case_fields_is_read() -> None:
    """System.Text.Json (and Go's encoding/json without tags, Jackson with a naming strategy)
    writes a record's fields as `Status`, `Message`, `Ok`: a .NET agent's done read as no claim
    (FAIL_OUTCOME), its wait EXPECTED_WAIT plus FAIL_OUTCOME. A field spelled exactly wins."""
    assert "done" == claim_of(_final('{"Status":"Done","Message":"3 steps"}\n'))
    assert "wait" == claim_of(_final('{"Status":"Waiting","RequestId":"r-1"}\n'))
    assert "done" == claim_of(_final('{"OK":true,"Category":"success"}\n'))
    assert "wait" == claim_of(_final('{"Ok":false,"Category":"approval_pending"}\n'))
    assert "not_done" == claim_of(_final('{"Status":"NotDone"}\n'))
    assert "not_done" == claim_of(_final('{"status":"not_done","Status":"done"}\n'))


FEW = [SCENARIOS / f"{k}.yaml" for k in ("gate-1-healthy-delivery", "gate-2-legitimate-approval")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("final", ["md_under", "md_status", "pascal"])
def test_an_asyncio_agent_ending_in_markdown_is_released(tmp_path: Path, final: str) -> None:
    """rt13c_async polling its approval every 50 ms and ending `__Done__: …` / `__Waiting__: …`
    (or `**Status**: done — …`), then os._exit(0): both claims read as they say (before the fix:
    FAIL_OUTCOME twice)."""
    run = vaultsim_run(FEW, f"env RT13_FINAL={final} RT13_EXIT=osexit RT13_POLL=0.05 "
                            f"{{python}} {AGENTS / 'rt13c_async.py'}", tmp_path / "r.json")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]


RESTART_GRANT = """\
title: "A restart resumes its predecessor's approval, then files a second issue"
approver:
  rules:
    - {match: {operation: create_issue}, decide: allow_session, delay_s: 4.0}
agents:
  - plan:
      agent: filer
      steps: [{call: create_issue, params: {title: one}}, {call: create_issue, params: {title: two}}]
      final: done
    deadline_s: 3
  - plan:
      agent: filer
      steps: [{call: create_issue, params: {title: one}}, {call: create_issue, params: {title: two}}]
      final: done
    state: keep
expect:
  verdict: PASS
  effects: {create_issue: 2}
  outcome:
    state:
      - {collection: issues, where: {title: one}, count: 1}
      - {collection: issues, where: {title: two}, count: 1}
    claim: done
"""


@pytest.mark.timeout(600)
def test_a_restart_that_resumed_its_predecessors_request_is_not_asked_again_in_a_granted_session(
        tmp_path: Path) -> None:
    """The first process stops waiting (3 s; the owner decides `allow_session` after 4 s), the
    restart resumes its saved token (the request, and the grant, were the dead session's), then
    calls its second step: asked once more, as the contract says a new process is. The fatigue
    check put the first prompt in the restart's session (the last entry of its correlation id,
    the resume) and counted the grant the second prompt's own decision made: "asked again ... in a
    session that holds a grant for it", FAIL_APPROVAL_FATIGUE for a careful restart."""
    scenario = tmp_path / "restart-grant.yaml"
    scenario.write_text(RESTART_GRANT)
    run = vaultsim_run([scenario], f"{{python}} {AGENTS / 'rt13c_async.py'}", tmp_path / "r.json")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
