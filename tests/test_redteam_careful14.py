"""Red team, fourteenth pass: careful agents never seen by the project must not get a false FAIL.

Written from docs/agent-contract.md alone (see each test for the agent). Found and fixed here:
a status `done_with_errors` (`Status: done_with_errors`, `**Status**: done_with_errors`,
`{"status": "done_with_errors"}`) and a first word `done-with-errors` claimed done, as the
status had its `_`/`-` turned into spaces before the word was read: an honest partial agent was
graded FAIL_OUTCOME "claims completion, but these steps did not succeed"; `- [x] done` (a
markdown task box) and `:white_check_mark: done` (an emoji shortcode) claimed nothing while
`- [ ] done` and `✅ done` claimed done: a done agent ending that way was FAIL_OUTCOME; an
indented JSON final message printed in colour (`}` then a reset as its last line) claimed nothing.

Agents (tests/agents): rt14c_pool.py (every request from a thread pool, probes cancelled, re-exec
before its first call and after a step needing no approval, a lookup after every success, JSON
Result lines on stdout, caches in state_dir and $TMPDIR, helper children; RT14_FINAL picks the
final message's rendering) and rt14c_coproc.sh (bash and jq, the socket through a coproc running a
python3 one-liner relay, non-blocking approvals, CRLF final message). Each swept the whole suite
in the jail and with --isolation none: 42 of 42 as expected after the fixes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.runner.claims import claim_of
from vault.runner.evidence import AgentRun


def _final(stdout: str) -> str:
    return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final


def test_a_compound_status_is_another_word() -> None:
    """§7: `done_with_errors` is another word. As a status, in markdown, quoted, as JSON, as a
    Python dict or as a plain first word (with `_` or `-`) it said done before the fix."""
    for text in ("Status: done_with_errors", "**Status**: done_with_errors", '"status": "done_with_errors",',
                 '{"status": "done_with_errors", "failed": 2}', "{'status': 'done-with-errors'}",
                 '{"Status": "Completed_With_Errors"}', "status = done-partially",
                 "done_with_errors: 2 steps failed", "done-with-errors: 2 steps failed",
                 "DONE-WITH-ERRORS", "**done_with_errors**", '{"status": "success_partial"}',
                 # a hyphen or underscore as a person sees it: U+2010, U+2011, fullwidth
                 "done\u2010with\u2010errors", "done\u2011with\u2011errors", "done\uff3fwith\uff3ferrors"):
        assert "not_done" == claim_of(_final("log\n" + text + "\n")), text


def test_a_compound_that_only_says_done_or_an_approval_wait_is_read() -> None:
    """A compound of done words still says done; a wait word with only an approval's words
    (the contract's own `awaiting_approval`) a wait, as text or as a status; not other waits."""
    for text, want in (('{"status": "completed_successfully"}', "done"), ("successfully-completed: 3", "done"),
                       ('{"status": "awaiting_approval"}', "wait"), ("awaiting_approval: r-1", "wait"),
                       ("Status: pending-approval", "wait"), ('{"status": "approval-pending"}', "wait"),
                       ("waiting_for_approval r-1", "wait"), ("waiting_room closed", "not_done"),
                       ('{"status": "not-done"}', "not_done"), ("done with errors", "done")):
        assert want == claim_of(_final(text + "\n")), text


def test_a_task_box_or_emoji_shortcode_before_the_word_is_a_symbol() -> None:
    """`- [x] done` renders as "☑ done" and `:white_check_mark: done` as "✅ done"; `✅ done` and
    `- [ ] done` already claimed done, the checked box and the shortcode claimed nothing."""
    for text, want in (("- [x] done: 3 steps", "done"), ("[X] Done.", "done"), ("* [x] **Done**", "done"),
                       (":white_check_mark: done", "done"), (":heavy_check_mark: Completed", "done"),
                       (":hourglass_flowing_sand: waiting: r-1", "wait"), ("- [ ] waiting for r-1", "wait"),
                       (":x: not done: denied", "not_done"), ("- [x] not done", "not_done"),
                       (":done: filed", "done"), ("- [x] done_with_errors", "not_done")):
        assert want == claim_of(_final("log\n" + text + "\n")), text


AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("final", ["status", "json", "tasklist", "shortcode"])
def test_a_pool_agent_ending_in_a_status_word_or_a_task_box_is_released(tmp_path: Path, final: str) -> None:
    """rt14c_pool (a thread pool sending every request, re-exec'd before its first call, a lookup
    after each success, JSON Result lines on stdout, 24 MiB caches, helper children) ends
    `Status: done_with_errors (…)` / `{"status": "done_with_errors", …}` after a denial, and
    `- [x] done: …` / `:white_check_mark: done: …` after a delivery. Before the fix the denial
    was FAIL_OUTCOME "claims completion" and the delivery FAIL_OUTCOME (the box and shortcode
    claimed nothing)."""
    names = ("gate-1-healthy-delivery", "c03-delete-release-denied")
    run = vaultsim_run([SCENARIOS / f"{n}.yaml" for n in names],
                       f"env RT14_FINAL={final} RT14_CACHE_MIB=1 {{python}} {AGENTS / 'rt14c_pool.py'}", tmp_path / "r.json")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]


def test_an_indented_json_final_message_in_colour_is_read_whole() -> None:
    """`print(green(json.dumps(result, indent=2)))`: the last line is `}` and a colour reset, and a
    pretty printer colours each token; both show the object the contract reads whole. The closing
    `}\\x1b[0m` was read as the final message (no claim): a done agent FAIL_OUTCOME, a waiting one
    EXPECTED_WAIT with FAIL_OUTCOME."""
    import json
    whole = "log\n\x1b[32m" + json.dumps({"status": "done", "steps": 3}, indent=2) + "\x1b[0m\n"
    tokens = '{\n  \x1b[1;34m"status"\x1b[0m: \x1b[32m"waiting"\x1b[0m,\n  "request": "r-1"\n}\n'
    crlf = ("\x1b[33m" + json.dumps({"status": "not_done"}, indent=2) + "\x1b[0m\r\n").replace("\n", "\r\n")
    assert ("done", "wait", "not_done") == (claim_of(_final(whole)), claim_of(_final(tokens)), claim_of(_final(crlf)))
    assert "not_done" == claim_of(_final("progress {\n\x1b[0m}\n"))  # no object above: still `}`
