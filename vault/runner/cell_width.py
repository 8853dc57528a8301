"""How many columns a character takes on a terminal, and a run of text placed cell by cell.

A wide character (East Asian Wide or Fullwidth: CJK, an ideographic space U+3000) takes two
columns, and a zero-width one (a combining mark, a format character such as a zero-width space)
none: it joins the cell before it, or, with none before it in its run, is drawn nowhere. A
reader counting one column a character puts a later cursor move elsewhere than a terminal does:
`not done: ...`, the cursor to column 1 and two ideographic spaces show `    done: ...`, and
`done: ...` with four zero-width spaces written over its start still shows `done`.

A run is placed as ops of vault.runner.drawn: (column, start, end) for text, (column, PAD, 1)
for a wide character's second cell (drawn as nothing), and (column, start, -end) for one cell
holding line[start:end] (a character with the marks on it).
"""

from __future__ import annotations

import re
import unicodedata
from array import array

PAD = -3  # the second cell of a wide character
_ODD = re.compile(r"[^\x20-\x7e\xa0-\u02ff]")  # anything else is one column: no need to look
MOST = 1 << 16  # characters of a line placed one by one; past it, one column each (a bounded cost)


def width(ch: str) -> int:
    if unicodedata.category(ch) in ("Mn", "Me", "Cf") or "\u1160" <= ch <= "\u11ff":
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def odd(text: str) -> bool:
    return _ODD.search(text) is not None


def place(ops: array[int], text: str, at: int, col: int, blank: int | None) -> int:
    """Ops for `text` (at index `at` of the line) drawn from column `col`; `blank` (the concealed
    marker) when it is drawn as blanks. The cursor's column after it."""
    run_at, run_col = -1, col
    base, base_col = -1, col  # the cell a zero-width character joins

    def flush(upto: int) -> None:
        if run_at >= 0:
            ops.extend((run_col, blank, upto - run_at) if blank is not None else (run_col, at + run_at, at + upto))

    for j, ch in enumerate(text):
        w = width(ch)
        if w == 1:
            if run_at < 0:
                run_at, run_col = j, col
            base, base_col = j, col
            col += 1
            continue
        flush(j)
        run_at = -1
        if w == 2:
            if blank is not None:
                ops.extend((col, blank, 2))
            else:
                ops.extend((col, at + j, at + j + 1, col + 1, PAD, 1))
            base, base_col = j, col
            col += 2
        elif base >= 0 and blank is None:
            ops.extend((base_col, at + base, -(at + j + 1)))
    flush(len(text))
    return col


def as_ops(cells: list[str], ops: array[int], at: int) -> str:
    """Ops drawing `cells` (one string a column: "" a wide character's second, several characters
    one with its marks) from column 0, their text to be found at index `at`: that text."""
    text = "".join(cells)
    run_at, run_col, i = -1, 0, at
    for c, cell in enumerate(cells):
        if len(cell) == 1:
            if run_at < 0:
                run_at, run_col = i, c
            i += 1
            continue
        if run_at >= 0:
            ops.extend((run_col, run_at, i))
            run_at = -1
        if cell == "":
            ops.extend((c, PAD, 1))
        else:
            ops.extend((c, i, -(i + len(cell))))
            i += len(cell)
    if run_at >= 0:
        ops.extend((run_col, run_at, i))
    return text

