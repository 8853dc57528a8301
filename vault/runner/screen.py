"""An agent's output as the lines a terminal finally shows, when it redraws lines above.

The final message is the last line that shows something (docs/agent-contract.md §7). A line ends
at `\\n`, `\\r\\n` or `\\r` (but a `\\r` that clears its line: _CLEARS), and at a move down
to the next line (ESC E, CSI E and B, ESC D: _DOWN), and each line is drawn on its
own (vault.runner.drawn). But output that
moves the cursor up to an earlier line (CSI `A` or `F`, a reverse index ESC `M`, a cursor restored
to a line above) is a display redrawn in place, a progress view or a status board, and what it
leaves is what the terminal shows: a line drawn over or erased up there is gone, and the last
line that still shows is the message. So when the output does that, it is laid out as a screen:
`\\n` starts the next line, `\\r` goes back to the start of the same one, CSI `B`/`E`/ESC `D`/`E`
move down, CSI `J` and ESC `c` erase other lines too, and each line holds what was written to it,
each piece placed at the column the cursor was on. The cost is linear in the output.
"""

from __future__ import annotations

import re

from vault.runner.csi_param import number
from vault.runner.drawn import end_column

# what a line break is without a redraw (the contract's lines)
_EOL = re.compile(r"\r\n|\r|\n")
# a move to a line above: what makes the output a redrawn display
_UP = re.compile(r"(?:\x1b\[|\x9b)[0-9]*[AF]|\x1bM|\x1b8|(?:\x1b\[|\x9b)u")
# what moves the cursor to another line, or erases other lines, or saves its line
_MOVE = re.compile(r"\r\n|\n|\r|(?:\x1b\[|\x9b)([0-9]*)([ABEFJsu])|\x1b([MDE78c])")
_NL = re.compile(r"(\n)")  # a line end a `\r` cannot go back over (kept, so the text joins back whole)
_FARTHEST = 1 << 16  # a move further than this many lines at once goes no further


# a `\r` that goes back over its line to clear it: an erase of the line (CSI K, 0K, 2K, after any
# colour or mode switches such as a cursor shown again) or blanks up to the line's end, as a spinner or a
# progress bar clears itself (yaspin, halo: `\r` CSI K; tqdm: `\r`, blanks, `\r`)
# (or a delete of the line, CSI M, or of its characters, CSI P and CSI X, which clear it when they
# reach its end: vault.runner.drawn)
_CLEARS = re.compile(r"\r(?=(?:(?:\x1b\[|\x9b)[?0-9;]*[hlm])*(?:(?:\x1b\[|\x9b)(?:[02]?K|[0-9]*[MPX])|[ \u2800]+(?:\r|\n|$)))")


def _rewound(text: str) -> str:
    """`text` with each `\r` up to a line's last clearing one (_CLEARS) read as a move to the line's
    first column, not a line end: what a spinner drew there and then cleared is gone, as on a
    terminal (its frames, each drawn over the last, and the blanks that end them are one line)."""
    if "\r" not in text:
        return text
    out = []
    for line in _NL.split(text):
        last = None
        for last in _CLEARS.finditer(line):
            pass
        out.append(line if last is None else
                   line[:last.start() + 1].replace("\r", "\x1b[1G") + line[last.start() + 1:])
    return "".join(out)


# a move down to a line below (CSI B, CSI E, ESC D, ESC E): without a redraw, a line end. (Not a
# vertical tab, form feed or C1 NEL, which text from a remote or a model can hold: §7's lines end
# at `\n`, `\r\n` and `\r` only, pinned by test_redteam_careful12)
_DOWN = re.compile(r"(?:\x1b\[|\x9b)[0-9]*[BE]|\x1b[DE]")


def _split(text: str) -> list[str]:
    """`text` split at its line ends, a move down to the next line one too (`not done ESC E
    done` shows `done` on a line of its own)."""
    return _EOL.split(_rewound(_DOWN.sub("\n", text)))


def screen_lines(text: str) -> list[str]:
    """`text` as lines: split at its line ends, or, when it moves the cursor to a line above,
    the lines of the screen it draws, top to bottom, each as the pieces written to it."""
    if _UP.search(text) is None:
        return _split(text)
    # per line, its pieces, each with when it was written (its place in the output)
    rows: dict[int, list[tuple[int, str]]] = {0: []}
    ends: dict[int, tuple[int, int]] = {}  # per line, the column its last piece left the cursor on, and when
    # CSI J: (when, line) erasing the lines below (0) or above (1) the cursor's; applied at the end,
    # so that a flood of them costs no pass over every line each
    erased: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
    last_erase = -1
    row = col = 0
    went_up = False  # a cursor restored on its own line (a spinner's ESC 7 / ESC 8) redraws none above
    saved = (0, 0)
    at = 0
    for when, m in enumerate(_MOVE.finditer(text)):
        piece = text[at:m.start()]
        at = m.end()
        if piece:
            # each piece at its column (CSI G, where the line's last piece did not leave it), so a
            # line's pieces draw as the terminal drew them
            left = ends.get(row, (0, when))
            fits = left[0] == col and left[1] > last_erase
            rows.setdefault(row, []).append((when, piece if fits else f"\x1b[{col + 1}G{piece}"))
            col = end_column(piece, col)
            ends[row] = (col, when)
        tok, final = m.group(0), m.group(2) or m.group(3)
        n = min(number(m.group(1)), _FARTHEST) if m.group(1) else 1
        n = n or 1  # a count of 0 moves one line, as 1 does
        if tok in ("\n", "\r\n"):
            row, col = row + 1, 0
        elif tok == "\r":
            col = 0
        elif final == "A" or final == "M":
            row, went_up = max(0, row - (n if final == "A" else 1)), True
        elif final == "F":
            row, col, went_up = max(0, row - n), 0, True
        elif final == "B" or final == "D":
            row += n if final == "B" else 1
        elif final == "E":
            row, col = row + n, 0
        elif final in ("7", "s"):
            saved = (row, col)
        elif final in ("8", "u"):
            went_up = went_up or saved[0] < row
            row, col = saved
        elif final == "c":  # a full reset: the screen cleared, the cursor home
            rows, ends, row, col, saved = {0: []}, {}, 0, 0, (0, 0)
            erased = ([], [])
        elif final == "J":
            how = m.group(1) or "0"
            if how in ("2", "3"):
                rows, ends, erased = {row: []}, {}, ([], [])  # the screen erased; the cursor stays
            else:
                # below (0) or above (1) the cursor's line, and that line from or up to it
                erased[how == "1"].append((when, row))
                last_erase = when
                rows.setdefault(row, []).append((when, f"\x1b[{col + 1}G\x1b[{'1' if how == '1' else ''}K"))
                ends[row] = (col, when)
        rows.setdefault(row, [])
    if not went_up:
        return _split(text)
    if at < len(text):
        left = ends.get(row, (0, len(text)))
        fits = left[0] == col and left[1] > last_erase
        rows.setdefault(row, []).append((len(text), text[at:] if fits else f"\x1b[{col + 1}G{text[at:]}"))
    order = sorted(rows)
    # per line, the last erase that covers it: the latest CSI J below a line above it, or above a
    # line below it (running maxima over the lines in order, and in reverse)
    cover = dict.fromkeys(order, -1)
    for events, lines in ((erased[0], order), (erased[1], order[::-1])):
        events.sort(key=lambda e: e[1], reverse=events is erased[1])
        latest, i = -1, 0
        for r in lines:
            while i < len(events) and (events[i][1] < r if events is erased[0] else events[i][1] > r):
                latest = max(latest, events[i][0])
                i += 1
            cover[r] = max(cover[r], latest)
    return ["".join(p for when, p in rows[r] if when >= cover[r]) for r in order]
