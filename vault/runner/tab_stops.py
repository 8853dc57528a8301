"""Where a terminal's tab stops are on a line: a tab (HT, CSI I) moves the cursor to the next, a
back tab (CSI Z) to the one before, and neither draws over what it passes (`done ...` under tabs
still shows). Stops are every 8 columns until the output sets one (ESC H) or clears them (CSI g at
the cursor, CSI 3 g all). With none to the right the cursor goes to the line's end, which on a
terminal of unknown width is far to the right (`widest`)."""

from __future__ import annotations


class TabStops:
    def __init__(self) -> None:
        self.defaults = True  # every 8th column, less `removed`
        self.added: set[int] = set()
        self.removed: set[int] = set()

    def forward(self, col: int, n: int, widest: int) -> int:
        for _ in range(max(1, n)):
            nxt = [s for s in self.added if s > col]
            if self.defaults:
                c = (col // 8 + 1) * 8
                while c in self.removed and c < widest:
                    c += 8
                nxt.append(c)
            col = min(min(nxt, default=widest - 1), widest - 1)
        return col

    def back(self, col: int, n: int) -> int:
        for _ in range(max(1, n)):
            if col <= 0:
                return 0
            prev = [s for s in self.added if s < col]
            if self.defaults:
                c = (col - 1) // 8 * 8
                while c in self.removed and c > 0:
                    c -= 8
                prev.append(c)
            col = max(prev, default=0)
        return col

    def set(self, col: int) -> None:
        self.added.add(col)
        self.removed.discard(col)

    def clear(self, col: int | None) -> None:
        """CSI g: the stop at `col`; CSI 3 g (col None): every stop."""
        if col is None:
            self.defaults = False
            self.added.clear()
        else:
            self.added.discard(col)
            self.removed.add(col)
