"""Whose is a session that no agent's process, group or session opened?

A process an agent leaves behind (double fork, `setsid`: out of its group and session, its
parent gone) opens sessions that no agent's pid, group or session names, and it may still call
while the next agent runs (the runner ends it within a grace after its agent's exit). Judged by
when its calls came, it was the next agent's: a careful agent was failed for its predecessor's
act (an issue no step of its task names, a session under another agent's name), and the guilty
one went unnamed. The daemon records the opener's ancestry (`session_opened`'s `lineage`,
vault.lineage): the oldest of its ancestors born during the trial started its detached branch,
and the agent that started last before that birth left it. Without a recorded ancestry, a call
between one agent's end and the next one's start (or after the last) is the latest agent's to
start before it; one inside an agent's time stays that agent's (vault.runner.transcript).
"""

from __future__ import annotations

import time
from typing import Any

from vault import lineage

# an answer recorded this close to an agent's start or end is inside its time (clock reads)
SLACK_S = 0.05


def born_of(chain: Any, starts: list[float]) -> int | None:
    """The agent whose time a session opener's detached branch began in, from its recorded
    ancestry (`chain`, (pid, start on the boot clock), nearest first) and the agents' start times
    (`starts`, epoch seconds); None when it cannot be told (no ancestry, or born before them)."""
    if not chain or not starts:
        return None
    offset = time.time() - lineage.boot_clock()  # epoch = boot clock + offset
    first = min(starts) - SLACK_S
    born = [float(t) + offset for _, t in chain if isinstance(t, (int, float)) and float(t) + offset >= first]
    if not born:
        return None
    branch = min(born)  # its oldest ancestor born in the trial began the branch
    before = [i for i, start in enumerate(starts) if start - SLACK_S <= branch]
    return max(before, key=lambda i: starts[i]) if before else None


def left_by(windows: list[tuple[float, float]], at: float) -> int | None:
    """The index of the agent that left the process calling at `at`, or None: before the first
    agent started, or inside some agent's time (that one's own, by the window rule)."""
    if any(start - SLACK_S <= at <= end + SLACK_S for start, end in windows):
        return None
    before = [i for i, (start, _) in enumerate(windows) if start <= at]
    return max(before, key=lambda i: windows[i][0]) if before else None
