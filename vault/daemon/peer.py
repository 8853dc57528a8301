"""Who is on the other end of a Unix socket, and is it still the same process.

SO_PEERCRED gives pid/uid/gid as the kernel saw them at connect time: the
process that connected. A connection can be inherited by a child, so the
daemon also asks for SCM_CREDENTIALS (SO_PASSCRED) and the kernel then tells,
for every read, which process wrote those bytes. A pid alone is not an
identity (pids are reused), so every identity carries its start time (vault.lineage) and
the executable: a reused pid is a different process.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import psutil

from vault.lineage import lineage, running, same_start

_UCRED = struct.Struct("3i")
CREDS_SPACE = socket.CMSG_SPACE(_UCRED.size)


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def sender(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
    """(pid, uid) of the process that wrote the bytes of one recvmsg, from SCM_CREDENTIALS.
    None when the kernel gave none; pid 0 when the writer is not visible from here."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            pid, uid, _ = _UCRED.unpack_from(data)
            return pid, uid
    return None


@dataclass(frozen=True)
class Markers:
    """What a process shares with the processes it starts, even ones that left its tree
    (a double fork reparents the grandchild, but it keeps the session, group and cgroup)."""

    sid: int
    pgid: int
    cgroup: str

    @classmethod
    def of(cls, pid: int) -> "Markers":
        return cls(_or_unknown(os.getsid, pid), _or_unknown(os.getpgid, pid), cgroup_of(pid))


def _or_unknown(fn: Any, pid: int) -> int:
    try:
        return int(fn(pid))
    except OSError:
        return -1


def cgroup_of(pid: int | str) -> str:
    """The process's cgroup (the v2 line, else every line joined), "" if unknown."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    v2 = [ln[3:] for ln in lines if ln.startswith("0::")]
    return v2[0] if len(lines) == 1 and v2 else "|".join(sorted(lines))


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    uid: int
    create_time: float
    exe: str

    @classmethod
    def of(cls, pid: int, uid: int) -> "ProcessIdentity | None":
        ctime = running(pid)  # the kernel's start time (vault.lineage.started), never psutil's
        if ctime is None:
            return None
        try:
            exe = psutil.Process(pid).exe()
        except (psutil.AccessDenied, psutil.ZombieProcess):
            exe = ""
        except psutil.NoSuchProcess:
            return None
        return cls(pid, uid, ctime, exe)

    def alive(self) -> bool:
        """True while this exact process (not a successor with the same pid) runs."""
        now = running(self.pid)
        return now is not None and same_start(now, self.create_time)

    def same_process(self, other: "ProcessIdentity") -> bool:
        return (self.pid, self.create_time, self.exe, self.uid) == (
            other.pid, other.create_time, other.exe, other.uid)


def is_same_or_descendant(pid: int, ancestors: list[ProcessIdentity]) -> bool:
    """Is `pid` one of `ancestors` or a descendant of one (checked by create_time)?"""
    starts: dict[int, list[float]] = {}
    for a in ancestors:
        starts.setdefault(a.pid, []).append(a.create_time)
    return any(same_start(t, c) for p, t in lineage(pid) for c in starts.get(p, ()))


def has_ancestor(pid: int, ancestor_pid: int) -> bool:
    """Is `ancestor_pid` a parent, grandparent, ... of `pid` right now? (checks a label's claim)"""
    return any(p == ancestor_pid for p, _ in lineage(pid)[1:])
