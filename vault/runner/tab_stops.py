"""Where a terminal's tab stops are on a line: a tab (HT, CSI I) moves the cursor to the next, a
back tab (CSI Z) to the one before, and neither draws over what it passes (`done ...` under tabs
still shows). Stops are every 8 columns until the output sets one (ESC H) or clears them (CSI g at
the cursor, CSI 3 g all). With none to the right the cursor goes to the line's end, which on a
terminal of unknown width is far to the right (`widest`).

The cost is bounded by the line's width, not by a count the output gives: `CSI 99999999 I` is one
step of arithmetic, and with stops set or cleared a move finds the next one in a map of the
line's columns (a 23-byte line took a minute when each of n stops was a step of its own)."""

from __future__ import annotations

WIDEST = 1 << 16  # vault.runner.drawn's line width: no stop lies past it


class TabStops:
    def __init__(self) -> None:
        self._map: bytearray | None = None  # a 1 per column holding a stop; None: every 8th column

    def forward(self, col: int, n: int, widest: int) -> int:
        n, last = max(1, n), min(widest, WIDEST) - 1
        if self._map is None:
            return min((col // 8 + n) * 8, last)
        for _ in range(n):  # each step moves right or ends the loop: at most `widest` steps in all
            nxt = self._map.find(1, col + 1, last)
            if nxt < 0:
                return last
            col = nxt
        return col

    def back(self, col: int, n: int) -> int:
        n = max(1, n)
        if col <= 0:
            return 0
        if self._map is None:
            return max(((col - 1) // 8 - (n - 1)) * 8, 0)
        for _ in range(n):
            col = max(self._map.rfind(1, 0, min(col, WIDEST)), 0)
            if col == 0:
                break
        return col

    def set(self, col: int) -> None:
        if 0 <= col < WIDEST:
            self._stops()[col] = 1

    def clear(self, col: int | None) -> None:
        """CSI g: the stop at `col`; CSI 3 g (col None): every stop."""
        if col is None:
            self._map = bytearray(WIDEST)
        elif 0 <= col < WIDEST:
            self._stops()[col] = 0

    def _stops(self) -> bytearray:
        if self._map is None:
            self._map = bytearray(b"\x01" + b"\x00" * 7) * (WIDEST // 8)
        return self._map
