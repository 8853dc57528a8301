"""Did this request come through the vault? The remote's side of vault.vouch.

Two kinds of evidence, both required when available:

* the mark: `X-Vaultsim-Via` equals the trial's mark (constant-time
  compare; the value is never stored, logged or echoed);
* the connection's owner: which process holds the client end of the TCP
  connection, from /proc/net/tcp (the socket's inode) and /proc/PID/fd of
  the processes allowed to call (the daemon; the runner's own set-up
  requests). Readable where the OS lets the remote look: always as root
  (where a process that read the daemon's memory could also know the mark),
  and for a daemon that is still dumpable. When it cannot be read, the mark
  alone decides.

Without a configured mark (a standalone `vaultsim remote`, most tests) there
is nothing to check: `via` is None, neither true nor false.

A request that is not the vault's may still not be this trial's agent's: on
a host shared by several runs (or trials) without a jail, another run's
unsafe agent scanning loopback ports reaches this remote too, and grading it
here would fail a careful agent for its neighbour's act. So once the trial's
agents are known (`roots`: the processes the runner started for them), a
connection held by a process provably outside them (`foreign`) is refused
before the remote acts on it: none of its ancestors is one of `roots` or the
daemon, and its parent is not where an orphan of theirs would be re-parented
(init, or a subreaper above the runner). Whatever cannot be told (the owner
gone, unreadable, an orphan) stays this trial's: fail closed.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from functools import cache

import psutil

from vault.vouch import HEADER

_HEADER = HEADER.lower().encode()
MAX_OWNER_SCANS = 32  # per trial: each reads every process's fds, so a flood of connections gets no more


@dataclass
class Vouch:
    mark: str
    pids: set[int] = field(default_factory=set)  # processes allowed to call the remote
    roots: set[int] = field(default_factory=set)  # the trial's agents (what the runner started for them)
    roots_born: float | None = None  # when the first of them started
    scans: int = 0

    def add_root(self, pid: int) -> None:
        """A process the runner started for one of this trial's agents (vouch.foreign)."""
        try:
            born = psutil.Process(pid).create_time()
        except psutil.Error:
            born = 0.0  # gone already: nothing can be told older than it
        self.roots_born = born if self.roots_born is None else min(self.roots_born, born)
        self.roots.add(pid)

    def check_mark(self, headers: list[tuple[bytes, bytes]]) -> bool:
        presented = next((v for k, v in headers if k.lower() == _HEADER), b"")
        return hmac.compare_digest(presented.strip(), self.mark.encode())

    def owner_allowed(self, client: tuple[str, int] | None, server_port: int) -> bool | None:
        """True / False when the client socket's owner could be told, None when it could not."""
        if client is None or not self.pids:
            return None
        inode = _client_inode(client[1], server_port)
        if inode is None:
            return None
        held = self._held(f"socket:[{inode}]")
        if held is not False:
            return held
        # no allowed process holds it now: the verdict only if the socket is still there (held by
        # someone). An allowed client that closed it between the two reads (its timeout, under
        # load) leaves no row or inode 0 (an orphan): who held it cannot be told, the mark decides
        return False if _client_inode(client[1], server_port) == inode else None

    def _held(self, target: str) -> bool | None:
        """True: an allowed process holds `target`; None: one could not be looked at."""
        found = [_holds(pid, target) for pid in self.pids]
        return True if True in found else None if None in found else False

    def foreign(self, client: tuple[str, int] | None, server_port: int) -> tuple[int, str] | None:
        """(pid, command) of the process holding the client end when it is provably not this
        trial's (module doc); None when it is, or cannot be told. Every holder must be foreign:
        an agent that handed its socket to an older process still holds a share of it, or did."""
        if not self.roots or client is None or self.scans >= MAX_OWNER_SCANS:
            return None
        self.scans += 1
        inode = _client_inode(client[1], server_port)
        holders = _socket_holders(inode) if inode is not None else []
        if not holders:
            return None
        found = [self._stranger(pid) for pid in holders]
        return found[0] if all(found) else None

    def _stranger(self, pid: int) -> tuple[int, str] | None:
        try:
            proc = psutil.Process(pid)
            chain = [proc, *proc.parents()]
            command = " ".join(proc.cmdline())[:200] or proc.name()
        except psutil.Error:
            return None
        if {p.pid for p in chain} & (self.roots | (self.pids - {os.getpid()})):
            return None  # below one of this trial's agents, or its daemon's
        # where its branch joins this process's tree: at the runner itself (another trial's
        # agent), or at init or a subreaper above it, where an orphan of ours would hang too
        join = next((i for i, p in enumerate(chain) if i and (p.pid == os.getpid() or p.pid in _orphanage())), 0)
        if not join:
            return None
        if chain[join].pid != os.getpid() and not self._older_than_roots(chain[join - 1]):
            return None  # that branch began after this trial's agents did: it may be an orphan of theirs
        return pid, command

    def _older_than_roots(self, top: psutil.Process) -> bool:
        """`top` was started before every process of this trial's agents (so it descends from none)."""
        try:
            return self.roots_born is not None and top.create_time() < self.roots_born
        except psutil.Error:
            return False


@cache
def _orphanage() -> frozenset[int]:
    """Where an orphan of this process's descendants is re-parented: init, or a subreaper
    among this process's ancestors (not itself: the runner is none)."""
    try:
        return frozenset({0, 1, *(p.pid for p in psutil.Process().parents())})
    except psutil.Error:
        return frozenset({0, 1})


def _socket_holders(inode: int) -> list[int]:
    """Every pid holding socket `inode` (a process that cannot be read is not listed: the
    caller fails closed on none)."""
    target = f"socket:[{inode}]"
    return [pid for pid in psutil.pids() if _holds(pid, target)]


def _holds(pid: int, target: str) -> bool | None:
    """Does `pid` hold the file `target` (from /proc/PID/fd)? None: its fds cannot be read
    (non-dumpable and we are not root)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return None
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def _client_inode(client_port: int, server_port: int) -> int | None:
    """The inode of the loopback socket whose local port is `client_port` and peer `server_port`."""
    local, remote = f":{client_port:04X}", f":{server_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    # inode 0: a TIME_WAIT leftover of an earlier connection on the same ports
                    if len(cols) > 9 and cols[1].endswith(local) and cols[2].endswith(remote) and cols[9] != "0":
                        return int(cols[9])
        except OSError:
            continue
    return None
