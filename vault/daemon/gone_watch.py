"""Which of a requester's ancestors had exited when its request came (audit `gone`), read cheaply.

The runner holds an agent to its exit (section 9): a request a process it left behind sends after
the agent exited is late. The agent's exit as its keeper saw it is tens of milliseconds late on a
loaded host, so the daemon says it instead, as each request comes: which of the requesting
process's recorded ancestors, below the one it shares with the daemon (the agent's keeper, under
`vaultsim run`), had exited (vault.runner.late_opens.agent_was_gone reads it).

Per request that is a read of each such ancestor's /proc stat. Opening /proc/PID/stat costs
10-20 us a time in Python; a descriptor kept open and read again (pread) costs 3-4 us, and
names that very process for good (a reaped one answers ESRCH, even once its pid is another's).
So each watched ancestor's stat stays open while it runs (at most KEPT of them: the oldest is
closed, and read by name again when asked), one seen gone is remembered as gone without a read,
and the agent's own requests read nothing (it has no ancestor below its keeper).
"""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar

from vault.lineage import PF_EXITING, exited, same_start

Key = tuple[int, float]

KEPT = 64  # stat descriptors kept open (a handful of agents' processes; the daemon's fds are counted)
REMEMBERED = 4096  # ancestors remembered as gone

# the `gone` read as a resume or lookup came, for the answer's record written later (its request has
# no record of its own: vault.daemon.calls.record_result); set per request, in the request's task
REQUEST_GONE: ContextVar[list[int] | None] = ContextVar("request_gone", default=None)

_TICKS = os.sysconf("SC_CLK_TCK")


class GoneWatch:
    def __init__(self) -> None:
        self._fds: dict[Key, int] = {}
        self._gone: dict[Key, None] = {}

    def gone(self, keys: tuple[Key, ...]) -> list[int]:
        """The pids of `keys` ((pid, start) each) that have exited by now: gone, a zombie, in
        their exit (its pipes closed: a child woken by that EOF can ask first) or another's pid."""
        return [key[0] for key in keys if self._exited(key)]

    def _exited(self, key: Key) -> bool:
        if key in self._gone:
            return True
        fd = self._fds.get(key)
        if fd is None:
            fd = self._open(key)
            if fd is None:  # none kept (gone, another's, or no descriptor left): read by name
                return self._remember(key) if exited(key) else False
        try:
            stat = os.pread(fd, 1024, 0)
        except OSError:  # ESRCH: reaped (the descriptor names that process, never a successor)
            return self._remember(key)
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X", b"x") or int(fields[6]) & PF_EXITING:
            return self._remember(key)
        return False

    def _open(self, key: Key) -> int | None:
        if len(self._fds) >= KEPT:
            self._close(next(iter(self._fds)))
        try:
            fd = os.open(f"/proc/{key[0]}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            stat = os.pread(fd, 1024, 0)
            fields = stat[stat.rindex(b")") + 2:].split()
            ours = same_start(float(fields[19]) / _TICKS, key[1])
        except (OSError, ValueError, IndexError):
            ours = False
        if not ours:  # another process has the pid now (or it went meanwhile): the name decides
            os.close(fd)
            return None
        self._fds[key] = fd
        return fd

    def _remember(self, key: Key) -> bool:
        self._close(key)
        if len(self._gone) >= REMEMBERED:
            del self._gone[next(iter(self._gone))]
        self._gone[key] = None
        return True

    def _close(self, key: Key) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for key in list(self._fds):
            self._close(key)
