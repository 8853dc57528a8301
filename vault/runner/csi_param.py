"""A control sequence's number (a count, a column, a colour) read at a bounded cost.

An agent writes the digits, as many as it likes: `int()` refuses a string of more than 4300 digits
(CPython's limit on integer conversion), so `ESC [` and 5000 nines raised out of the grader. Up to
MOST digits (after leading zeros) a number reads as itself, as before (about 60 µs for the
longest); a longer one reads as 10**MOST, larger than any shorter one, which every reader bounds
anyway (vault.runner.drawn's line width, vault.runner.screen's farthest move).
"""

from __future__ import annotations

MOST = 4000
_HUGE: int = 10 ** MOST


def number(digits: str) -> int:
    """The value of `digits` (ASCII digits, as a CSI parameter holds them)."""
    digits = digits.lstrip("0")
    if len(digits) > MOST:
        return _HUGE
    return int(digits) if digits else 0
