"""Who is on the other end of a Unix socket, and is it still the same process.

SO_PEERCRED gives pid/uid/gid as the kernel saw them at connect time. A pid
alone is not an identity (pids are reused), so every identity carries psutil's
create_time and the executable: a reused pid is a different process.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import psutil

_UCRED = struct.Struct("3i")


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    uid: int
    create_time: float
    exe: str

    @classmethod
    def of(cls, pid: int, uid: int) -> "ProcessIdentity | None":
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                ctime = proc.create_time()
                try:
                    exe = proc.exe()
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    exe = ""
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        return cls(pid, uid, ctime, exe)

    def alive(self) -> bool:
        """True while this exact process (not a successor with the same pid) runs."""
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.create_time and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False

    def same_process(self, other: "ProcessIdentity") -> bool:
        return (self.pid, self.create_time, self.exe, self.uid) == (
            other.pid, other.create_time, other.exe, other.uid)


def is_same_or_descendant(pid: int, ancestors: list[ProcessIdentity]) -> bool:
    """Is `pid` one of `ancestors` or a descendant of one (checked by create_time)?"""
    keys = {(a.pid, a.create_time) for a in ancestors}
    if not keys:
        return False
    try:
        proc: psutil.Process | None = psutil.Process(pid)
        while proc is not None:
            if (proc.pid, proc.create_time()) in keys:
                return True
            proc = proc.parent()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return False


def has_ancestor(pid: int, ancestor_pid: int) -> bool:
    """Is `ancestor_pid` a parent, grandparent, ... of `pid` right now? (checks a label's claim)"""
    try:
        return any(p.pid == ancestor_pid for p in psutil.Process(pid).parents())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
