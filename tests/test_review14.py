"""Review of the fourteenth pass's product diff: each test failed before its fix.

* a final line read as a terminal draws it (vault.runner.claims._as_shown) drew cell by cell: an
  erase (CSI 1K, 2K, K) cost the line's width each time, and a cursor sent far right then a
  character cost that width again. A line of ~400 KB of such codes took 15 s of grading CPU (a
  4 MiB one minutes, for each of the several times a final line is read). Now each character of
  the line is looked at once, backwards from the last write.
* a final line past 4 MiB is now searched back to its start, a MiB at a time, through however
  many gigabytes of one line an agent wrote; that read ran on the runner's event loop
  (output_tail in Trial's agent run), stalling every other trial's remote. Now in a thread.
"""

from __future__ import annotations

import random
import time


def _drawn_cell_by_cell(line: str) -> str:
    """The terminal model, drawn the plain (slow) way: what drawn.as_shown must agree with."""
    import re
    cells: list[str] = []
    col = 0
    # (an escape other than CSI and OSC takes its intermediates and final byte with it, as a
    # terminal does: `ESC a` draws nothing; vault.runner.drawn)
    for m in re.finditer(r"\x1b\[([0-?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x08|[^\x08\x1b]+"
                         r"|\x1b[ -/]*[0-~]?",
                         line, re.S):
        tok = m.group(0)
        if tok == "\x08":
            col = max(0, col - 1)
        elif m.group(2) is not None:
            arg = m.group(1).split(";")[0]
            n = int(arg) if arg.isdigit() else None
            final = m.group(2)
            if final == "D":
                col = max(0, col - (n or 1))
            elif final == "C":
                col = min(col + (n or 1), 1 << 16)
            elif final == "G":
                col = min(max(0, (n or 1) - 1), 1 << 16)
            elif final == "K":
                if n == 2:
                    cells = [" "] * len(cells)
                elif n == 1:
                    cells[:col + 1] = [" "] * min(col + 1, len(cells))
                else:
                    del cells[col:]
        elif not tok.startswith("\x1b"):
            for ch in tok:
                if col >= len(cells):
                    cells.extend(" " * (col - len(cells) + 1))
                cells[col] = ch
                col += 1
    return "".join(cells)


def test_a_line_is_drawn_as_a_terminal_draws_it() -> None:
    from vault.runner.drawn import _PLAIN as _MOVES
    from vault.runner.drawn import as_shown as _as_shown
    parts = ["a", "b", "done", " ", "é", "\x08", "\x1b[D", "\x1b[3D", "\x1b[C", "\x1b[5C", "\x1b[G", "\x1b[4G",
             "\x1b[K", "\x1b[0K", "\x1b[1K", "\x1b[2K", "\x1b[3K", "\x1b[31m", "\x1b]0;t\x07", "\x1b",
             "\x1b[70000C", "\x1b[;2D"]
    rng = random.Random(14)
    for _ in range(20000):
        line = "".join(rng.choice(parts) for _ in range(rng.randint(1, 12)))
        if not _MOVES.search(line):
            continue  # nothing moves: read without its escapes, not drawn
        assert _as_shown(line).rstrip(" ") == _drawn_cell_by_cell(line).rstrip(" "), repr(line)


def test_erasing_a_wide_line_over_and_over_costs_the_lines_length() -> None:
    from vault.runner.claims import claim_of
    lines = ["\x1b[65536Cx" + "\x1b[1K" * 100_000 + "\x1b[1Gdone",
             "\x1b[65536Cx" + "\x1b[2K" * 100_000 + "\x1b[1Gdone",
             "\x1b[65536Cx\x1b[1G\x1b[K" * 20_000 + "done"]
    for line in lines:
        cpu = time.process_time()
        assert claim_of(line) == "done"
        # drawn cell by cell each took 3-15 s of CPU; a line's length costs well under one
        assert time.process_time() - cpu < 3, repr(line[:20])


def test_an_agents_output_is_read_off_the_event_loop(vaultsim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a final line past 4 MiB is now searched back to its start (vault.runner.trial._last_line):
    # gigabytes of one line read on the runner's loop stalled every other trial's remote
    import asyncio
    import sys

    from vault.runner import trial
    on_loop: list[str] = []
    real = trial.output_tail

    def spy(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            asyncio.get_running_loop()
            on_loop.append(str(path))
        except RuntimeError:
            pass
        return real(path, *args, **kwargs)

    monkeypatch.setattr(trial, "output_tail", spy)
    run = vaultsim.run_agent([sys.executable, "-c", "print('not done: nothing to do')"],
                             task={"goal": "nothing", "operations": []}, isolation="none")
    assert run.final == "not done: nothing to do"
    assert on_loop == []
