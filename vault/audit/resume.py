"""Resuming an audit writer whose write failed for lack of room, once there is room again.

Only the halted path imports this (`AuditWriter.resume`), so one call's path stays as it was.
Why it is safe: the failed write's bytes were cut back (`AuditWriter._cut_back`) and nothing
after it was written, so the segment still ends with the last record the writer wrote; that
is checked here byte for byte before anything new is appended. Records written before the
failure but not yet synced are synced first: a failed fdatasync here ends it for good, as
anywhere (after one the page cache's state is unknown). The chain goes on from the last
record on disk, and the ``log_resumed`` record is durable, with a signed head, before any
other record is accepted.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vault.audit import files as F
from vault.audit import records as R
from vault.audit.recovery import HeadRef

# `w` below is an AuditWriter (its private state: this module is its halted path), typed Any so
# that this module imports nothing of the writer, which imports it
AuditWriter = Any

log = logging.getLogger("vaultsim.audit")

TAIL_READ = 1 << 20  # more than any line: a record is at most MAX_EVENT_BYTES, base64'd, plus its frame
# free room a full disk must have again before a resume is tried: the resume record would fit
# in what the last page of the log has left, and the next call's records would not
MIN_FREE = 64 << 10


class NotWhole(Exception):
    """The segment does not end with the last record this writer wrote."""


def resume(w: AuditWriter, payload: bytes, room_errnos: frozenset[int]) -> bool:
    """See `AuditWriter.resume`. Holds the writer's locks (in its order) throughout: no other
    record is staged, written or synced meanwhile."""
    with w._slock, w._wlock:
        if w._fd_closed or not w.resumable:
            return False
        if not w._device and _free(w._fd) < MIN_FREE:
            return False  # still full: nothing tried, nothing written
        try:
            if not w._device:
                _cut_to_whole(w)
        except (NotWhole, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            return _for_good(w, f"not resumed: {why}")
        if not _sync(w, "resuming: fdatasync of the records written before the failure"):
            return False
        # is there room for the head file? (the failure may have been there) Rewrite it with
        # the newest head on disk, now durable: no record is appended until this fits
        if w._written_head is not None and not _publish(w, w._written_head, room_errnos):
            return False
        with w._lock:
            # the chain goes on from the last record on disk: what was staged after it is gone
            # (its callers were told the log failed)
            w._pending = []
            w._generation += 1  # whoever still waits on a dropped record is told it failed
            last, tip = w._written_seq, w._written_tip
            w._next_seq, w._prev = last + 1, (tip[1] if tip is not None else R.GENESIS)
            w._staged_head = w._written_head
            w._head_seq = w._written_head.seq if w._written_head is not None else -1
            t = w._clock_time()
            seq = w._next_seq
            lines = [w._record(payload, t)]
            w._stage_head(t)
            head = w._staged_head
            assert head is not None
            lines.append(head.line)
            tip = (seq, w._prev)
        joined = b"".join(lines)
        data = memoryview(joined)
        try:
            while data:
                data = data[w._io.write(w._fd, data):]
        except OSError as exc:
            w._cut_back(w._fd)
            if exc.errno in room_errnos:
                return False  # still no room: cut back, still halted; the next try starts over
            return _for_good(w, f"not resumed: writing its record: {exc.strerror}")
        w._size += len(joined)
        w._writes += 1
        w._written_seq, w._written_head, w._written_tip = seq, head, tip
        if not _sync(w, "resuming: fdatasync"):
            return False
        if not _publish(w, head, room_errnos):
            return False  # the record is durable; the head file gets the next try's head
        with w._lock:
            was = w._failure
            w._failure, w._failed_at, w._room = None, None, False
        log.warning("audit log %s resumed at seq %d after it failed: %s", w.path, seq, was)
        return True


def _free(fd: int) -> int:
    """Bytes this process may still use on the log's file system: root may use the blocks
    reserved for it too (ext4's 5%), so a root daemon needs only its own room back. A quota is
    not seen here: its EDQUOT comes from the write, which then fails and is cut back."""
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return MIN_FREE  # not known: the write itself is the test
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _cut_to_whole(w: AuditWriter) -> None:
    """The segment must be exactly the bytes written before the failure, ending with the last
    record (or head) written: cut what a failed cut-back left, refuse anything else."""
    size = os.fstat(w._fd).st_size
    if size > w._size:  # the cut-back itself failed then: shrinking needs no room
        os.ftruncate(w._fd, w._size)
        size = os.fstat(w._fd).st_size
    if size != w._size:
        raise NotWhole(f"the segment is {size} bytes, {w._size} were written: changed behind the daemon")
    if size == 0:
        if w._written_tip is not None:
            raise NotWhole("the segment is empty, records were written to it")
        return
    n = min(size, TAIL_READ)
    tail = os.pread(w._fd, n, size - n)
    if not tail.endswith(b"\n"):
        raise NotWhole("the segment does not end with a whole line")
    line = tail[:-1].rsplit(b"\n", 1)[-1]
    tip = w._written_tip
    if line.startswith(R.HEAD_START):  # the head this writer signed, byte for byte
        head = w._written_head
        ok = head is not None and tip is not None and head.line == line + b"\n" and head.seq == tip[0]
    else:  # a record whose hash matches its text and is the chain's tip
        rec = R.parse_record(line)
        ok = rec is not None and tip is not None and (rec.seq, rec.hash) == tip
    if not ok:
        raise NotWhole(f"its last line is not the last record written (seq {tip[0] if tip else None})")


def _sync(w: AuditWriter, what: str) -> bool:
    try:
        w._io.fdatasync(w._fd)
    except OSError as exc:
        return _for_good(w, f"not resumed: {what}: {exc.strerror}")
    w._synced_writes = w._writes
    w._durable_seq, w._durable_head, w._durable_tip = w._written_seq, w._written_head, w._written_tip
    w._unsynced_at = None
    return True


def _publish(w: AuditWriter, head: HeadRef, room_errnos: frozenset[int]) -> bool:
    """Replace the head file with `head` (durable in the log). False without room (still
    halted), or for good on any other error."""
    with w._hlock:
        try:
            F.atomic_write(R.head_path(w.path), head.line)
        except OSError as exc:
            if exc.errno in room_errnos:
                return False
            return _for_good(w, f"not resumed: updating the head file: {exc.strerror}")
        w._published_seq = max(w._published_seq, head.seq)
    return True


def _for_good(w: AuditWriter, why: str) -> bool:
    """The log cannot be resumed: it stays failed, saying why, and is never tried again."""
    with w._lock:
        w._room = False
        if w._failure is not None and why not in w._failure:
            w._failure = f"{w._failure}; {why}"
    log.error("audit log %s: %s", w.path, why)
    return False

