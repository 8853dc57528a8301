"""An audit writer whose write failed for lack of room resumes once there is room, and only then.

What a user checks: the log verifies `intact` after a fill-and-free cycle, its chain goes on
from the last record the disk holds (the failed write's records are not there, no gap or
duplicate seq), a `log_resumed` record says what failed and how long, and appends work again.
A failed fdatasync or an I/O error is never resumed (after one the page cache's state is
unknown), nor is a log whose last bytes are not what the writer wrote.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_fixtures import EIO, ENOSPC, FlakyIO, LogFiles
from vault.audit import AuditWriter, decrypt_events, verify
from vault.audit_events import LogResumed
from vault.errors import AuditError


class FillingIO(FlakyIO):
    """A disk that takes part of a write and then has no room (`full`), as a real one does."""

    def __init__(self) -> None:
        super().__init__()
        self.full: int | None = None

    def write(self, fd: int, data: Any) -> int:
        if self.full is not None:
            if len(data) > 1 and os.fstat(fd).st_size % 2 == 0:
                return os.write(fd, bytes(data[: len(data) // 2]))  # the part that fit
            raise OSError(self.full, os.strerror(self.full))
        return super().write(fd, data)


def resumed_event(refused: int = 0) -> LogResumed:
    return LogResumed(failed="the failure", failed_at=1.0, halted_s=2.0, refused_calls=refused)


def writer(tmp_path: Path, io: Any, **options: Any) -> tuple[LogFiles, AuditWriter]:
    files = LogFiles(tmp_path / "audit.log", os.urandom(32), Ed25519PrivateKey.generate())
    return files, AuditWriter.open(files.log, files.key, files.signing_key, io=io, **options)


@pytest.mark.parametrize("why", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_write_without_room_resumes_once_there_is_room(tmp_path: Path, why: int) -> None:
    io = FillingIO()
    files, w = writer(tmp_path, io)
    for i in range(3):
        w.append_sync({"type": "x", "i": i})
    on_disk = files.log.read_bytes()
    io.full = why
    with pytest.raises(AuditError, match=errno.errorcode[why]):
        w.append_sync({"type": "x", "i": "lost"})
    assert w.failed and w.resumable
    assert on_disk == files.log.read_bytes()  # the part that fit was cut back
    # still no room: nothing written, still failed, and it may try again
    assert not w.resume(resumed_event())
    assert (True, True, on_disk) == (w.failed, w.resumable, files.log.read_bytes())
    with pytest.raises(AuditError):
        w.append_sync({"type": "x", "i": "refused"})
    io.full = None
    assert w.resume(resumed_event(refused=1))
    assert not w.failed and w.failure_reason is None
    w.append_sync({"type": "x", "i": 3})
    w.close()
    assert "intact" == verify(files.log).status
    events = decrypt_events(files.log, files.key)
    assert list(range(len(events))) == [e["seq"] for e in events]
    assert [0, 1, 2, None, 3] == [e.get("i") for e in events]
    resumed = events[3]
    assert ("log_resumed", "the failure", 2.0, 1) == (resumed["type"], resumed["failed"], resumed["halted_s"],
                                                      resumed["refused_calls"])


def test_a_head_file_without_room_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head file could not be replaced (no room): nothing of the log was lost; once there
    is room the head file is written again and the log verifies."""
    from vault.audit import files as F
    files, w = writer(tmp_path, FlakyIO(), head_every_records=1)
    w.append_sync({"type": "x"})
    real = F.atomic_write

    def no_room(*a: Any, **k: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(F, "atomic_write", no_room)
    with pytest.raises(AuditError, match="head file.*ENOSPC"):
        w.append_sync({"type": "x"})
    assert w.resumable and not w.resume(resumed_event())
    monkeypatch.setattr(F, "atomic_write", real)
    assert w.resume(resumed_event())
    w.close()
    assert "intact" == verify(files.log).status
    assert "log_resumed" == decrypt_events(files.log, files.key)[-1]["type"]


@pytest.mark.parametrize("fault", ["fdatasync", "write"])
def test_an_io_error_or_a_failed_fdatasync_is_never_resumed(tmp_path: Path, fault: str) -> None:
    """fdatasync ENOSPC (some file systems report a full disk there) or EIO, or a write's EIO:
    halted for good, even once the device works again; nothing more is written."""
    io = FlakyIO()
    files, w = writer(tmp_path, io)
    w.append_sync({"type": "x"})
    if fault == "fdatasync":
        io.fail_fdatasync = ENOSPC
    else:
        io.fail_write = EIO
    with pytest.raises(AuditError):
        w.append_sync({"type": "x"})
    io.fail_fdatasync = io.fail_write = None
    size = files.log.stat().st_size
    assert w.failed and not w.resumable
    assert not w.resume(resumed_event())
    assert w.failed and size == files.log.stat().st_size
    w.close()


def test_a_log_changed_behind_the_writer_is_not_resumed(tmp_path: Path) -> None:
    """While failed, its last record was rewritten: the segment no longer ends with what the
    writer wrote, so it stays failed for good, saying why."""
    io = FlakyIO()
    files, w = writer(tmp_path, io)
    w.append_sync({"type": "x"})
    io.fail_write = ENOSPC
    with pytest.raises(AuditError):
        w.append_sync({"type": "x"})
    io.fail_write = None
    data = bytearray(files.log.read_bytes())
    data[-5] = ord("0") if data[-5] != ord("0") else ord("1")
    with open(files.log, "r+b") as f:
        f.write(bytes(data))
    assert not w.resume(resumed_event())
    assert not w.resumable and "not resumed" in (w.failure_reason or "")
    w.close()


def test_a_cut_back_that_failed_is_finished_before_resuming(tmp_path: Path) -> None:
    """The failed write's part stayed (its cut-back failed): resuming cuts it, so the chain
    goes on from the last whole record and the log verifies intact."""
    io = FlakyIO()
    files, w = writer(tmp_path, io)
    w.append_sync({"type": "x"})
    io.fail_write = ENOSPC
    with pytest.raises(AuditError):
        w.append_sync({"type": "x"})
    with open(files.log, "ab") as f:
        f.write(b'{"seq":2,"time":1')  # what a write the disk took only part of leaves
    io.fail_write = None
    assert w.resume(resumed_event())
    w.close()
    assert "intact" == verify(files.log).status


async def test_a_record_staged_before_a_resume_is_never_told_durable(tmp_path: Path) -> None:
    """The head file fails for room (off the loop) just after an append staged its record and
    before its flush; the log resumes and reuses that seq for its `log_resumed` record. The
    append is told the log failed: its record was never written, so it must not read as durable
    (an intent said durable and absent is an unaudited call)."""
    files, w = writer(tmp_path, FlakyIO(), inline_limit_s=0)
    w.append_sync({"type": "x"})
    task = asyncio.ensure_future(w.append({"type": "x", "i": "dropped"}))
    await asyncio.sleep(0)  # staged; its flush is scheduled, not run
    assert 2 == w.next_seq  # seq 1 staged, not written
    w._fail(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "updating the head file")
    assert w.resumable and w.resume(resumed_event())
    with pytest.raises(AuditError, match="before this record was written"):
        await task
    w.close()
    assert "intact" == verify(files.log).status
    assert "dropped" not in [e.get("i") for e in decrypt_events(files.log, files.key)]


class FullPastIO(FlakyIO):
    """No room for a segment past `limit` bytes while `armed` (a rotation's first write)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.armed = limit, True

    def write(self, fd: int, data: Any) -> int:
        if self.armed and os.fstat(fd).st_size >= self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(fd, data)


def test_a_rotation_without_room_resumes_and_rotates_once_there_is_room(tmp_path: Path) -> None:
    """The segment is full and its rotation's first write (the head that closes it) finds no
    room: cut back, halted. With room the log resumes in that segment, the next append rotates,
    and the set of segments verifies intact."""
    io = FullPastIO(4096)
    files, w = writer(tmp_path, io, segment_bytes=4096)
    with pytest.raises(AuditError, match="rotating: write.*ENOSPC"):
        for i in range(100):
            w.append_sync({"type": "x", "i": i, "pad": "p" * 200})
    assert w.resumable
    io.armed = False
    assert w.resume(resumed_event())
    w.append_sync({"type": "x", "i": "after"})
    w.close()
    assert [] != sorted(tmp_path.glob("audit.0*.log"))  # it rotated
    assert "intact" == verify(files.log).status
    events = decrypt_events(files.log, files.key)
    assert list(range(len(events))) == [e["seq"] for e in events]
    assert ["log_resumed", "segment_started"] == [e["type"] for e in events if e["type"] != "x"]
    assert "after" == [e for e in events if e["type"] == "x"][-1]["i"]


class NoRoomForNewIO(FlakyIO):
    """No room for a new file's first bytes while `armed`: a rotation's next segment."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def write(self, fd: int, data: Any) -> int:
        if self.armed and os.fstat(fd).st_size == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(fd, data)


@pytest.mark.parametrize("step", ["head file", "next segment"])
def test_a_rotation_whose_later_step_had_no_room_resumes_losing_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """The segment's closing records were written and synced, then the head file (or the next
    segment's first bytes) found no room. Every record written stays (none cut), the log resumes
    in that segment once there is room, the next append rotates, and the set verifies intact."""
    from vault.audit import files as F
    io = NoRoomForNewIO()
    files, w = writer(tmp_path, io, segment_bytes=4096)
    real = F.atomic_write

    def no_room(*a: Any, **k: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    w.append_sync({"type": "x", "i": -1, "pad": "p" * 200})  # the first head file is written
    written = [-1]
    if step == "head file":
        monkeypatch.setattr(F, "atomic_write", no_room)
    else:
        io.armed = True
    with pytest.raises(AuditError, match="rotating: .*ENOSPC"):
        for i in range(100):
            w.append_sync({"type": "x", "i": i, "pad": "p" * 200})
            written.append(i)
    assert w.resumable, w.failure_reason
    assert [] == sorted(tmp_path.glob("audit.0*.log"))  # not rotated
    monkeypatch.setattr(F, "atomic_write", real)
    io.armed = False
    assert w.resume(resumed_event())
    w.append_sync({"type": "x", "i": "after"})
    w.close()
    assert [] != sorted(tmp_path.glob("audit.0*.log"))  # it rotated
    assert "intact" == verify(files.log).status
    events = decrypt_events(files.log, files.key)
    assert list(range(len(events))) == [e["seq"] for e in events]
    assert [*written, "after"] == [e["i"] for e in events if e["type"] == "x" and e["i"] != i]
    assert "log_resumed" in [e["type"] for e in events]
