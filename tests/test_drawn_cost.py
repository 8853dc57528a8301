"""What reading a final line costs the grader, per control an agent can write (contract §7).

An agent controls the bytes of its final line; the runner reads them as a terminal draws them
(vault.runner.drawn and its helpers, vault.runner.screen). A hostile line must not stall the release
gate, so reading costs about the bytes read. The inputs are bench/drawn_cost.py's: every control
the readers handle, and seeded random pairs of them, repeated with text between. Costs are CPU
seconds compared with a baseline read in the same process (NUL and text alternating: a token a
character) by generous factors, with a hard budget per input: a stall is tens of times the
baseline or minutes, noise is not. The full table at the readers' bounds: `python bench/drawn_cost.py`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from vault.runner.claims import claim_of
from vault.runner.drawn import as_shown
from vault.runner.evidence import AgentRun


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "bench" / "drawn_cost.py"
    spec = importlib.util.spec_from_file_location("drawn_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


def _final_claim(text: str) -> str:
    return claim_of(AgentRun(0, "agent", "agent", 1, 0.0, 0.0, 0, False, text, "").final)


def _cpu(read, text: str, reps: int = 1, budget: float = 20.0) -> float:  # type: ignore[no-untyped-def]
    return min(bench.cpu(read, text, budget) for _ in range(reps))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("template", [
    "x\x1b[{n}Cdone",                           # a column move past any line
    "not\x1b[{zeros}8m done",                   # SGR 8 (concealed) behind thousands of zeros
    "not done\x1b[{n}Z\x1b[{n}Idone",           # back tabs and tabs
    "d\x1b[1;{n}Hone",                          # a column past the line
    "x\x1b[38;5;{n};48;5;{n}mdone",             # a colour on itself
    "done\n\x1b[{n}A\x1b[2Knot done\n",         # up past the first line, that line erased
    "not done\n\x1b[{n}Adone\x1b[{n}B\n",       # up and down again
], ids=["cuf", "sgr8", "cbt-cht", "cup", "sgr-colours", "cuu", "cuu-cud"])
def test_a_count_of_thousands_of_digits_reads_as_a_large_one(template: str) -> None:
    # int() refuses more than 4300 digits: `ESC [` and 5000 nines raised ValueError out of the
    # grader (the line as drawn, the screen's moves, SGR colours) for a 5 KB final line. Past every
    # bound, such a count reads as one of 9 digits does
    huge = template.format(n="9" * 5000, zeros="0" * 5000)
    large = template.format(n="9" * 9, zeros="0" * 9)
    assert as_shown(huge) == as_shown(large)
    assert _final_claim(huge) == _final_claim(large)
    assert claim_of(huge) == claim_of(large)


@pytest.mark.timeout(120)
def test_lines_that_set_tab_stops_cost_what_lines_of_text_cost() -> None:
    # each line that set a tab stop away from the 8-column base allocated a tree of the line's
    # width (65,537 entries): 1 MiB of `-ESC H` lines, the runner's tail, read 12x slower than as
    # many lines of text (about 10 s of the grader's CPU); now about 3x
    size = 1 << 18
    text = _cpu(_final_claim, bench.output_input("yy", size), reps=3)
    stops = _cpu(_final_claim, bench.output_input("-\x1bH", size), reps=3)
    assert stops < 6 * text + 0.05, (stops, text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("far", ["\x1b[65535C", "\x1b[99999999I", "\x1b[65535G", "\x1b[1;65535H"])
def test_lines_drawn_far_right_cost_about_what_text_costs(far: str) -> None:
    # a line drawn 65,536 columns wide by 6 bytes was painted a cell a column and then looked at a
    # character at a time (evidence._shows, lookalike.skeletons): 8 ms a line, a MiB of such
    # lines about 14 minutes of the grader's CPU (26 s for 32 KiB here before)
    size = 32 << 10
    base = _cpu(_final_claim, bench.output_input("\x00", size), reps=3)
    took = _cpu(_final_claim, bench.output_input(far, size), reps=2, budget=max(5.0, 40 * base))
    assert took < 20 * base + 0.05, (took, base)


def _sweep(reader: str, units: dict[str, str], size: int) -> list[str]:
    """The inputs whose cost per MiB is far above the baseline's (20x), or past the budget."""
    read, build, _ = bench.READERS[reader]
    base = _cpu(read, build(bench.BASELINE, size), reps=3)
    slow = []
    for name, unit in units.items():
        took = _cpu(read, build(unit, size), budget=max(2.0, 40 * base))
        if took > 20 * base + 0.02:
            again = _cpu(read, build(unit, size), reps=2, budget=max(2.0, 40 * base))  # not a hiccup
            if again > 20 * base + 0.02:
                slow.append(f"{reader} {name!r}: {again * 1e3:.0f} ms, baseline {base * 1e3:.1f} ms")
    return slow


@pytest.mark.timeout(300)
def test_every_control_costs_about_what_text_costs() -> None:
    # one input per control the readers handle, at 8 KiB: a per-control stall (a count looped a
    # step at a time, a line's width painted per control) shows there as hundreds of times the
    # baseline; the growth with size is checked below on the inputs that can grow
    units = bench.controls()
    slow = _sweep("line", units, 4 << 10) + _sweep("output", units, 2 << 10)
    assert not slow, "\n".join(slow)


@pytest.mark.timeout(300)
def test_random_pairs_of_controls_cost_about_what_text_costs() -> None:
    slow = _sweep("line", bench.pairs(41, 100), 8 << 10) + _sweep("output", bench.pairs(4141, 100), 4 << 10)
    assert not slow, "\n".join(slow)


# inputs that grow the reader's state with the line (columns, stops, ops, cells, extra text):
# where a cost per control could grow with what came before it
_GROWING = {
    "cht": "not done\x1b[99999999I",
    "cbt": "\x1b[99999999Z",
    "stops back and forth": "\x1bH\x1b[C\x1b[65000Z\x1b[65000I",
    "resets": "\x1bc\x1bH",
    "rep flood": "\x1b[65000b\x1b[1G",
    "rep then delete": "\x1b[65000b\x1b[1G\x1b[P",
    "insert": "\x1b[1G\x1b[@",
    "insert wide": "\x1b[1G\x1b[65535@",
    "delete": "ab\x1b[1G\x1b[P",
    "erase": "\x1b[1G\x1b[65535X",
    "erase line from": "\x1b[1G\x1b[K",
    "wide over": "\u4e2d\u3000\x1b[1G",
    "combining over": "e\u0301\u200b\x1b[1G",
    "concealed": "\x1b[8m\x1b[1G\x1b[65000b",
    "graphics": "\x1b(0qqq\x1b(B\x1b[1G",
    "saved cursor": "\x1b7ab\x1b8",
    "far right": "\x1b[65535C",
    "up": "\x1b[A",
    "up and erase below": "\x1b[A\x1b[J",
    "erase above": "\x1b[1J\n",
    "alt screen": "\x1b[?1049h\x1b[?1049l",
    "rlo": "\u202e",
    "spinner": "\r\x1b[K",
    "blanks after cr": "\r" + " " * 20,
    "brace": "{",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", ["line", "output"])
def test_growing_inputs_cost_linearly(reader: str) -> None:
    # 4x the bytes costs about 4x (6x allowed), and no input is far above the baseline (20x)
    read, build, _ = bench.READERS[reader]
    size = 32 << 10
    base = _cpu(read, build(bench.BASELINE, 4 * size), reps=3)
    bad = []
    for name, unit in _GROWING.items():
        small = _cpu(read, build(unit, size), reps=2)
        big = _cpu(read, build(unit, 4 * size), reps=2, budget=max(5.0, 40 * base))
        if big > 6 * small + 0.05 or big > 20 * base + 0.05:
            bad.append(f"{name}: {small * 1e3:.0f} ms, then {big * 1e3:.0f} ms (baseline {base * 1e3:.0f})")
    assert not bad, "\n".join(bad)


def test_the_bench_names_every_final_the_readers_act_on() -> None:
    # a CSI final byte drawn.py or screen.py learns to act on, without a row in the bench, is not
    # cost-checked
    root = Path(__file__).resolve().parent.parent / "vault" / "runner"
    acted: set[str] = set()
    for src in ("drawn.py", "screen.py"):
        for finals in re.findall(r'final (?:==|in) "([^"]+)"', (root / src).read_text()):
            acted |= set(finals)
    assert "b" in acted and "A" in acted
    acted -= set("78c")  # ESC 7, ESC 8, ESC c (the screen's escapes, in the bench as ESC sequences)
    assert acted <= set(bench.ACTED), acted - set(bench.ACTED)


def test_a_long_final_line_is_drawn_once_per_grading(monkeypatch: pytest.MonkeyPatch) -> None:
    # the grade, the claim checks (claims, step_claims, claimed_early) and the report each read an
    # agent's final message, and each reading drew its last line three times: a 4 MiB line of
    # NUL and text (a token a character) held one trial's grading 50 s on a loaded host
    from vault.runner import drawn

    calls: list[int] = []
    draw = drawn._drawn

    def counted(line: str) -> str:
        calls.append(len(line))
        return draw(line)

    monkeypatch.setattr(drawn, "_drawn", counted)
    line = "x" + "\x00y" * (1 << 19) + " not done"
    run = AgentRun(0, "agent", "agent", 1, 0.0, 0.0, 0, False, "starting\n" + line + "\n", "")
    for _ in range(4):
        assert claim_of(run.final) == "not_done"
        assert run.final[:300].startswith("x\x00y")
    assert len([n for n in calls if n > 1 << 20]) <= 1, calls
