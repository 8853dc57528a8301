"""A final record Rich's log handler wrote in the same second as the record above it (contract §7).

RichHandler draws a record's time in a column of its own and, by default (`omit_repeated_times`),
leaves that column blank when the time is the one shown above: `[21:00:00] INFO     create_issue:
success` then `           INFO     done: 3 steps`. A person reads the second as a record of that
time, and the contract reads Rich's prefix as the logger's, not the message's; read alone, its level
would open the message (a level alone is the message's own word). Only that layout: the blanks as
wide as the bracketed time of the nearest record above, each line between them blank there too (the
same second's records, a wrapped record's continuation), and a level after them as after that time.
"""

from __future__ import annotations

import re

from vault.runner.drawn import as_shown
from vault.text import without_escapes

# Python's level names, as Rich pads them to 8 columns after the time column and one blank
_LEVEL = r"(?:NOTSET|DEBUG|INFO|WARNING|ERROR|CRITICAL)"
_TIMED = re.compile(rf"(\[[^\[\]]{{1,40}}\]) {_LEVEL}\s")
_OMITTED = re.compile(rf"( +) {_LEVEL}\s")
# lines looked at above the last: the records of one second, wrapped ones' continuations included
_LOOK_BACK = 256


def _shown(line: str) -> str:
    return without_escapes(as_shown(line))


def with_time_above(lines: list[str]) -> str | None:
    """The last of `lines` (as written, each showing something) as shown, its blank time column
    filled with the time of the Rich record above it, when it is such a record; else None."""
    if not lines:
        return None
    last = _shown(lines[-1])
    omitted = _OMITTED.match(last)
    if omitted is None:
        return None
    width = len(omitted.group(1))
    for line in reversed(lines[-_LOOK_BACK - 1:-1]):
        shown = _shown(line)
        if not shown[:width + 1].strip():
            continue  # a record of the same second, or a wrapped one's continuation
        timed = _TIMED.match(shown)
        if timed is None or len(timed.group(1)) != width:
            return None
        return timed.group(1) + last[width:]
    return None
