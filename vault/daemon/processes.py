"""The client processes the daemon knows of: what each holds, and when it exits.

Limits hold per process, not only per connection or session (a process can
open many of both), so every connection and session is counted against the
process it belongs to here. A process that opened an agent session is watched
until it exits: Linux gives a pidfd that becomes readable at exit, so the
daemon learns of the exit from the event loop, at no cost while it runs, and
ends that process's sessions and grants at once. Where no pidfd can be had
(an old kernel, the open-file limit), the process is polled instead.

An entry is keyed by (pid, create_time): a successor that reused the pid is
another process with its own entry.

Connections are also counted per process *tree* (vault.daemon.limits): found once
per process, when its first connection is accepted, from /proc (`tree_of`), never
on the hot path. The counts are dropped when they reach zero, so they stay as
bounded as the connections. So are requests in progress (`begin_request`), per process, per
tree and in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import select
from dataclasses import dataclass, field
from typing import Any, Callable

from vault.daemon.gone_watch import GoneWatch
from vault.daemon.limits import (MAX_CONNECTIONS, MAX_IN_FLIGHT_PER_PROCESS, MAX_IN_FLIGHT_PER_TREE,
                                  MAX_IN_FLIGHT_TOTAL)
from vault.daemon.peer import Markers, ProcessIdentity
from vault.lineage import RECORDED_DEPTH, Chain, children, lineage, same_start

log = logging.getLogger("vaultsim.daemon")

# how often a process with no pidfd is checked for exit
FALLBACK_POLL_S = 1.0
WATCHED = 16  # ancestors whose exit a request records, nearest first (vault.daemon.gone_watch)
KIN = 4  # of its tree root's older children, the oldest (the agent, and a jail's bwrap before it)

Key = tuple[int, float]


@dataclass(frozen=True)
class Busy:
    """A request refused for the requests already in progress: `where` the bound held
    ("connection", "process", "tree" or "all"), `at_most` that bound, `reason` as answered."""

    where: str
    at_most: int
    reason: str


@dataclass(eq=False)
class ProcessEntry:
    identity: ProcessIdentity
    connections: int = 0
    partial_bytes: int = 0  # unfinished lines across its connections
    sessions: int = 0
    pending: int = 0  # prompts waiting for a person
    in_flight: int = 0  # requests in progress on its connections (ProcessTable.begin_request)
    was_agent: bool = False  # opened an agent session at some point in its life
    flooder: bool = False  # was refused for too many waiting prompts
    markers: Markers | None = None
    tree: Key | None = None  # the root of its process tree (pid, start), found at its first connection
    # its ancestry (vault.lineage) read with the tree, when it could be ([] when not): recorded with
    # its sessions, so a process of another run can be told apart after it is gone
    chain: Chain | None = None
    # its recorded ancestors below the one it shares with the daemon (the agent and its helpers'
    # parents, under a runner's keeper), whose exit each of its requests records (`gone_now`)
    watched: tuple[Key, ...] | None = None
    kin: Chain | None = None  # its tree root's children older than it, when read (ProcessTable.kin_of)
    exited: bool = False
    fd: int | None = None  # pidfd while watched
    polled: bool = False  # watched by polling (no pidfd)
    on_exit: list[Callable[["ProcessEntry"], None]] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.identity.pid, self.identity.create_time)

    def alive(self) -> bool:
        """True while this exact process runs (one poll of its pidfd when watched)."""
        if self.exited:
            return False
        if self.fd is not None:
            p = select.poll()
            p.register(self.fd, select.POLLIN)
            return not p.poll(0)
        return self.identity.alive()

    def idle(self) -> bool:
        return not (self.connections or self.partial_bytes or self.sessions or self.pending or self.in_flight)


class ProcessTable:
    def __init__(self) -> None:
        self.entries: dict[Key, ProcessEntry] = {}
        # totals over every process, for the limits that hold in all
        self.connections = 0
        self.partial_bytes = 0
        self.max_connections = MAX_CONNECTIONS  # lowered to what the open-file limit allows
        self.trees: dict[Key, int] = {}  # connections per process tree (only trees holding some)
        self.in_flight = 0  # requests in progress, in all
        self.tree_in_flight: dict[Key, int] = {}  # and per process tree (only trees with some)
        self._own = {p: t for p, t in lineage(os.getpid())}  # the daemon and its ancestors
        self._runner_is_init = _runner_is_init()
        self._gone = GoneWatch()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self, identity: ProcessIdentity) -> ProcessEntry:
        key = (identity.pid, identity.create_time)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = ProcessEntry(identity)
        return entry

    def tree_of(self, entry: ProcessEntry) -> Key:
        """The root of `entry`'s process tree: in its lineage, the process just below the nearest
        ancestor it shares with the daemon (itself when that is the daemon's own ancestor).
        A process the daemon cannot see is a tree of its own."""
        if entry.tree is None:
            chain = self._read_chain(entry)
            root: Key = entry.key
            for i, (pid, start) in enumerate(chain):
                own = self._own.get(pid)
                if own is not None and same_start(start, own):
                    root = chain[i - 1] if i > 0 else chain[0]
                    break
            else:
                if chain:
                    root = chain[-1]
            entry.tree = root
        return entry.tree

    def begin_request(self, entry: ProcessEntry, in_all: bool = True) -> Busy | None:
        """Count one more request in progress of `entry`'s; None if granted, else which bound it
        met and why (nothing counted). Each holds a task until it is answered, and some answers take as long as the
        client asks (`call.resume` with `wait_s` of a day): 64 per connection alone let one process
        with 256 connections hold 16,384 of them, and a few processes every one the daemon could
        hold (hundreds of MB). `in_all` False (the approver socket): not held to the total, so
        agents filling it never keep the person from deciding, locking or stopping the vault."""
        tree = self.tree_of(entry)
        if entry.in_flight >= MAX_IN_FLIGHT_PER_PROCESS:
            return Busy("process", MAX_IN_FLIGHT_PER_PROCESS,
                        f"too many requests in progress from this process (at most {MAX_IN_FLIGHT_PER_PROCESS} "
                        "across its connections); wait for an answer, then send again. Nothing was done")
        if self.tree_in_flight.get(tree, 0) >= MAX_IN_FLIGHT_PER_TREE:
            return Busy("tree", MAX_IN_FLIGHT_PER_TREE,
                        f"too many requests in progress from this process and the others of its process tree "
                        f"(at most {MAX_IN_FLIGHT_PER_TREE}); wait for an answer, then send again. Nothing was done")
        if in_all and self.in_flight >= MAX_IN_FLIGHT_TOTAL:
            return Busy("all", MAX_IN_FLIGHT_TOTAL, "too many requests in progress from all clients; wait for an "
                        "answer, then send again. Nothing was done")
        entry.in_flight += 1
        self.in_flight += 1
        self.tree_in_flight[tree] = self.tree_in_flight.get(tree, 0) + 1
        return None

    def end_request(self, entry: ProcessEntry) -> None:
        """One request of `entry`'s answered (or dropped)."""
        tree = self.tree_of(entry)
        entry.in_flight -= 1
        self.in_flight -= 1
        left = self.tree_in_flight.get(tree, 0) - 1
        if left > 0:
            self.tree_in_flight[tree] = left
        else:
            self.tree_in_flight.pop(tree, None)

    def lineage_of(self, entry: ProcessEntry) -> Chain:
        """`entry`'s ancestry as read when it first connected (or now, for a process that writes on
        a connection another opened), at most RECORDED_DEPTH long; [] when it could not be read
        (gone, its pid reused)."""
        if entry.chain is None:
            self._read_chain(entry)
        return entry.chain or []

    def gone_now(self, entry: ProcessEntry | None) -> list[int] | None:
        """Which of `entry`'s watched processes have exited by now (vault.daemon.gone_watch), read as
        its request comes: its recorded ancestors below the one it shares with the daemon, and its
        `kin_of`. None when its ancestry was not recorded (nothing can be said)."""
        if entry is None or not self.kin_of(entry)[0]:
            return None
        return self._gone.gone(entry.watched) if entry.watched else []

    def kin_of(self, entry: ProcessEntry) -> tuple[Chain, Chain | None]:
        """`entry`'s recorded ancestry, and its kin: the children of its tree's root (the agent's
        keeper, under a runner) that started before it, as read the first time it was asked (as its
        first session opened), oldest first, at most KIN. An orphan of the agent's hangs below the
        keeper (or a jail's init) and has no agent among its ancestors; the agent, older than every
        process of its tree, is among these while it is there (vault.runner.late_opens). None when
        they could not be read."""
        chain = self.lineage_of(entry)
        if entry.watched is None:
            below = next((i for i, (pid, start) in enumerate(chain)
                          if i and (own := self._own.get(pid)) is not None and same_start(start, own)), len(chain))
            kin: Chain | None = None
            # the root: a keeper, an ancestor of its, below a runner (or its fork server). Not below
            # init: a session's or desktop's root has hundreds of children, and no agent's keeper
            # (unless init is the runner itself, a container's entrypoint: _runner_is_init)
            root = chain[below - 1][0] if 2 <= below < len(chain) and (
                chain[below][0] > 1 or self._runner_is_init) else None
            if root is not None and os.path.exists(f"/proc/{root}/task/{root}/children"):
                # its older children (a start in the same clock tick too: the agent is never left
                # out); None where the kernel keeps no children list (nothing can be said of them)
                kin = sorted((k for k in children(root) if k[0] != chain[0][0]
                              and (k[1] < chain[0][1] or same_start(k[1], chain[0][1]))), key=lambda k: k[1])[:KIN]
            entry.kin = kin
            # the root itself is never gone while its tree asks; a chain that meets the daemon's
            # nowhere is watched up to its last
            up = chain[1:max(1, below - 1)][:WATCHED]
            entry.watched = tuple(up + [k for k in kin or [] if k not in up])
        return chain, entry.kin

    def chain_of(self, identity: ProcessIdentity) -> Chain:
        """The ancestry of the process `identity` as lineage_of reads it (its entry's, when it has
        one; read now, adding no entry, when not): recorded with its refusals as with its sessions."""
        entry = self.entries.get((identity.pid, identity.create_time))
        return self.lineage_of(entry if entry is not None else ProcessEntry(identity))

    def who(self, identity: ProcessIdentity) -> dict[str, Any]:
        """The fields a refusal's audit event names its process by: pid, sid, pgid, exe, and its
        `lineage` (absent, not null, when unknown) so the runner tells another run's apart."""
        markers = Markers.of(identity.pid) if identity.pid > 0 else Markers(-1, -1, "")
        out: dict[str, Any] = {"pid": identity.pid, "sid": markers.sid, "pgid": markers.pgid, "exe": identity.exe}
        chain = self.chain_of(identity)
        if chain:
            out["lineage"] = chain
        return out

    @staticmethod
    def _read_chain(entry: ProcessEntry) -> Chain:
        chain = lineage(entry.identity.pid) if entry.identity.pid > 0 else []
        ours = bool(chain) and same_start(chain[0][1], entry.identity.create_time)
        entry.chain = chain[:RECORDED_DEPTH] if ours else []
        return chain

    def connected(self, entry: ProcessEntry, n: int) -> None:
        """Count `n` (+1 or -1) connections of `entry`, its tree and in all."""
        entry.connections += n
        self.connections += n
        tree = self.tree_of(entry)
        held = self.trees.get(tree, 0) + n
        if held > 0:
            self.trees[tree] = held
        else:
            self.trees.pop(tree, None)

    def find(self, key: Key) -> ProcessEntry | None:
        return self.entries.get(key)

    def release(self, entry: ProcessEntry) -> None:
        """Forget an entry that holds nothing and needs no watching any more."""
        if entry.idle() and (entry.exited or not entry.was_agent):
            self._unwatch(entry)
            if self.entries.get(entry.key) is entry:
                del self.entries[entry.key]

    # ---- exit notification --------------------------------------------------------

    def watch(self, entry: ProcessEntry, on_exit: Callable[[ProcessEntry], None]) -> None:
        """Call `on_exit(entry)` once, from the event loop, when the process exits."""
        entry.on_exit.append(on_exit)
        if entry.fd is not None or entry.polled or entry.exited:
            if entry.exited:
                self._loop_now().call_soon(self._exited, entry)
            return
        loop = self._loop_now()
        try:
            fd = os.pidfd_open(entry.identity.pid)
        except ProcessLookupError:
            entry.exited = True
            loop.call_soon(self._exited, entry)
            return
        except (OSError, AttributeError) as exc:  # no pidfd here (or out of fds): poll it
            log.debug("no pidfd for process %d (%s); polling it", entry.identity.pid, type(exc).__name__)
            entry.polled = True
            return
        entry.fd = fd
        # the pidfd names whatever has the pid now: make sure it is still our process
        if not entry.identity.alive():
            entry.exited = True
            loop.call_soon(self._exited, entry)
            return
        loop.add_reader(fd, self._exited, entry)

    def poll_unwatched(self) -> None:
        """The fallback: check the processes that have no pidfd."""
        for entry in [e for e in self.entries.values() if e.polled and not e.exited]:
            if not entry.identity.alive():
                entry.exited = True
                self._exited(entry)

    def _exited(self, entry: ProcessEntry) -> None:
        entry.exited = True
        self._unwatch(entry)
        callbacks, entry.on_exit = entry.on_exit, []
        for cb in callbacks:
            try:
                cb(entry)
            except Exception as exc:  # one failing callback must not stop the others
                log.error("process exit handler failed: %s", type(exc).__name__)
        self.release(entry)

    def _unwatch(self, entry: ProcessEntry) -> None:
        if entry.fd is not None:
            fd, entry.fd = entry.fd, None
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        entry.polled = False

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def close(self) -> None:
        for entry in list(self.entries.values()):
            self._unwatch(entry)
        self.entries.clear()
        self._gone.close()


def _runner_is_init() -> bool:
    """Is pid 1 a runner (a container's entrypoint `vaultsim run`) rather than a system's init? Its
    children are the agents' keepers, so kin is read below it as below any runner. Told by its
    having started the daemon (the daemon's parent) and running the daemon's own interpreter: an
    init (systemd, tini) never does, and a root below one may have hundreds of children."""
    if os.getppid() != 1:
        return False
    try:
        return os.path.realpath("/proc/1/exe") == os.path.realpath(sys.executable)
    except OSError:
        return False
