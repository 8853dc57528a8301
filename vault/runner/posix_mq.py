"""Without a jail, what an agent left in POSIX message queues (`mq_open`, `mq_send`).

Why: an unjailed agent handed a credential made a queue named by it, or sent it into one, and
exited: the queue outlives every process (until `mq_unlink` or a reboot) and any process of the
user opens it by name; the files, processes and System V IPC the scan read (vault.runner.sysv_ipc)
hold none of it. In a jail IPC is private (bwrap `--unshare-all`) and goes with it.

Queues are listed in an mqueue filesystem: /dev/mqueue where it is mounted, else one mounted in a
private mount namespace of a helper process (this module run as a program: a process of its own,
as unshare(2) refuses a mount namespace to a threaded one), which needs root. Each queue changed
since the trial's first agent started (its times) is read without losing anything: its messages
are received and sent back at once in the order they came (highest priority first, each priority
in its order), so it holds the same messages. Its name is read with them, and never printed: a
finding names a queue by its place in the list.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

MOUNTED = "/dev/mqueue"
QUEUES_MOST = 200
BYTES_MOST = 64 << 20  # all messages read, together
HELPER_TIMEOUT_S = 20.0
# an mqueue's times come from the kernel's coarse clock, a tick behind time.time(): a queue made just
# as the agent started can read as older (only this trial's credentials are looked for in what is read)
CLOCK_SLACK_S = 1.0
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


class _Attr(ctypes.Structure):
    _fields_ = [("mq_flags", ctypes.c_long), ("mq_maxmsg", ctypes.c_long), ("mq_msgsize", ctypes.c_long),
                ("mq_curmsgs", ctypes.c_long), ("_pad", ctypes.c_long * 4)]


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    rt = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1", use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int]
    rt.mq_receive.restype = ctypes.c_ssize_t
    rt.mq_receive.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint)]
    rt.mq_send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint]
    rt.mq_getattr.argtypes = [ctypes.c_int, ctypes.POINTER(_Attr)]
    return libc, rt


def _mounted() -> bool:
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        return any(len(p) > 2 and p[1] == MOUNTED and p[2] == "mqueue" for p in (line.split() for line in f))
    return False


def _read(rt: ctypes.CDLL, name: str, budget: int) -> bytes | None:
    """The queue's messages, joined by newlines, put back as they were; None: not opened."""
    q = rt.mq_open(("/" + name).encode(), os.O_RDWR | os.O_NONBLOCK)
    if q < 0:
        return None
    try:
        attr = _Attr()
        if rt.mq_getattr(q, ctypes.byref(attr)) != 0 or attr.mq_msgsize <= 0:
            return None
        buf = ctypes.create_string_buffer(attr.mq_msgsize)
        prio = ctypes.c_uint()
        taken: list[tuple[bytes, int]] = []
        for _ in range(max(0, attr.mq_curmsgs)):
            n = rt.mq_receive(q, buf, attr.mq_msgsize, ctypes.byref(prio))
            if n < 0:
                break
            taken.append((buf.raw[:n], prio.value))
        for data, p in taken:  # back in the order they came: the same queue
            rt.mq_send(q, data, len(data), p)
        return b"\n".join(d for d, _ in taken)[:budget]
    finally:
        os.close(q)


def _scan(where: str, since: float) -> dict[str, Any]:
    _, rt = _libs()
    names: list[str] = []
    bodies: list[str] = []
    budget, past = BYTES_MOST, 0
    for entry in sorted(os.scandir(where), key=lambda e: e.name):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if max(st.st_mtime, st.st_ctime) < since - CLOCK_SLACK_S:
            continue
        if len(names) >= QUEUES_MOST or budget <= 0:
            past += 1
            continue
        names.append(entry.name)
        body = _read(rt, entry.name, budget)
        if body:
            budget -= len(body)
            bodies.append(base64.b64encode(body).decode())
    return {"names": [base64.b64encode(os.fsencode(n)).decode() for n in names], "bodies": bodies, "past": past}


def _helper(since: float) -> dict[str, Any]:
    """In a process of its own: the queues, through /dev/mqueue or an mqueue mounted here."""
    if _mounted():
        return _scan(MOUNTED, since)
    libc, _ = _libs()
    if libc.unshare(CLONE_NEWNS) != 0:
        return {"unread": os.strerror(ctypes.get_errno())}
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing mounted here is seen outside
        return {"unread": os.strerror(ctypes.get_errno())}
    where = tempfile.mkdtemp(prefix="vaultsim-mq-")
    try:
        if libc.mount(b"mqueue", where.encode(), b"mqueue", 0, None) != 0:
            return {"unread": os.strerror(ctypes.get_errno())}
        return _scan(where, since)
    finally:
        libc.umount2(where.encode(), 2)
        with contextlib.suppress(OSError):
            os.rmdir(where)


def left(since: float) -> tuple[dict[str, bytes], list[str]]:
    """label -> the names and messages of the queues changed since `since`; notes on what was not read.
    Where they cannot be listed (not root, or no mount namespace to list them in, and /dev/mqueue
    not mounted), nothing and no note: a queue there is found only by a process that knows its
    name, which the runner does not (the README's threat table says so)."""
    if not _mounted() and os.geteuid() != 0:
        return {}, []
    try:
        # -I: stdlib only, and not this directory on its path (vault.runner.select is no `select`)
        done = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), repr(since)], capture_output=True,
                              timeout=HELPER_TIMEOUT_S)
        got = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return {}, [f"POSIX message queues were not read ({type(e).__name__})"]
    if "unread" in got:  # no mount namespace or mqueue mount here (root without CAP_SYS_ADMIN): as not root
        return {}, []
    out: dict[str, bytes] = {}
    names = [base64.b64decode(n) for n in got.get("names", [])]
    if names:
        out["the names of POSIX message queues made or changed during the trial"] = b"\n".join(names)
    for index, body in enumerate(got.get("bodies", []), 1):
        out[f"a POSIX message queue's messages (queue {index} of those made or changed during the trial)"] = \
            base64.b64decode(body)
    notes = [f"{got['past']} POSIX message queue(s) past the scan's bounds were not read"] if got.get("past") else []
    return out, notes


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_helper(float(sys.argv[1]))))
