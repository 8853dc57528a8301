"""Is a process provably outside one trial? Told from its ancestry alone.

On a host shared by several runs (or trials) without a jail, another run's
agent scanning loopback ports and sockets reaches this trial's remote and
approver socket too; grading that here would fail a careful agent for its
neighbour's act. The runner knows its trial's agents (`roots`: the processes
it started for them, and when the first started) and its daemon (`inside`).
A process is outside when none of its ancestors is one of those, and its
branch joins the runner's tree where an orphan of the trial's could not hang
unless it is older than the trial's agents: at the runner itself (another
trial's agent; not a process its fork server was asked for on a copy of its
socket: `unasked`), or at init or a subreaper above the runner with its branch
begun before the first root (before the trial has one: before its world was
set up). Whatever cannot be told stays the trial's.

A chain is read live (`lineage`, the remote) or recorded by the daemon when
the process connected (the approver socket's `approver_attempt` events, the
agent socket's `session_opened`), so it can be judged after the process is
gone. Its times are the kernel's start times, seconds since boot (`started`), the
same in every process and at every read.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cache

import psutil

Chain = list[tuple[int, float]]  # (pid, create time): the process, then its parents up to init
MAX_DEPTH = 256  # a deeper chain is cut: where it joins cannot be told, so it stays the trial's
RECORDED_DEPTH = 64  # ancestors the daemon keeps in an audit record (a cut chain is judged the trial's)


def lineage(pid: int, names: list[str] | None = None) -> list[tuple[int, float]]:
    """(pid, start time) of the process and each of its ancestors, nearest first; each one's
    command name appended to `names` if given (read in the same read: a process may be gone
    the next moment).

    Read from /proc directly (one small read a level, where psutil makes several): this runs
    at every approver hello and decision. The start time is the kernel's (`started`)."""
    out: list[tuple[int, float]] = []
    while pid > 0 and len(out) < MAX_DEPTH:
        stat = _stat(pid)
        if stat is None:
            break
        if names is not None:
            names.append(stat[stat.find(b"(") + 1:stat.rindex(b")")].decode(errors="replace"))
        fields = _fields(stat)
        out.append((pid, float(fields[19]) / _TICKS))
        pid = int(fields[1])
    return out


def started(pid: int) -> float | None:
    """When `pid` started, in seconds since boot (/proc/PID/stat's start time, which never
    changes); None when it is gone. Every start time in the project is this one, in every
    process: psutil's create_time adds /proc/stat's btime, a whole second that moves when the
    wall clock is adjusted, so one process read twice in a long run (or by two processes that
    each cached it) came out a second apart: a live session read as gone, an orphan born in
    the trial as older than it. Raises OSError when /proc cannot be read for another reason."""
    stat = _stat(pid, strict=True)
    return None if stat is None else float(_fields(stat)[19]) / _TICKS


def running(pid: int) -> float | None:
    """`started(pid)`, or None when it is gone or a zombie (it runs nothing any more)."""
    stat = _stat(pid, strict=True)
    if stat is None:
        return None
    fields = _fields(stat)
    return None if fields[0] == b"Z" else float(fields[19]) / _TICKS


PF_EXITING = 0x4  # the kernel's flag for a task in exit (set before it closes its files)


def exited(key: tuple[int, float]) -> bool:
    """Has the process `key` (pid, start) exited: its pid gone, a zombie, exiting, or another
    process's now? Exiting counts: a process's pipes close before it turns zombie, so a child woken
    by that EOF can ask before the zombie shows. False when /proc cannot be read for another
    reason (nothing is claimed gone unseen)."""
    try:
        stat = _stat(key[0], strict=True)
    except OSError:
        return False
    if stat is None:
        return True
    fields = _fields(stat)
    return (fields[0] in (b"Z", b"X", b"x") or bool(int(fields[6]) & PF_EXITING)
            or not same_start(float(fields[19]) / _TICKS, key[1]))


def ancestors_gone(chain: Chain) -> list[int]:
    """The pids of `chain`'s ancestors (a recorded lineage, the process first) that have exited by
    now: read as a request comes, it says which of the processes that started the sender were
    still there, whatever a clock elsewhere saw (vault.runner.late_opens)."""
    return [pid for pid, start in chain[1:] if exited((pid, start))]


MAX_CHILDREN = 1024  # children kept in a record (a jailed agent runs at most 1,024 processes)


def children(pid: int) -> list[tuple[int, float]]:
    """(pid, start time) of `pid`'s children now, from each of its threads' /proc children list
    (a thread's child is the process's); empty when it is gone or /proc cannot say."""
    out: list[tuple[int, float]] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids = [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            stat = _stat(kid)
            if stat is not None and len(out) < MAX_CHILDREN:
                out.append((kid, float(_fields(stat)[19]) / _TICKS))
    return out


def boot_clock() -> float:
    """Now, on the clock of `started` (CLOCK_BOOTTIME: the clock /proc's start times are read on)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _stat(pid: int, strict: bool = False) -> bytes | None:
    """/proc/PID/stat, None when the process is gone (or hidden). `strict`: any other failure
    (no descriptor left: EMFILE) is raised, never taken for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        if strict:
            raise
        return None


def _fields(stat: bytes) -> list[bytes]:
    # the command name may hold spaces and parentheses: the fields follow the last ")"
    return stat[stat.rindex(b")") + 2:].split()


def same_start(a: float, b: float) -> bool:
    """Two start times of one pid name the same process (a successor starts later)."""
    return abs(a - b) < 2.0 / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK")


@cache
def orphanage() -> frozenset[int]:
    """Where an orphan of this process's descendants is re-parented: init, or a subreaper
    among this process's ancestors (not itself: the runner is none)."""
    try:
        return frozenset({0, 1, *(p.pid for p in psutil.Process().parents())})
    except psutil.Error:
        return frozenset({0, 1})


# every process this runner started itself (each trial's agent keepers and daemons: pid -> create
# time). Its helper that starts them (the fork server) can be asked by a root agent holding a copy
# of its socket to start a process of the agent's own, which hangs beside them: one below the
# fork server that is none of these is no other trial's
_STARTED: dict[int, float] = {}


def started_here(pid: int) -> None:
    """Remember a process this runner started (vault.runner.procs.Registry)."""
    chain = lineage(pid)[:1]
    if chain:
        _STARTED[pid] = chain[0][1]


# Forgetting them (a long run starts millions): a process's entry is needed while a trial that may
# have recorded it in a chain (a session's lineage, judged at the trial's end) is open, i.e. one
# that began before the process was gone. Gone is what the runner saw, never what it asked for
# (SIGKILL is not an exit), so each entry is forgotten once seen gone before every open trial began.
_EPOCH = [0]
_OPEN: dict[int, int] = {}  # open trial -> the epoch it began in
_ENDING: dict[int, tuple[float, int | None]] = {}  # pid -> (create time, epoch it was seen gone)


def _tick() -> int:
    _EPOCH[0] += 1
    return _EPOCH[0]


def trial_begins() -> int:
    """A trial begins (before it can record anything): its token for trial_ends."""
    token = _tick()
    _OPEN[token] = token
    return token


def trial_ends(token: int) -> None:
    _OPEN.pop(token, None)
    _forget()


def ended_here(pid: int) -> None:
    """A process the runner started is done with (its group ended or killed)."""
    born = _STARTED.get(pid)
    if born is not None:
        _ENDING[pid] = (born, None)
    _forget()


def _forget() -> None:
    oldest = min(_OPEN.values(), default=_EPOCH[0] + 1)
    for pid, (born, gone) in list(_ENDING.items()):
        if gone is None:
            now = lineage(pid)[:1]
            if now and same_start(now[0][1], born):
                continue  # still there (a zombie too): asked again next time
            _ENDING[pid] = (born, gone := _tick())
        if gone < oldest:
            del _ENDING[pid]
            if _STARTED.get(pid) == born:  # not a later process given the same pid
                del _STARTED[pid]


# the runner's helpers that start processes on request (its fork server): pid -> create time
_SPAWNERS: dict[int, float] = {}


def spawner_here(pid: int) -> None:
    """Remember a helper of this runner's that starts processes when asked (the fork server)."""
    chain = lineage(pid)[:1]
    if chain:
        _SPAWNERS[pid] = chain[0][1]


def unasked(chain: Chain) -> bool:
    """Is the process of `chain` below one of the runner's spawners through a process the runner
    never asked for (started by a request the agent wrote on a copy of the spawner's socket)?"""
    if not _SPAWNERS:
        return False
    for i, (pid, born) in enumerate(chain[1:], 1):
        if pid in _SPAWNERS and same_start(born, _SPAWNERS[pid]):
            top, top_born = chain[i - 1]
            asked = _STARTED.get(top)  # read once: a trial's end may forget it meanwhile
            return not (asked is not None and same_start(top_born, asked))
    return False


@dataclass(frozen=True)
class Trial:
    """One trial's processes as the runner knows them."""

    runner: int
    roots: frozenset[int]
    roots_born: float | None
    inside: frozenset[int]  # below these is the trial's too (its daemon)
    since: float | None = None  # when the trial's world was set up (`boot_clock`)

    def outside(self, chain: Chain | None) -> bool:
        """Is the process of `chain` provably not this trial's (module doc)?"""
        if not chain or chain[0][0] == self.runner:
            return False
        pids = {pid for pid, _ in chain}
        if pids & (self.roots | (self.inside - {self.runner})):
            return False  # below one of this trial's agents, or its daemon
        home = orphanage()
        join = next((i for i, (pid, _) in enumerate(chain) if i and (pid == self.runner or pid in home)), 0)
        if not join:
            return False
        if chain[join][0] == self.runner:
            # a branch of the runner's that is not this trial's: another trial's agent, unless its
            # fork server started it on a request the runner never sent (an agent's: `unasked`)
            return not unasked(chain)
        # at init or a subreaper: an orphan of this trial's would hang here too, unless its branch is
        # older than the trial's first agent (or, before there is one, than the trial itself)
        limit = self.roots_born if self.roots else self.since
        return limit is not None and chain[join - 1][1] < limit
