"""A catalog `pattern` matched against an agent's value within a time budget, in the daemon.

Why: a catalog's own regex can backtrack without end on a value made for it (`(a+)+` and forty
`a`s then `!`), and the daemon checks every call's parameters on its one event loop: one such
call held every client, status included. Python's regex engine checks for signals as it
matches, so an interval timer whose handler raises stops the match; the value is then refused
as too slow to check (fail closed), and the daemon serves on.

Only where `bound(seconds)` was called (the daemon's process) and only on the main thread (where
Python runs signal handlers); elsewhere, and with no budget, a plain match. The SIGALRM handler
and interval timer found before are put back after each match, the timer less the time spent.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from typing import Any

BUDGET_S = 0.05  # the daemon's: a pattern that is not pathological matches 4,096 characters in well under 1 ms
_budget: float | None = None
_armed = False


class _TooSlow(Exception):
    pass


def bound(seconds: float | None) -> None:
    """Match catalog patterns in this process within `seconds` each (None: no bound)."""
    global _budget
    _budget = seconds


def _expired(signum: int, frame: Any) -> None:
    if _armed:  # a late tick after the match ended is nothing
        raise _TooSlow


def fullmatch(pattern: re.Pattern[str], value: str) -> bool | None:
    """Does `value` match `pattern` whole? None: not known within the budget."""
    global _armed
    if _budget is None or threading.current_thread() is not threading.main_thread():
        return pattern.fullmatch(value) is not None
    before = signal.signal(signal.SIGALRM, _expired)
    started = time.monotonic()
    delay, interval = 0.0, 0.0
    try:
        _armed = True
        delay, interval = signal.setitimer(signal.ITIMER_REAL, _budget)
        found = pattern.fullmatch(value) is not None
        _armed = False
        return found
    except _TooSlow:
        return None
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if delay > 0:  # a timer someone else set goes on, less the time spent here
            signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - started), 1e-6), interval)
