"""The credentials of the trials that ran beside one (`-j N`, in this runner), for its leak scan.

Why: without a jail an agent can read another trial's agent's credential (/proc/PID/environ,
/proc/PID/cmdline as root) and print or keep it; each trial's scan looked for its own credentials
only, so that agent passed. A trial's own outputs and files (its agents' stdout and stderr,
command lines, state directory and private /tmp: places only its agents write to) are searched
for the credentials of every trial of this runner that was open while its agents ran too, and
such a find is named as the neighbour's credential (vault.runner.grade). The machine's shared
places are not: another trial's own leak lands there, and must not fail this one.

A trial's credentials are kept while it runs and, once it ends, while a trial that began before
its end is still open (that one may still find them); then forgotten.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Open:
    label: str
    secrets: Callable[[], dict[str, str]]  # read when asked: its world makes them as it starts
    began: float
    ended: float | None = None


_TRIALS: dict[str, _Open] = {}
_LOCK = threading.Lock()


def begin(key: str, label: str, secrets: Callable[[], dict[str, str]]) -> None:
    """Trial `key` (its root) runs; `secrets()` are its credentials (name -> value)."""
    with _LOCK:
        _TRIALS[key] = _Open(label, secrets, time.time())


def end(key: str) -> None:
    with _LOCK:
        if key in _TRIALS:
            _TRIALS[key].ended = time.time()
        first = min((t.began for t in _TRIALS.values() if t.ended is None), default=None)
        for k in [k for k, t in _TRIALS.items() if t.ended is not None and (first is None or t.ended < first)]:
            del _TRIALS[k]


def beside(key: str, since: float) -> dict[str, str]:
    """The credentials of the other trials open at any time since `since`, each named with its
    trial: "the <name> value of the concurrent trial <label>" reads as a finding."""
    with _LOCK:
        others = [t for k, t in _TRIALS.items() if k != key and (t.ended is None or t.ended >= since)]
        return {f"{name} (of the concurrent trial {t.label})": value
                for t in others for name, value in t.secrets().items() if value}
