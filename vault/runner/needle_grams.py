"""One pass for all of a large window's needles: which parts of it could hold one (vault.runner.needle_scan).

Why: the matcher's passes grow with the needles, about 67 a credential, and a trial beside others
scans for every open trial's credentials; an agent printing hundreds of MB (lines of one letter,
of base64) cost 50-70 ms of CPU per MiB per credential, scanned once as written and again
unwrapped (vault.runner.spread). Here the cost is one set lookup per four bytes, whatever the
needles.

Exact, never a guess: every 8 bytes of a needle, at every offset, are one `int` in `grams`. A
needle GRAM_LEAST or more long written anywhere in a window covers 8 bytes starting at a multiple
of 4 (the first such place is at most 3 in, and 3 + 8 <= GRAM_LEAST), and those 8 bytes are one of
its grams. So a part of the window none of whose 8 bytes at a multiple of 4 is a gram holds no
such needle; a part where one is (by chance, or a needle) is searched as before, widened by the
longest needle each side. Shorter needles are searched as before, whole.
"""

from __future__ import annotations

GRAM = 8  # bytes in a gram: an unsigned 64-bit int (memoryview.cast("Q"))
STEP = 4  # grams of a window are read at every multiple of this (two casts, 4 apart)
GRAM_LEAST = GRAM + STEP - 1  # a needle this long covers a window's gram wherever it is
PART = 1 << 16  # bytes of a window whose grams are looked up before its parts are searched


def grams(needles: list[bytes]) -> frozenset[int]:
    """Every GRAM bytes of each needle (GRAM_LEAST or longer), at every offset."""
    out: set[int] = set()
    for n in needles:
        view = memoryview(n)
        for off in range(GRAM):
            end = off + (len(n) - off) // GRAM * GRAM
            if end > off:
                out.update(view[off:end].cast("Q"))
    return frozenset(out)


def suspects(window: bytes, table: frozenset[int]) -> list[tuple[int, int]]:
    """The parts [start, end) of `window`, PART long, where a gram of `table` begins at a multiple
    of STEP: a needle GRAM_LEAST or longer written in the window covers one of them."""
    view, size, out = memoryview(window), len(window), []
    for start in range(0, size, PART):
        for off in (start, start + STEP):
            end = min(off + PART, size)
            end = off + (end - off) // GRAM * GRAM  # the last grams reach into the next part
            if end > off and not table.isdisjoint(view[off:end].cast("Q")):
                out.append((start, min(start + PART, size)))
                break
    return out


def grams_in(window: bytes, start: int, end: int, table: frozenset[int]) -> set[int]:
    """The grams of `table` that begin at a multiple of STEP in window[start:end] (a part `suspects` gave)."""
    view, out = memoryview(window), set[int]()
    for off in (start, start + STEP):
        stop = min(off + (end - start), len(window))
        stop = off + (stop - off) // GRAM * GRAM
        if stop > off:
            out |= table.intersection(view[off:stop].cast("Q"))
    return out
