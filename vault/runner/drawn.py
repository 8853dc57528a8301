"""A final line as a terminal draws it: what a person reading the agent's output sees.

An agent's claim is its final line as shown (docs/agent-contract.md §7), so what a terminal draws
over is gone and what it does not draw is not there: `not\\b\\b\\bdone`, or `failed` and a cursor
moved back (CSI D, G, H), or back to a saved column (ESC 7 / ESC 8, CSI s / CSI u), then `done`,
show `done`, and so does `not done` with `not ` deleted or erased (CSI 4 P, CSI 3 X), or `doXXne`
with `XX` deleted (CSI 2 P: what stood right of them moves left), or a
`not done` line deleted (CSI M) below `done`; so do `do\\0ne` and `d\\x7fone` (a terminal draws no NUL, DEL or other control),
`\\x1b[8mnot\\x1b[0m done` (concealed text shows as blanks), and `done` after a device control,
privacy or application string (ESC P, X, ^, _ ... ST), a character set choice (`ESC ( B`) or a
reset (`ESC c`, which clears what came before). Colour and other sequences show nothing. A CSI
is also read in its 8-bit C1 form, U+009B (`\x9b6D` moves back 6 as `ESC [ 6 D` does), and so are
the strings (U+009D OSC, U+0090 DCS, U+0098, U+009E, U+009F ... U+009C ST or BEL: nothing drawn).
Text in DEC special graphics (`ESC ( 0`, or SO after `ESC ) 0`) is drawn as that set's line
pieces: `done` there shows `␍⎺┼␊`, no word. Tabs and back tabs move to tab stops (vault.runner.tab_stops)
without drawing, CSI ` and a go to a column, CSI b repeats the last character, CSI @ inserts blanks, a
selective erase (CSI ?K, ?J) erases as K and J, text in the colour it is drawn on shows as blanks
(vault.runner.sgr), and wide and zero-width characters take the columns a terminal gives them
(vault.runner.cell_width).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from array import array

from vault.runner import cell_width, sgr
from vault.runner.csi_param import number
from vault.runner.tab_stops import TabStops

# what a terminal draws nothing for: C0 and C1 controls other than the backspace, the tab and ESC
_CONTROLS = "\x00-\x07\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f"
_PLAIN = re.compile("[\x08\x1b" + _CONTROLS + "]")
_TOKEN = re.compile(
    r"(?:\x1b\[|\x9b)([0-?]*)[ -/]*([@-~])"  # CSI (ESC [, or C1's 8-bit U+009B): params, final byte
    # OSC, DCS, SOS, PM, APC (ESC ], P, X, ^, _, or their 8-bit C1 forms) ... BEL or ST: no text
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b([ -/]*)([0-~])?"                  # any other escape: ESC 7, ESC 8, ESC c, ESC ( B
    r"|\x08|\t|[\x0e\x0f]|\x88"                 # backspace; tab; shift out / in (G1 / G0); C1 HTS
    # other controls, drawn as nothing (a run stops where a C1 CSI, HTS or string opens)
    r"|[\x00-\x07\x0b\x0c\x10-\x1a\x1c-\x1f\x7f-\x87\x89-\x8f\x91-\x97\x99\x9a\x9c]+|\x9b"
    r"|[^\x08\t\x1b" + _CONTROLS + r"]+", re.S)
# DEC special graphics (ESC ( 0, or SO after ESC ) 0): what `_` to `~` are drawn as. Lower-case
# letters are line-drawing pieces there, so `done` written in it shows `␍⎺┼␊`, no word
_GRAPHICS = str.maketrans(dict(zip(
    "_`abcdefghijklmnopqrstuvwxyz{|}~",
    " \u25c6\u2592\u2409\u240c\u240d\u240a\u00b0\u00b1\u2424\u240b\u2518\u2510\u250c\u2514\u253c"
    "\u23ba\u23bb\u2500\u23bc\u23bd\u251c\u2524\u2534\u252c\u2502\u2264\u2265\u03c0\u2260\u00a3\u00b7")))

_WIDEST = 1 << 16  # a cursor moved further right draws nothing a person reads sooner (and costs no memory)
_LEFT, _RIGHT = 1, 0  # which side of the cursor an erase in line (CSI 1 K, CSI K) clears
_BLANK = -2  # a run of concealed text: drawn as blanks
_ERASE_BUDGET = 1 << 20  # cells a line's partial erases (CSI P, CSI X) may blank one by one
# characters a line's partial deletes (CSI P) may redraw, shifted left as a terminal does: each
# costs the line so far (one paint); past this, a delete is drawn as blanks in place
_SHIFT_BUDGET = 1 << 22
# a right-to-left override draws what follows it reversed, up to a pop (PDF) or the line's end
_RLO = re.compile("\u202e([^\u202c]*)\u202c?")


def as_shown(line: str) -> str:
    """The line as a terminal shows it (see the module's doc); a span after a right-to-left
    override reversed (`\u202eenod` is drawn `done`, as a log in a browser shows it)."""
    # a long line is drawn once: the final message is asked for by the reading of the output's
    # lines, the final line's own check and each claim read of it (seconds each for 4 MiB)
    return _long_shown(line) if len(line) >= _REMEMBERED else _shown(line)


_REMEMBERED = 1 << 16


@functools.lru_cache(maxsize=2)
def _long_shown(line: str) -> str:
    return _shown(line)


def _shown(line: str) -> str:
    drawn = _drawn(line) if _PLAIN.search(line) else line
    return _RLO.sub(lambda m: m.group(1)[::-1], drawn) if "\u202e" in drawn else drawn


def _drawn(line: str) -> str:
    # first where each run of text and each erase lands, then backwards from the last: a cell
    # shows the last character written to it that no later erase covers. Each character of the
    # line is looked at once, so the cost is the line's length however far or often the cursor
    # moves or the line is erased (drawing cell by cell cost a line's width per erase: minutes)
    ops, widest, _, line = _layout(line)
    return _paint(ops, widest, line)


def end_column(text: str, col: int) -> int:
    """Where the cursor is after `text` is drawn on a line from column `col` (vault.runner.screen)."""
    return _layout(text, col)[2] if _PLAIN.search(text) else col + len(text)


def _layout(line: str, col: int = 0) -> tuple[array[int], int, int, str]:
    """Where each run of text and each erase of `line` lands (drawn from column `col`): the
    steps, the widest column written, the cursor's last column, and the text the steps index."""
    ops = array("q")  # per step: column, then the text's start and end in `line`, or -1 and an erase
    widest = saved = erased = shifts = repeated = placed = 0
    pen, hidden = sgr.Pen(), False
    tabs = TabStops()
    last = ""  # the last character drawn, which REP (CSI b) repeats
    # the G0 and G1 character sets ("0": DEC special graphics) and which one is in use (SO: G1);
    # text drawn in graphics is kept translated after `line` (`extra`), its ops pointing there
    charset, shifted = ["B", "B"], 0
    extra: list[str] = []
    extra_at = len(line)
    for m in _TOKEN.finditer(line):
        tok = m.group(0)
        if tok == "\x08":
            col = max(0, col - 1)
        elif tok == "\t":  # to the next tab stop, drawing nothing over what it passes
            col = tabs.forward(col, 1, _WIDEST)
        elif tok in ("\x0e", "\x0f"):
            shifted = 1 if tok == "\x0e" else 0
        elif tok == "\x88":  # HTS in its 8-bit C1 form, as ESC H: a tab stop at the cursor
            tabs.set(col)
        elif m.group(2) is not None:
            params = m.group(1)
            if params.startswith("?") and m.group(2) in "KJ":
                params = params[1:]  # a selective erase (DECSEL, DECSED) erases all that was not protected
            args = params.split(";")
            n = number(args[0]) if args[0].isdigit() else None
            final = m.group(2)
            if final == "D":
                col = max(0, col - (n or 1))
            elif final == "C":
                col = min(col + (n or 1), _WIDEST)
            elif final == "a":  # HPR: as CSI C
                col = min(col + (n or 1), _WIDEST)
            elif final in "G`":  # CHA, HPA: to a column
                col = min(max(0, (n or 1) - 1), _WIDEST)
            elif final == "I":  # CHT: n tab stops forward
                col = tabs.forward(col, n or 1, _WIDEST)
            elif final == "Z":  # CBT: n tab stops back
                col = tabs.back(col, n or 1)
            elif final == "g":  # TBC: the stop at the cursor cleared, or (3) all
                tabs.clear(None if n == 3 else col)
            elif final == "b" and last:  # REP: the last character drawn again, n times
                span = min(n or 1, _WIDEST - col)
                if repeated + span > _ERASE_BUDGET:
                    # past a budget of cells, as CSI K from the cursor (as CSI P and X): blanks
                    # painted one by one cost a line's width for each 6 bytes of a flood
                    ops.extend((col, -1, _RIGHT))
                elif hidden:
                    ops.extend((col, _BLANK, span))
                else:
                    extra.append(last * span)
                    ops.extend((col, extra_at, extra_at + span))
                    extra_at += span
                repeated += span
                col += span
                widest = max(widest, col)
            elif final == "@":
                # ICH: n blanks inserted at the cursor, what stood from it on moved right (`one`,
                # a blank inserted before it and `d` written there, shows `done`); as CSI P's
                # shift, within its budget, else what is right of the cursor is read as erased
                span = min(n or 1, _WIDEST)
                if col >= widest:
                    pass
                elif shifts + extra_at + widest <= _SHIFT_BUDGET:
                    shifts += extra_at + widest
                    cells = _cells(ops, widest, line + "".join(extra))
                    extra_at, widest = _redrawn(cells[:col] + [" "] * span + cells[col:], ops, extra, extra_at)
                else:
                    ops.extend((col, -1, _RIGHT))
            elif final in "Hf":  # row;column: the column (another row is drawn over as this one)
                c = number(args[1]) if len(args) > 1 and args[1].isdigit() else 1
                col = min(max(0, c - 1), _WIDEST)
            elif (final == "K" and n == 2) or (final == "J" and n in (2, 3)):
                del ops[:]  # the whole line (or screen) erased: nothing before shows
            elif final in "KJ":  # the cursor stays; 1 erases up to and with it, else from it on
                ops.extend((col, -1, _LEFT if n == 1 else _RIGHT))
            elif final == "M":  # the cursor's line deleted (DL): nothing before shows
                del ops[:]
            elif final in "PX":
                # characters deleted (DCH) or erased (ECH) from the cursor on, the cursor staying:
                # up to the line's end, as CSI K. Fewer erased: blanks over them. Fewer deleted:
                # what stood right of them moves left (`doXXne` with its XX deleted shows `done`),
                # so the line so far is painted and starts again as one run, while a budget lasts
                # (then blanks in place); past a budget of cells, as CSI K (a flood of them costs
                # the line's length, not its width each)
                span = n or 1
                if col + span >= widest or erased + span > _ERASE_BUDGET:
                    ops.extend((col, -1, _RIGHT))
                elif final == "P" and shifts + extra_at + widest <= _SHIFT_BUDGET:
                    shifts += extra_at + widest
                    cells = _cells(ops, widest, line + "".join(extra))
                    extra_at, widest = _redrawn(cells[:col] + cells[col + span:], ops, extra, extra_at)
                else:
                    ops.extend((col, _BLANK, span))
                    erased += span
            elif final == "s":
                saved = col
            elif final == "u":
                col = saved
            elif final == "m":
                pen = sgr.after(m.group(1), pen)
                hidden = pen.hidden
        elif tok.startswith("\x1b"):
            esc = m.group(4) if not m.group(3) else None
            if m.group(3) in ("(", ")") and m.group(4):  # a character set for G0 / G1
                charset[0 if m.group(3) == "(" else 1] = m.group(4)
            elif esc == "7":
                saved = col
            elif esc == "8":
                col = saved
            elif esc == "H":  # HTS: a tab stop at the cursor
                tabs.set(col)
            elif esc == "c":  # a full reset: the screen cleared, the cursor home
                del ops[:]
                col = saved = 0
                pen, hidden, last = sgr.Pen(), False, ""
                tabs.reset()
                charset, shifted = ["B", "B"], 0
        elif tok[0] in _CONTROL_SET:
            continue  # drawn as nothing
        elif charset[shifted] == "0" and not hidden:
            extra.append(tok.translate(_GRAPHICS))
            last = extra[-1][-1]
            ops.extend((col, extra_at, extra_at + len(tok)))
            extra_at += len(tok)
            col += len(tok)
            widest = max(widest, col)
        else:
            last = tok[-1]
            if cell_width.odd(tok) and placed + len(tok) <= cell_width.MOST:
                # wide and zero-width characters: placed by the columns a terminal gives them
                placed += len(tok)
                col = min(cell_width.place(ops, tok, m.start(), col, _BLANK if hidden else None), _WIDEST)
            else:
                ops.extend((col, _BLANK, len(tok)) if hidden else (col, m.start(), m.end()))
                col += len(tok)
            widest = max(widest, col)
    if extra:
        line += "".join(extra)
    return ops, widest, col, line


def _redrawn(cells: list[str], ops: array[int], extra: list[str], extra_at: int) -> tuple[int, int]:
    """The line so far replaced by `cells` (after a delete or an insert shifted it): where the
    next extra text goes, and the line's width."""
    del ops[:]
    extra.append(cell_width.as_ops(cells, ops, extra_at))
    return extra_at + len(extra[-1]), len(cells)


def _paint(ops: array[int], widest: int, line: str) -> str:
    if widest > _SPARSE_FROM and widest > 4 * _most_painted(ops):
        return _sparse(ops, widest, line)
    return "".join(_cells(ops, widest, line))


# a line this wide, at most a quarter of it drawn (a cursor moved far right: `ESC[65535C`), is
# painted by the cells drawn and the runs of blanks between them: a cell a column, 65,536 for
# 6 bytes, made a MiB of such lines cost the grader minutes
_SPARSE_FROM = 4096


def _most_painted(ops: array[int]) -> int:
    """How many cells `ops` can paint at most."""
    most = 0
    for i in range(0, len(ops), 3):
        start, end = ops[i + 1], ops[i + 2]
        most += 0 if start == -1 else end if start == _BLANK else 1 if start == cell_width.PAD or end < 0 else end - start
    return most


def _sparse(ops: array[int], widest: int, line: str) -> str:
    """_cells joined, for a line mostly never drawn: the same cells, kept by column."""
    shown: dict[int, str] = {}
    right, left = widest, -1
    for i in range(len(ops) - 3, -1, -3):
        at, start, end = ops[i], ops[i + 1], ops[i + 2]
        if start == -1:
            right, left = (min(right, at), left) if end == _RIGHT else (right, max(left, at))
            continue
        if start == _BLANK:
            for c in range(max(at, left + 1), min(at + end, right)):
                shown.setdefault(c, " ")
            continue
        if start == cell_width.PAD or end < 0:
            if left < at < right and at < widest and at not in shown:
                shown[at] = "" if start == cell_width.PAD else line[start:-end]
            continue
        for c in range(max(at, left + 1), min(at + end - start, right)):
            shown.setdefault(c, line[start + c - at])
    out, upto = [], 0
    for c in sorted(shown):
        out.append(" " * (c - upto))
        out.append(shown[c])
        upto = c + 1
    out.append(" " * (widest - upto))
    return "".join(out)


def _cells(ops: array[int], widest: int, line: str) -> list[str]:
    """What each column shows: one character, "" (a wide character's second column), or a
    character with the marks drawn on it."""
    shown: list[str | None] = [None] * widest
    right, left = widest, -1  # what the later erases cover: columns from `right` on, up to `left`
    for i in range(len(ops) - 3, -1, -3):  # (indexed: slices would copy a 4 MiB line's steps)
        at, start, end = ops[i], ops[i + 1], ops[i + 2]
        if start == -1:
            right, left = (min(right, at), left) if end == _RIGHT else (right, max(left, at))
            continue
        if start == _BLANK:  # concealed: blanks over whatever was drawn there before
            for c in range(max(at, left + 1), min(at + end, right)):
                if shown[c] is None:
                    shown[c] = " "
            continue
        if start == cell_width.PAD or end < 0:  # one cell: a wide character's second, or a cluster
            if left < at < right and at < widest and shown[at] is None:
                shown[at] = "" if start == cell_width.PAD else line[start:-end]
            continue
        for c in range(max(at, left + 1), min(at + end - start, right)):
            if shown[c] is None:
                shown[c] = line[start + c - at]
    return [" " if ch is None else ch for ch in shown]


_CONTROL_SET = frozenset(chr(c) for c in (*range(0x00, 0x08), 0x0b, 0x0c, *range(0x0e, 0x1b),
                                          *range(0x1c, 0x20), *range(0x7f, 0xa0)))


def other_readings(text: str) -> list[str]:
    """What else a person may read in `text` as drawn: its letters without the accents and other
    combining marks drawn on them (`d\\u0301one` and `dône` read as done)."""
    # (an overlay, U+0336 and its kind, strikes a letter out: `d\u0336o\u0336n\u0336e\u0336` is no done)
    bare = "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn" or unicodedata.combining(c) == 1)
    return [bare] if bare != text else []
