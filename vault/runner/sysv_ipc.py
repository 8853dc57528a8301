"""Without a jail, what an agent left in System V shared memory and message queues.

Why: an unjailed agent handed a credential put it in a shared memory segment (`shmget`, or
Python's `sysv_ipc`) or a message queue and exited: the segment outlives every process (until
`ipcrm` or a reboot), any process of the user can read it, and the scan read files and processes
only. In a jail IPC is private (bwrap `--unshare-all`) and goes with it.

Each segment and queue made or used since the trial's first agent started (`/proc/sysvipc`: its
times) is read without changing it: a segment attached read-only, a queue's messages copied
(`MSG_COPY`, which needs a kernel built with checkpoint/restore: without it a queue's messages
are not read, and the report says so). Only this trial's credentials are looked for, so another
process's segments cannot fail it; the bounds are named, not graded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
from typing import Iterator

SHM = "/proc/sysvipc/shm"
MSG = "/proc/sysvipc/msg"
BYTES_MOST = 64 << 20  # all segments and messages read, together
MESSAGES_MOST = 1_000  # messages copied per queue
MESSAGE_BYTES = 64 << 10  # the most one message may carry (a queue's default is 8 KiB in all)
_TIMES = ("ctime", "atime", "dtime", "stime")  # made or set; attached, detached (shm); sent to (msg)
SHM_RDONLY = 0o10000
IPC_NOWAIT = 0o4000
MSG_NOERROR = 0o10000
MSG_COPY = 0o40000

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.shmat.restype = ctypes.c_void_p
        lib.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.shmdt.argtypes = [ctypes.c_void_p]
        lib.msgrcv.restype = ctypes.c_ssize_t
        lib.msgrcv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long, ctypes.c_int]
        _libc = lib
    return _libc


def _rows(path: str, since: float) -> Iterator[dict[str, int]]:
    """The table's rows made or used at or after `since`: an older segment attached (written into)
    or an older queue sent to counts too (a scan's own attach makes a later trial read it again,
    which finds nothing of that trial's)."""
    try:
        with open(path) as f:
            head = f.readline().split()
            for line in f:
                cells = line.split()
                if len(cells) != len(head):
                    continue
                try:
                    row = {k: int(v) for k, v in zip(head, cells)}
                except ValueError:
                    continue
                # whole seconds there, and from the kernel's coarse clock, which can lag the
                # precise one a tick or more: a second early (only this trial's credentials are
                # looked for, so reading one more second's segments cannot fail it)
                if max(row.get(k, 0) for k in _TIMES) >= int(since) - 1:
                    yield row
    except OSError:
        return


def _segment(shmid: int, size: int) -> bytes | None:
    c = _c()
    addr = c.shmat(shmid, None, SHM_RDONLY)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return None
    try:
        return ctypes.string_at(addr, size)
    finally:
        c.shmdt(addr)


def _messages(msqid: int, count: int, budget: int) -> tuple[list[bytes], bool]:
    """Copies of the queue's first `count` messages (their text); whether copying works here."""
    c = _c()
    buf = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + MESSAGE_BYTES)
    out: list[bytes] = []
    for index in range(min(count, MESSAGES_MOST)):
        n = c.msgrcv(msqid, buf, MESSAGE_BYTES, index, IPC_NOWAIT | MSG_COPY | MSG_NOERROR)
        if n < 0:
            return out, ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL)
        out.append(buf.raw[ctypes.sizeof(ctypes.c_long):ctypes.sizeof(ctypes.c_long) + n])
        budget -= n
        if budget <= 0:
            break
    return out, True


def left(since: float) -> tuple[dict[str, bytes], list[str]]:
    """label -> the bytes of each segment and queue changed since `since`; notes on what was not read."""
    out: dict[str, bytes] = {}
    notes: list[str] = []
    budget, past, uncopied = BYTES_MOST, 0, 0
    for row in _rows(SHM, since):
        size = row.get("size", 0)
        if size > budget:
            past += 1
            continue
        data = _segment(row["shmid"], size)
        if data is not None:
            budget -= size
            out[f"a System V shared memory segment (id {row['shmid']}, key {row.get('key', 0):#x})"] = data
    for row in _rows(MSG, since):
        if not row.get("qnum"):
            continue
        if budget <= 0:
            past += 1
            continue
        messages, copied = _messages(row["msqid"], row["qnum"], budget)
        if not copied:
            uncopied += 1
            continue
        budget -= sum(len(m) for m in messages)
        out[f"a System V message queue (id {row['msqid']}, key {row.get('key', 0):#x})"] = b"\n".join(messages)
    if past:
        notes.append(f"{past} System V shared memory segment(s) or message queue(s) past the scan's "
                     f"{BYTES_MOST >> 20} MiB were not read")
    if uncopied:
        notes.append(f"{uncopied} System V message queue(s) holding messages were not read: this kernel "
                     "cannot copy a message without taking it (MSG_COPY)")
    return out, notes
