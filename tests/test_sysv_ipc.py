"""Without a jail, a credential an agent left in System V shared memory or a message queue is read
(vault.runner.sysv_ipc): such a segment outlives every process and any process of the user can
read it. Reading never changes it: the segment is attached read-only, a message copied (MSG_COPY)."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vault.runner import sysv_ipc

ROOT = Path(__file__).resolve().parent.parent

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
IPC_CREAT, IPC_RMID = 0o1000, 0


@pytest.fixture
def made() -> Iterator[list[tuple[str, int]]]:
    """IPC objects a test made, removed after it."""
    out: list[tuple[str, int]] = []
    yield out
    for kind, ident in out:
        (libc.shmctl if kind == "shm" else libc.msgctl)(ident, IPC_RMID, None)


def segment(made: list[tuple[str, int]], data: bytes) -> int:
    sid = libc.shmget(0, ctypes.c_size_t(4096), IPC_CREAT | 0o600)
    assert sid >= 0, ctypes.get_errno()
    made.append(("shm", sid))
    addr = libc.shmat(sid, None, 0)
    ctypes.memmove(addr, data, len(data))
    libc.shmdt(ctypes.c_void_p(addr))
    return sid


def queue(made: list[tuple[str, int]], *messages: bytes) -> int:
    qid = libc.msgget(0, IPC_CREAT | 0o600)
    assert qid >= 0, ctypes.get_errno()
    made.append(("msg", qid))
    for data in messages:
        buf = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + len(data))
        ctypes.c_long.from_buffer(buf).value = 1
        ctypes.memmove(ctypes.addressof(buf) + ctypes.sizeof(ctypes.c_long), data, len(data))
        assert libc.msgsnd(qid, buf, ctypes.c_size_t(len(data)), 0) == 0, ctypes.get_errno()
    return qid


def test_a_segment_made_since_is_read_and_left_as_it_was(made: list[tuple[str, int]]) -> None:
    since = time.time()
    sid = segment(made, b"ghp_canary_in_shared_memory")
    found, notes = sysv_ipc.left(since)
    label = next(k for k in found if f"(id {sid}," in k)
    assert label.startswith("a System V shared memory segment") and notes == []
    assert found[label].startswith(b"ghp_canary_in_shared_memory")
    again, _ = sysv_ipc.left(since)  # read-only: the same bytes a second time
    assert again[label] == found[label]


def test_a_segment_older_than_the_trial_is_not_read(made: list[tuple[str, int]]) -> None:
    sid = segment(made, b"someone else's")
    found, _ = sysv_ipc.left(time.time() + 2)  # a trial whose first agent started after it was made
    assert not any(f"(id {sid}," in k for k in found)


def test_an_older_segment_written_into_during_the_trial_is_read() -> None:
    """A segment made before the trial (its ctime older) that the agent attached and wrote into:
    its attach time tells. The times there are whole seconds of the kernel's coarse clock, and the
    scan reads from the second before the trial's start.

    Run in a private IPC namespace: any scan beside it (another test's trial) attaches every
    segment made since its own start, ours too, which moves the attach time this test reads."""
    out = subprocess.run(["unshare", "--ipc", sys.executable, "-c",
                          "import sys; sys.path[:0] = ['tests', '.']; import test_sysv_ipc as t; t.older_segment()"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"no private IPC namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "read"


def older_segment() -> None:
    """The test's body, alone in its IPC namespace."""
    made: list[tuple[str, int]] = []
    try:
        sid = segment(made, b"before the trial")
        since = max(times(sid).values()) + 2  # the trial's first agent started two seconds after it was used
        deadline = time.monotonic() + 10
        while time.time() < since and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the clock up to the trial's start
        assert not any(f"(id {sid}," in k for k in sysv_ipc.left(since)[0])  # unused since: not read
        addr = libc.shmat(sid, None, 0)
        ctypes.memmove(addr, b"ghp_canary_written_later", 24)
        libc.shmdt(ctypes.c_void_p(addr))
        assert times(sid)["atime"] >= since - 1  # the kernel's clock agrees it was used in the trial
        found, _ = sysv_ipc.left(since)
        assert next(v for k, v in found.items() if f"(id {sid}," in k).startswith(b"ghp_canary_written_later")
        print("read")
    finally:
        for _, ident in made:
            libc.shmctl(ident, IPC_RMID, None)


def times(sid: int) -> dict[str, int]:
    """The segment's row in /proc/sysvipc/shm, by its column names."""
    with open(sysv_ipc.SHM) as f:
        head = f.readline().split()
        row = next(dict(zip(head, map(int, line.split()))) for line in f if int(line.split()[1]) == sid)
    return {k: row[k] for k in ("atime", "dtime", "ctime")}


def test_a_queues_messages_are_copied_not_taken(made: list[tuple[str, int]]) -> None:
    since = time.time()
    qid = queue(made, b"first", b"ghp_canary_in_a_queue")
    found, notes = sysv_ipc.left(since)
    if any("MSG_COPY" in n for n in notes):
        pytest.skip("this kernel cannot copy a message without taking it (no CONFIG_CHECKPOINT_RESTORE)")
    label = next(k for k in found if f"(id {qid}," in k)
    assert label.startswith("a System V message queue") and found[label] == b"first\nghp_canary_in_a_queue"
    again, _ = sysv_ipc.left(since)  # still there: copied, not received
    assert again[label] == found[label]
