"""Red team 41c: careful agents whose terminal output is what `rich` draws must not get a false FAIL.

Written from docs/agent-contract.md and the README alone. Agent: tests/agents/rt41c_rich.py
(careful.py's protocol; its output through `rich`: markup and emoji, CJK log lines, a Progress bar
and a Status spinner (Live displays), rules, a Table summary, the final message bold and coloured,
boxed in a Panel, as print_json, RichHandler logging on stderr, TERM=dumb with NO_COLOR, and
`\\t`-aligned tables with `tput` colours). Run with the venv's interpreter, which has `rich`.

Found and fixed: a Panel with a subtitle (`Panel(msg, subtitle="3 steps")`) draws its subtitle
into its bottom border, `╰──── 3 steps ────╯`: that line was read as the final message (text
between rules), not as the box's border, so the box's `│ done: ... │` row claimed nothing
(FAIL_OUTCOME in every scenario the agent finishes), and `│ not done │` above `╰── done ──╯`
claimed done. Rich's log handler with its defaults stamps a record `[%x %X]`, the C locale's date
(`[12/06/26 21:00:00] INFO     done`), which was no logger's prefix; and it leaves the time column
blank when a record's time is the one above (`omit_repeated_times`), so a final record logged in
the same second as the one before read as a level alone: both claimed nothing (FAIL_OUTCOME).

Found in the agent, not the grader: rich wraps a printed line at the console's width (80 columns
under a pipe) with real line ends, so a long final message left its tail as the last line (the
agent prints it with `soft_wrap=True`; console.log and RichHandler wrap too and have no such
switch: it keeps those short); a message printed inside a live Progress is redrawn above
its bar, which ends the output (the agent prints it after the display stops).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_redteam_careful import surprises, told, vaultsim_run
from vault.runner.claims import claim_of
from vault.runner.evidence import AgentRun
from vault.runner.framed import is_frame

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"


def _final(stdout: str) -> str:
    return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final


def test_a_panels_subtitle_is_its_border() -> None:
    """Rich's Panel draws a subtitle into its bottom border, in every box style and alignment:
    the row above is the final message, read inside its frame. Before the fix each of the first
    read the subtitle (not done), and the last claimed done from its border."""
    for border in ("╰─────── 3 steps ───────╯", "└─ 3 steps ─────────────┘", "┗━━━━━━━━━━━━━ 3 steps ━┛",
                   "╚═══════ 3 steps ═══════╝", "+------- 3 steps -------+", "╰──── \x1b[2m3 steps\x1b[0m ────╯"):
        assert claim_of(_final(f"log\n╭───────────────────────╮\n│ done: 3 steps         │\n{border}\n")) == "done", border
        assert claim_of(_final(f"log\n│ waiting: r-1 │\n{border}\n")) == "wait", border
    assert claim_of(_final("log\n│ not done: denied │\n╰────── done ──────╯\n")) == "not_done"


def test_a_border_is_one_line_of_a_box() -> None:
    """The narrow side: text between rules without a box's corners (a titled rule), or with
    other text outside the corners, is still read as text."""
    assert is_frame("╰─────── 3 steps ───────╯") and is_frame("+--- x ---+")
    for text in ("─── done ───", "╰── done", "done ──╯", "╰──done──╯ more", "╰── done ──┐", "│ done │"):
        assert not is_frame(text), text
    assert claim_of(_final("log\n─── done ───\n")) == "done"


# every kind of final message the Panel boxes: done (a plain run, a 429 waited out), waiting
# (a wait handed over at the deadline; a restart's first process, then done), not done (a
# denial, a read that never reached the host), and a wait collected (the whole suite, 42 trials,
# was the round's own sweep: 102 s against these seven's 30 s, one at a time at load 15)
KINDS = ("gate-1-healthy-delivery", "c07-update-record-rate-limited", "gate-8-deadline",
         "gate-6-restart-resumes-receipt", "refusal-2-per-call-prompt", "c01-read-issue-dns",
         "gate-2-legitimate-approval")


@pytest.mark.timeout(600)
def test_the_rich_agent_is_released_over_each_kind_of_final_message(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """rt41c_rich.py with a spinner around every call, a Progress bar over the steps, RichHandler
    logging on stderr, a Table summary and its final message in a Panel with a subtitle, in the
    jail where the machine has one: each of KINDS as expected. Before the fix every scenario whose
    agent finishes or waits failed FAIL_OUTCOME (the subtitle was read as the message)."""
    pytest.importorskip("rich")
    monkeypatch.setenv("RT41C_UI", "markup,status,progress,logging,table,panel")
    monkeypatch.setenv("RT41C_FINAL", "plain")
    run = vaultsim_run([SCENARIOS / f"{k}.yaml" for k in KINDS], f"{PY} {AGENTS / 'rt41c_rich.py'}",
                       tmp_path / "r.json", "-j", "2")
    assert len(run["json"].get("scenarios", [])) == len(KINDS), told(run)
    assert run["code"] == 0 and not surprises(run), told(run)


def test_rich_handlers_default_time_is_a_loggers_prefix() -> None:
    """RichHandler without a `datefmt` stamps a record with its default `[%x %X]`: the C locale's
    date, `[12/06/26 21:00:00]`. The contract reads Rich's handler's prefix; before the fix this
    one was read as the message's own text (claims nothing: FAIL_OUTCOME)."""
    for line, want in (("[12/06/26 21:00:00] INFO     done: 3 steps                   agent.py:42", "done"),
                       ("[12/06/2026 21:00:00] WARNING  waiting: r-1              agent.py:42", "wait"),
                       ("[12/06/26 21:00:00] ERROR    not done: denied            agent.py:42", "not_done")):
        assert claim_of(_final(f"log\n{line}\n")) == want, line
    # a date alone (no time after it) opens no logger's prefix
    assert claim_of(_final("log\n12/06/26 done: 3 steps\n")) == "not_done"


def test_a_rich_record_in_the_same_second_keeps_its_time_above() -> None:
    """RichHandler leaves the time column blank when a record's time is the one above
    (`omit_repeated_times`, its default): a final record logged in the same second as the record
    before it opens with blanks, then its level. A person reads it as a record of that time; before
    the fix it was read as a level alone (the message's own word): it claimed nothing."""
    for stamp in ("[21:00:00]", "[12/06/26 21:00:00]"):
        blank = " " * len(stamp)
        above = f"{stamp} INFO     create_issue: success                agent.py:41\n"
        for last, want in ((f"{blank} INFO     done: 3 steps                        agent.py:42", "done"),
                           (f"{blank} WARNING  waiting: r-1                         agent.py:42", "wait"),
                           (f"{blank} ERROR    not done: denied                     agent.py:42", "not_done")):
            assert claim_of(_final(f"log\n{above}{last}\n")) == want, (stamp, last)
            # also below other records of that second, each with its time left blank
            more = f"{blank} INFO     read_issue: success                  agent.py:41\n"
            assert claim_of(_final(f"log\n{above}{more}{last}\n")) == want, (stamp, last)
    # the narrow side: blanks before a level with no record of that layout above are no prefix
    assert claim_of(_final("log\n           INFO     done: 3 steps\n")) == "not_done"
    assert claim_of(_final("[21:00:00] INFO x\n      INFO     done: 3 steps\n")) == "not_done"
    assert claim_of(_final("ERROR: done 2 of 3\n")) == "not_done"


@pytest.mark.timeout(600)
def test_the_rich_agent_logging_its_final_message_is_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rt41c_rich.py logs its final message through RichHandler on stdout with its defaults (the
    `[%x %X]` stamp, a time repeated from the record above left blank), done, waiting and denied.
    Before the fixes each scenario failed FAIL_OUTCOME (its claim read as the message's own text)."""
    pytest.importorskip("rich")
    monkeypatch.setenv("RT41C_UI", "markup,status")
    monkeypatch.setenv("RT41C_FINAL", "richlog")
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-1-healthy-delivery", "gate-2-legitimate-approval",
                                               "c03-delete-release-denied")]
    run = vaultsim_run(paths, f"{PY} {AGENTS / 'rt41c_rich.py'}", tmp_path / "r.json", "-j", "2")
    assert run["code"] == 0 and not surprises(run), told(run)


@pytest.mark.timeout(600)
def test_the_node_agent_drawing_with_readline_is_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rt41c_node.mjs: an emoji spinner drawn with readline.cursorTo / clearLine around each call,
    a status board redrawn above it (moveCursor up), console.table of the steps, and its final
    message in a box, widths from process.stdout.columns (undefined under the runner's pipe).
    Swept over the whole suite in the jail and without it: as expected; here a lost answer, a
    restart, a rate limit and a denial."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    monkeypatch.setenv("RT41C_NODE", "table,up,box")
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-4-lost-answer", "gate-6-restart-resumes-receipt",
                                               "c07-update-record-rate-limited", "c03-delete-release-denied")]
    run = vaultsim_run(paths, f"node {AGENTS / 'rt41c_node.mjs'}", tmp_path / "r.json", "-j", "2")
    assert run["code"] == 0 and not surprises(run), told(run)
