"""Which processes are held to what a process of an agent was told.

An answer binds the process it reached (by pid); a process that one starts after it was told, and
any process below that one, acts on what it was told: a new child handed the later steps is the
told process going on. A process started before the answer (a pool's other worker, a helper
already at work on another step) read none of it and is not held. Told apart by the ancestry the
daemon recorded when each session opened (`session_opened`'s `lineage`: (pid, start on the boot
clock), nearest first: vault.lineage); a session without one is held by its own pid only.

A start time is the kernel's, in clock ticks rounded down: a process whose recorded start is less
than a tick before the telling may have started after it (a child started on reading the answer
mostly reads so), and is held. One started in the last tick before the answer is held too: a
pool's worker forked while the call was in flight, that close to its answer (said in the README),
except where the answer's record lists the told process's children when it was given (a `never`
or `outcome_unknown` answer's does, and a lookup's `unknown`, not a paced one:
vault.audit_events.Classification): a branch begun by one of them began before (older logs list
none: a worker started in the tick is still held). A careful process pool started just before a
call the policy refused at once (answered within a millisecond) was held in 2 of 9 trials without
it (red team 39c).
"""

from __future__ import annotations

import os
import time
from typing import Any

from vault import lineage
from vault.runner.evidence import Evidence

# one start time read twice (the same /proc field) is the same float
_SAME_START_S = 0.001
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def held(ev: Evidence, told: dict[int, float],
         ran: dict[int, list[tuple[int, float]]] | None = None) -> set[int]:
    """`told` (pid -> when it was told, epoch seconds) and the pid of every session opened by a
    process below one of them whose branch began at or after that time. `ran`: a told pid's
    children when it was told, where the record has them: a branch begun by one of them began
    before, whatever the clock tick says."""
    out = set(told)
    if not told:
        return out
    offset = time.time() - lineage.boot_clock()  # epoch = boot clock + offset
    own = _own_starts(ev)
    for s in ev.transcript.sessions.values():
        pid, chain = s.get("pid"), _chain(s.get("lineage"))
        if not isinstance(pid, int) or pid in out:
            continue
        for k in range(1, len(chain)):
            up, up_start = chain[k]
            if up not in told or abs(own.get(up, up_start) - up_start) > _SAME_START_S:
                continue  # not a told process, or another process that had its pid
            if _among(chain[k - 1], (ran or {}).get(up)):
                continue  # its child already when it was told
            if chain[k - 1][1] + offset + TICK_S > told[up]:  # its branch began after the telling
                out.add(pid)
                break
    return out


def unaware(ev: Evidence, pid: int | None, at: float, ran: list[tuple[int, float]] | None = None) -> set[int]:
    """Session openers that cannot have read what `pid` was told at `at`: started (a tick and
    more) before it, or below one of its children when it was told (`ran`, where the record has
    them), neither `pid` nor one of its ancestors (which handed it its step and collects its
    answer), nor held by it. A pool's other worker at work on another step. Empty when `pid` is
    unknown; a session without a recorded ancestry is never among them."""
    if pid is None:
        return set()
    offset = time.time() - lineage.boot_clock()
    above: set[int] = {pid}
    for s in ev.transcript.sessions.values():
        if s.get("pid") == pid:
            above.update(p for p, _ in _chain(s.get("lineage"))[1:])
    holds = held(ev, {pid: at}, {pid: ran or []})
    below = _below(ev, pid, ran)
    return {p for p, start in _own_starts(ev).items()
            if p not in above and p not in holds and (start + offset + TICK_S <= at or p in below)}


def _among(proc: tuple[int, float], ran: list[tuple[int, float]] | None) -> bool:
    return any(pid == proc[0] and abs(start - proc[1]) <= _SAME_START_S for pid, start in ran or ())


def _below(ev: Evidence, pid: int, ran: list[tuple[int, float]] | None) -> set[int]:
    """Session openers that were `pid`'s children when it was told, or below one of them."""
    out: set[int] = set()
    if not ran:
        return out
    for s in ev.transcript.sessions.values():
        chain = _chain(s.get("lineage"))
        for k in range(1, len(chain)):
            if chain[k][0] == pid and _among(chain[k - 1], ran):
                out.add(chain[0][0])
                break
    return out


def tell(told: dict[int, float], pid: int | None, at: float) -> None:
    """Adds `pid`, told at `at`, keeping the earliest time it was told."""
    if pid is not None:
        told[pid] = min(at, told.get(pid, at))


def _own_starts(ev: Evidence) -> dict[int, float]:
    """Each session opener's own start time, from its recorded ancestry."""
    out: dict[int, float] = {}
    for s in ev.transcript.sessions.values():
        chain = _chain(s.get("lineage"))
        if chain and chain[0][0] == s.get("pid"):
            out.setdefault(chain[0][0], chain[0][1])
    return out


def _chain(raw: Any) -> list[tuple[int, float]]:
    """A recorded ancestry as (pid, start) pairs, cut at the first malformed one."""
    out: list[tuple[int, float]] = []
    for item in raw or ():
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            break
        pid, start = item
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, (int, float)):
            break
        out.append((pid, float(start)))
    return out
