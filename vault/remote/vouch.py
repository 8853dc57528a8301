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
here would fail a careful agent for its neighbour's act. A connection held
only by processes provably outside the trial (vault.lineage) is refused
before the remote acts on it (`foreign`). Before the runner starts the
trial's first agent (`roots` empty) the same holds with the world's set-up
time for the first agent's start; while an agent is being started, nothing
is outside (its pid is not known yet). Whatever cannot
be told (the owner gone, unreadable, an orphan) stays this trial's: fail
closed.

Who holds the client end is read when the connection is accepted
(`accepted`), before its request is read: a scanner that sends its request
and closes at once (or gives up on a slow answer, under load) was gone by the
time its request was looked at, and whose it was could not be told, so a
careful trial beside another run's scanner was failed for it. The holders'
ancestry read then is judged at the request (`judge`), once any agent being
started meanwhile is known (the server waits for that, SPAWN_WAIT_S at
most, for a holder below this runner: another run's process is never one of
its agents). What was gone already at the accept stays this trial's.

Finding a socket's holders reads every process's fds, so a trial gets
MAX_OWNER_SCANS of those; a neighbour flooding connections is found again
without one, among the branches already found outside (`_known`).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field

import psutil

from vault.lineage import Chain, Trial, boot_clock, lineage, orphanage, same_start, started
from vault.vouch import HEADER

_HEADER = HEADER.lower().encode()
MAX_OWNER_SCANS = 32  # per trial: each reads every process's fds, so a flood of connections gets no more
MAX_KNOWN = 256  # processes looked at for a socket among the branches already found outside
SPAWN_WAIT_S = 5.0  # how long a request held at the accept by an unknown process waits for an agent being started


@dataclass
class Accepted:
    """Who held a connection's client end when it was accepted (Vouch.accepted)."""

    owner: bool | None  # an allowed process held it (Vouch.owner_allowed)
    inode: int | None = None
    ours: bool = False  # one of this trial's processes (or one that could not be looked at) held a share
    holders: list[tuple[int, Chain, str]] = field(default_factory=list)  # pid, ancestry, command, read then


@dataclass
class Vouch:
    mark: str
    pids: set[int] = field(default_factory=set)  # processes allowed to call the remote
    roots: set[int] = field(default_factory=set)  # the trial's agents (what the runner started for them)
    roots_born: float | None = None  # when the first of them started
    # each of them: pid -> start time (None: gone when added), so a later process given one of
    # their pids is not taken for it (vault.runner.neighbour_state)
    root_births: dict[int, float | None] = field(default_factory=dict)
    spawning: int = 0  # agents being started (their pid not yet in roots)
    since: float = field(default_factory=boot_clock)  # the trial's world was set up after this (vault.lineage clock)
    scans: int = 0
    outside: dict[int, float] = field(default_factory=dict)  # tops of branches found outside: pid -> born

    def add_root(self, pid: int) -> None:
        """A process the runner started for one of this trial's agents (vouch.foreign)."""
        born = started(pid)
        self.root_births[pid] = born
        if born is None:
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

    def trial(self) -> Trial:
        return Trial(os.getpid(), frozenset(self.roots), self.roots_born, frozenset(self.pids), self.since)

    def foreign(self, client: tuple[str, int] | None, server_port: int) -> tuple[int, str] | None:
        """`judge(accepted(...))` at once: (pid, command) of the process holding the client end when
        it is provably not this trial's; None when it is, or cannot be told."""
        found = self.judge(self.accepted(client, server_port))
        return None if found is None else found[:2]

    def accepted(self, client: tuple[str, int] | None, server_port: int) -> Accepted:
        """Who holds the client end now, as the connection is accepted (module doc): read before the
        holder can be gone, judged at its request (`judge`)."""
        owner = self.owner_allowed(client, server_port)
        if owner is not False or client is None:
            return Accepted(owner)
        inode = _client_inode(client[1], server_port)
        if inode is None:
            return Accepted(owner)
        target = f"socket:[{inode}]"
        if any(_holds(pid, target) is not False for pid in self._ours()):
            return Accepted(owner, inode, ours=True)  # this trial's (or shared with one of its processes)
        holders = self._known(target)
        if not holders:
            if self.scans >= MAX_OWNER_SCANS:
                return Accepted(owner, inode)
            self.scans += 1
            holders = _socket_holders(inode)
        return Accepted(owner, inode, holders=[(pid, lineage(pid), _command(pid)) for pid in holders])

    def judge(self, seen: Accepted) -> tuple[int, str, bool] | None:
        """(pid, command, whether it runs below this runner: another trial's agent, not another run's)
        of the holder `seen` at the accept when every holder then was provably
        outside this trial (its agents as known now: call once none is being started), and none of
        its processes holds a share now; None when it is, or cannot be told. Every holder must be
        foreign: an agent that handed its socket to an older process still holds a share of it, or did."""
        if seen.ours or not seen.holders or (self.spawning and self.unsettled(seen)):
            return None  # an agent being started is not in roots yet: its requests cannot be told
        trial = self.trial()
        chains = [chain for _, chain, _ in seen.holders]
        if not all(trial.outside(c) for c in chains):
            return None
        target = f"socket:[{seen.inode}]"
        if any(_holds(pid, target) is not False for pid in self._ours()):
            return None  # handed to one of this trial's processes since
        for chain in chains:
            self._remember(chain, trial)
        pid, chain, command = seen.holders[0]
        return pid, command, any(p == trial.runner for p, _ in chain)

    def unsettled(self, seen: Accepted) -> bool:
        """Could a holder `seen` be an agent being started (`spawning`)? Only one below this runner: an
        agent runs below the runner's fork server, so another run's process is judged at once."""
        me = os.getpid()
        return any(pid == me for _, chain, _ in seen.holders for pid, _ in chain)

    def _known(self, target: str) -> list[int]:
        """The holders of `target` among the branches already found outside."""
        seen: list[int] = []
        for top, born in list(self.outside.items()):
            try:
                now = started(top)
                if now is None or not same_start(now, born):
                    raise psutil.NoSuchProcess(top)
                proc = psutil.Process(top)
                seen += [proc.pid, *(c.pid for c in proc.children(recursive=True))]
            except psutil.Error:
                del self.outside[top]  # gone (or its pid reused): not that branch any more
        return [pid for pid in dict.fromkeys(seen[:MAX_KNOWN]) if _holds(pid, target)]

    def _ours(self) -> list[int]:
        """This trial's agents and daemon with what runs below them now."""
        out = []
        for pid in self.roots | (self.pids - {os.getpid()}):
            try:
                out += [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
            except psutil.Error:
                continue
        return out

    def _remember(self, chain: Chain, trial: Trial) -> None:
        """The top of `chain`'s branch below where it joins the runner's tree (the runner, init
        or a subreaper above it) that none of this trial's processes runs below (the other
        trials' agents share their launcher with this trial's), to find its next connections
        without a scan; before the trial's agents are known, the process itself."""
        if len(self.outside) >= MAX_KNOWN // 8:
            return
        home = orphanage()
        join = next((i for i, (pid, _) in enumerate(chain) if i and (pid == trial.runner or pid in home)), 0)
        ours = {p for pid in trial.roots | (trial.inside - {trial.runner}) for p, _ in lineage(pid)}
        below = [link for link in chain[:join] if link[0] not in ours] if trial.roots else []
        self.outside.update([below[-1] if below else chain[0]])


def _command(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return " ".join(proc.cmdline())[:200] or proc.name()
    except psutil.Error:
        return "?"


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
        except PermissionError:
            # the list was readable but its links are not: root without CAP_SYS_PTRACE (a
            # container's default) before a non-dumpable process. Unknown, never "not held"
            return None
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
