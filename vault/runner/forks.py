"""Who forked whom, heard from the kernel as it happens (the proc connector), for the fanotify reader.

Why: the reader reads a writer's ancestry from /proc at its event, and a process that writes and
exits at once (a forked child, a shell's `echo >`) is gone by then: its write could not be told
from the neighbour's own (vault.runner.neighbour_state). The kernel tells a listener (root, the
initial namespaces) of every fork and exit as it happens; kept here, a gone writer's parent is
known, and its ancestry is read from the first ancestor still there. Only forks and exits are
asked for (the connector's filter), kept while the process lives and for KEEP_S after.

Where the connector cannot be used (no CONFIG_PROC_EVENTS, not the initial namespaces) nothing is
heard and a gone writer stays untold, as before. Its socket's buffer may overflow on a host forking
faster than this reads: then some forks are not known, and a writer among them stays untold.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

from vault.lineage import Chain, lineage

NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_FORK, PROC_EVENT_EXIT = 0x1, 0x80000000
SO_RCVBUFFORCE = 33
KEEP_S = 30.0  # a gone process's record kept this long (its events are read within milliseconds)
MOST = 1 << 17  # records kept at most (pid_max is 32,768 here; 4,194,304 at most)
MAX_DEPTH = 64
# a fork heard and /proc's start time of one process: the connector's clock and /proc's ticks (10 ms)
SAME_S = 0.05

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (CLOCK_MONOTONIC)
_FORK = struct.Struct("=iiii")  # parent pid, parent tgid, child pid, child tgid
_EXIT = struct.Struct("=ii")  # pid, tgid


class Forks:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        # the connector's times are CLOCK_MONOTONIC; /proc's start times CLOCK_BOOTTIME (vault.lineage)
        self.offset = time.clock_gettime(time.CLOCK_BOOTTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)
        self.parents: dict[int, tuple[int, float]] = {}  # process -> (its parent, when it started)
        self.gone: dict[int, float] = {}  # process -> when it exited (monotonic)
        self.lost = False

    @classmethod
    def listen(cls) -> "Forks | None":
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError:
            return None
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
            sock.bind((os.getpid(), CN_IDX_PROC))
            body = struct.pack("=II", PROC_CN_MCAST_LISTEN, PROC_EVENT_FORK | PROC_EVENT_EXIT)  # filtered
            cn = _CN.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(body), 0) + body
            sock.send(_NLMSG.pack(_NLMSG.size + len(cn), 3, 0, 0, os.getpid()) + cn)  # NLMSG_DONE
            sock.setblocking(False)
        except OSError:
            sock.close()
            return None
        return cls(sock)

    def drain(self, most: int = 0) -> bool:
        """The messages queued now (at most `most` of them, if given): are more left?"""
        n = 0
        while not most or n < most:
            n += 1
            try:
                data = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                self._prune()
                return False
            except OSError:  # ENOBUFS: the kernel dropped some
                self.lost = True
                continue
            self._read(data)
        return True

    def _read(self, data: bytes) -> None:
        i = 0
        while i + _NLMSG.size + _CN.size + _EVENT.size <= len(data):
            length = _NLMSG.unpack_from(data, i)[0]
            at = i + _NLMSG.size + _CN.size
            what, _, stamp = _EVENT.unpack_from(data, at)
            at += _EVENT.size
            if what == PROC_EVENT_FORK:
                _, ptgid, pid, tgid = _FORK.unpack_from(data, at)
                if pid == tgid and len(self.parents) < MOST:  # a process, not a thread
                    self.parents[tgid] = (ptgid, stamp / 1e9 + self.offset)
                    self.gone.pop(tgid, None)
            elif what == PROC_EVENT_EXIT:
                pid, tgid = _EXIT.unpack_from(data, at)
                if pid == tgid and tgid in self.parents:
                    self.gone[tgid] = time.monotonic()
            i += max(length, _NLMSG.size) + 3 & ~3  # NLMSG_ALIGN

    def _prune(self) -> None:
        if not self.gone:
            return
        old = time.monotonic() - KEEP_S
        for pid in [p for p, t in self.gone.items() if t < old]:
            del self.gone[pid]
            self.parents.pop(pid, None)

    def mend(self, chain: Chain) -> Chain:
        """`chain` as read from /proc at an event, its ancestry taken from what was heard where
        /proc lost it: the read ended short of init (a parent exited between two reads of it), or
        a process's parent there is not the one that forked it (it was adopted: its parent exited
        before the read). sshd's session process writes its log's last lines and exits as its
        monitor does; read then, it came out as a stump or an orphan of init's, and a write to
        the SSH host's log by it was charged to the agent (vault.runner.opens: fail closed)."""
        for i, (pid, born) in enumerate(chain):
            heard = self.parents.get(pid)
            if heard is None or abs(heard[1] - born) > SAME_S:
                continue  # forked before this listened, or a later process under the pid's record
            if i + 1 < len(chain) and chain[i + 1][0] == heard[0]:
                continue  # its parent, as forked
            told = self.chain(pid)
            return chain[:i] + told if len(told) > 1 else chain
        return chain

    def chain(self, pid: int) -> Chain:
        """`pid`'s ancestry from what was heard, then read from its first ancestor still running
        (and older than its child: not a later process given the same pid); [] when not heard."""
        out: Chain = []
        while pid in self.parents and len(out) < MAX_DEPTH:
            parent, born = self.parents[pid]
            if out and born > out[-1][1] + 0.05:
                break  # a later process given its parent's pid: who that parent was cannot be told
            out.append((pid, born))
            live = lineage(parent)
            if live and live[0][1] <= born + 0.05:
                return out + live
            pid = parent
        return out
