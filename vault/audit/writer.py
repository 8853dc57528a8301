"""The one writer of an audit log: exclusive, durable where it must be, fail closed.

Why this shape: a call's intent must be on disk (fdatasync) before the
credential leaves the vault, its result must be written (in the kernel, safe
from a crash of this process) before the agent is answered, fdatasync is slow
and blocking, and the daemon appends from many tasks at once. So an append
has three steps, and each caller waits only for the ones it needs:

1. *stage* (in the caller, under a lock): assign the next seq, encrypt the
   event, chain and hash the record, queue its line in memory. Seqs are
   assigned only here, so they are strictly increasing with no gap and no
   duplicate, and lines are queued in seq order.
2. *write*: take every queued line and write them with one write(2). File
   order is queue order (one write at a time). After it, a crash or SIGKILL of
   this process cannot lose them; a power loss can.
3. *sync*: one fdatasync covers everything written before it started; then
   every waiter whose seq is now durable is woken (group commit).

The three ways in:

* ``append`` (durable): waits for its sync. An async append does not flush
  itself: the first one schedules a flush with ``call_soon``, so it runs after
  every task already ready to run, and the records those tasks stage share its
  fdatasync. When every operation in progress is waiting for that flush and
  the disk is fast, it runs right there in the loop thread: nothing else needs
  the loop, and a round trip to a thread costs about as much again as the sync
  in wake-ups (0.1 ms on the reference machine). The caller says how many
  operations need the loop (`in_flight`): the daemon does not count a call
  waiting on its remote or on a person. Otherwise the writer's own flush
  thread syncs while the other operations use the loop, and hands back once
  they all wait too. Once two syncs in the loop thread within 10 s have
  taken longer than ``inline_limit_s`` (a slow, busy or failing disk), or one
  ten times longer, the flushes run in the flush thread for a while (10 s,
  doubling each time, at most 10 minutes), so the loop (status, lock,
  approvals) does not wait on that disk again soon, and a disk that only
  hiccuped gets the fast path back. One slow sync alone moves nothing: on a
  busy host it is mostly the loop thread waiting for a core after the sync,
  and moving every flush to the thread for 10 s for it cost each of them a
  round trip to the thread.
* ``append_answer`` (the record an answer waits for): with durability
  ``default`` it is written before it returns, and becomes durable with the
  next sync: the next durable append's, or the flush timer's, at most
  ``flush_after_s`` (5 ms) after it was written. With ``strict`` it is an
  ``append``. Its write(2) runs in the loop thread even while a slow sync keeps
  the flushes in the thread (a write waits for the page cache, not the disk);
  a write slower than ``inline_limit_s`` sends them to a thread for 10 s.
* ``append_nowait``: staged only; written and synced with whatever comes next.
  For records that precede a durable one of the same call.

``append_sync`` stages, writes and syncs in the calling thread (CLI tools,
threads, tests).

What is appended: an event model (`vault.audit_events`, stored as its
``to_event()``: the daemon's producers build these, so their fields are checked
by mypy and by pydantic when built) or a dict. With ``check`` (what
`open_audit`, the daemon's sink, sets) a dict is checked against its model
before it is staged: an unknown ``type``, a misspelt or missing field is an
`AuditEventError` (an AuditError; nothing is written, the log stays usable).
``fields`` checks the shape only (about 1 us a record); ``full`` validates
every value too (tests and debugging: the daemon's sink uses it when
``VAULTSIM_AUDIT_CHECK=full``). ``off`` (the default of `AuditWriter.open`)
writes any JSON object: the log format does not depend on what the events say.

Protocol of one log (format: `records`; segment files: `files`):

* open: ``flock(LOCK_EX | LOCK_NB)`` on the active segment ``NAME.log``; held ->
  AuditError "audit log ... is held by another writer". Then `recovery`: a
  torn last line is cut, records no signed head covers yet are checked with
  the key (the rule `verify` reports as ``unanchored``), a cut behind
  ``NAME.head`` is refused, a rotation a crash interrupted is finished. If
  records were left unsigned or a torn line was cut, a ``log_recovered``
  record is appended and signed at once, re-anchoring the chain.
  ``NAME.pub`` is written if missing and must match.
* heads: a signed head line is queued right after a record when: it is the
  first record since open, or ``head_every_records`` records or
  ``head_every_seconds`` (by `clock`) have passed since the last head. An async
  writer also arms a timer so that an idle log is anchored within
  ``head_every_seconds``; close always signs the last record. Once a head is
  durable in the log, ``NAME.head`` is replaced with it (all or nothing, in the
  flush thread when the sync ran in the loop).
* rotation: once the active segment reaches ``segment_bytes``, the next sync
  (in the flush thread) signs its last record, syncs it, writes
  ``.NAME.log.next`` = that head line + a ``segment_started`` record, syncs it,
  renames ``NAME.log`` to ``NAME.<its first seq>.log`` and the new one to
  ``NAME.log``, and syncs the directory. With ``keep_segments`` set, the
  oldest rotated segments beyond that many are then removed; what remains
  still verifies, anchored by the head its first segment starts with.
* failure: any failed write, fdatasync, rotation or head-file update puts the
  writer in the ``failed`` state with ``failure_reason``; waiters of that
  flush get AuditError, and every later append raises AuditError at once. A
  failed fdatasync is never retried: after one, the kernel may have dropped
  the dirty pages, so a retry could "succeed" over lost data. The daemon must stop.
* resuming: a *write* that failed for lack of room (ENOSPC, EDQUOT, EFBIG: an
  append, a rotation's writes, the head file) lost nothing the disk holds:
  its bytes were cut back (a rotation's next segment is removed; its closing
  records, written and synced, stay). Such a writer is ``resumable``; `resume` checks the
  segment ends, byte for byte, with the last record written, syncs it, and
  appends a ``log_resumed`` record chained to that one, durable, before it
  accepts appends again. Without room it fails as before and stays failed.
* cancellation: an append cancelled while waiting may still be written (its
  record is already queued); it is simply not answered.

The I/O layer is injectable: `io` is any object with ``write(fd, data) -> int``
and ``fdatasync(fd)`` (default: the `os` module), so tests can fail them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic_core import to_json

from vault.audit_events import AuditEvent, LogRecovered, SegmentStarted, check_event, check_fields
from vault.errors import AuditError
from vault.audit import files as F
from vault.audit import records as R
from vault.audit import recovery as RC
from vault.audit.keys import check_data_key, ensure_public_key

MAX_EVENT_BYTES = 256 * 1024
DEFAULT_SEGMENT_BYTES = 64 << 20
Durability = Literal["default", "strict"]
EventCheck = Literal["off", "fields", "full"]
Event = AuditEvent | dict[str, Any]

log = logging.getLogger("vaultsim.audit")

INLINE_BACKOFF_S, INLINE_BACKOFF_MAX_S = 10.0, 600.0
INLINE_SLOW_ALONE = 10  # an inline sync this many times over the limit moves the flushes without a second
# a failed write with one of these lost nothing and may be resumed once there is room (EFBIG: a
# file-size limit, raised with prlimit, or the next segment); only for these steps, whose
# failed bytes are cut back or in a temp file that is gone
ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# where a lack of room lost nothing and may resume: a write cut back, or a file not yet in place
# (a rotation's head file and next segment: its records are written and synced, the next
# segment unlinked); never an fdatasync, and never the renames (the segment's name may be gone)
ROOM_STAGES = frozenset({"write", "rotating: write", "updating the head file", "rotating: updating the head file",
                         "rotating: starting the next segment"})
NONCE_POOL = 256  # nonces drawn from the OS at a time (one getrandom per 256 records, not per record)
_fork_generation = 0  # a forked child must not reuse nonces its parent drew


def _after_fork() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork)


class AuditWriter:
    """Appends events to one audit log. Build with `AuditWriter.open`."""

    def __init__(self, path: Path, fd: int, key: bytes, signing_key: Ed25519PrivateKey, *,
                 clock: Callable[[], float], io: Any, head_every_records: int,
                 head_every_seconds: float, tail: RC.Tail, monotonic: Callable[[], float] = time.monotonic,
                 inline_limit_s: float = 0.05, durability: Durability = "default",
                 flush_after_s: float = 0.005, segment_bytes: int | None = None,
                 keep_segments: int | None = None, device: bool = False,
                 check: EventCheck = "off") -> None:
        self.path = path
        self._check = {"off": None, "fields": check_fields, "full": check_event}[check]
        self.durability: Durability = durability
        self._fd = fd
        self._aes = AESGCM(bytes(key))
        self._signing_key = signing_key
        self._clock = clock
        self._io = io
        self._every_records = head_every_records
        self._every_seconds = head_every_seconds
        self._flush_after_s = flush_after_s
        self._segment_bytes = None if device else segment_bytes
        self._device = device
        self._keep = keep_segments
        # lock order: _slock, then _wlock, then _lock; _hlock alone or innermost
        self._lock = threading.Lock()  # chain state and the queue
        self._wlock = threading.Lock()  # the fd: one write at a time
        self._slock = threading.Lock()  # one fdatasync (or rotation) at a time
        self._hlock = threading.Lock()  # the head file
        # chain state, guarded by _lock
        self._next_seq = tail.next_seq
        self._prev = tail.prev
        self._head_seq = tail.head.seq if tail.head else -1  # last seq a head (written or queued) anchors
        self._head_time = 0.0
        self._headed = False  # has this writer signed a head yet?
        self._staged_head: RC.HeadRef | None = tail.head  # newest head queued (or found at open)
        self._pending: list[bytes] = []  # staged lines, in order
        self._nonces, self._nonce_at, self._nonce_gen = b"", 0, -1  # random bytes not yet used as nonces
        self._failure: str | None = None
        self._generation = 0  # one more at each resume (what was staged and not written is dropped)
        self._failed_at: float | None = None  # time.time() of the failure
        self._room = False  # the failure was a write without room: `resume` may lift it
        self._closing = False
        self._abandoned: str | None = None  # why nothing more is written by path (abandon)
        # the file, guarded by _wlock (written) and _slock (durable)
        self._written_seq = tail.next_seq - 1
        self._written_head = tail.head
        self._writes = 0  # non-empty writes so far; a sync covers the ones before it
        self._synced_writes = 0
        # time.monotonic() of the oldest write no sync covers yet (None: every write is durable):
        # the flush timer syncs only once that write has waited flush_after_s
        self._unsynced_at: float | None = None
        self._durable_seq = tail.next_seq - 1
        # the newest record (seq, hash) written / durable: its hash commits to every record before it
        self._written_tip = self._durable_tip = (tail.next_seq - 1, tail.prev) if tail.next_seq > 0 else None
        self._durable_head = tail.head
        self._published_seq = tail.head.seq if tail.head else -1  # the head file's (as far as we know)
        self._size = tail.size
        self._first_seq = tail.first_seq
        self._rotate_due = bool(self._segment_bytes and tail.size >= self._segment_bytes)
        self._fd_closed = False
        # async side, touched only from the event loop
        self._waiters: list[tuple[int, asyncio.Future[int], int]] = []  # (seq, future, generation)
        self._sync_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None  # the idle-head timer
        self._flush_timer: asyncio.TimerHandle | None = None  # makes written answers durable
        self._executor: ThreadPoolExecutor | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._monotonic = monotonic
        self._inline_limit_s = inline_limit_s
        # flush in the loop thread unless a sync proved slow lately (a limit <= 0: never inline)
        self._inline = inline_limit_s > 0
        self._inline_again_at = 0.0  # by `monotonic`: after a slow inline sync, the thread until then
        self._inline_backoff_s = INLINE_BACKOFF_S
        self._slow_at: float | None = None  # by `monotonic`: the last slow inline sync that moved nothing yet
        self._write_again_at = 0.0  # by `monotonic`: after a slow inline write, answers write from a thread until then
        self._in_flight = 1  # the caller's operations in progress, as its newest append said

    # ---- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], key: bytes, signing_key: Ed25519PrivateKey, *,
             clock: Callable[[], float] = time.time, io: Any = os,
             head_every_records: int = 1000, head_every_seconds: float = 5.0,
             monotonic: Callable[[], float] = time.monotonic, inline_limit_s: float = 0.05,
             durability: Durability = "default", flush_after_s: float = 0.005,
             segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
             keep_segments: int | None = None, check: EventCheck = "off") -> "AuditWriter":
        """Lock `path` (created 0600 if missing), recover its tail, continue its chain.

        `durability`: ``default`` (an answer's record is written before the
        answer, synced within `flush_after_s`) or ``strict`` (synced before the
        answer). `segment_bytes`: rotate the active segment past this size
        (None: never). `keep_segments`: rotated segments to keep (None: all).
        `check`: how a dict event is checked against its model (see the module doc).
        """
        check_data_key(key)
        if not isinstance(signing_key, Ed25519PrivateKey):
            raise AuditError("the audit signing key must be an Ed25519 private key")
        if head_every_records < 1 or not head_every_seconds > 0:
            raise AuditError("head_every_records and head_every_seconds must be positive")
        if durability not in ("default", "strict"):
            raise AuditError(f"durability must be 'default' or 'strict', not {durability!r}")
        if not 0 < flush_after_s <= 1:
            raise AuditError("flush_after_s must be more than 0 and at most 1 second")
        if segment_bytes is not None and segment_bytes < 4096:
            raise AuditError("segment_bytes must be at least 4096")
        if keep_segments is not None and keep_segments < 1:
            raise AuditError("keep_segments must be at least 1")
        if check not in ("off", "fields", "full"):
            raise AuditError(f"check must be 'off', 'fields' or 'full', not {check!r}")
        path = Path(path)
        existed = os.path.lexists(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AuditError(f"cannot open audit log {path}: {exc.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AuditError(f"audit log {path} is held by another writer") from None
            device = stat.S_ISCHR(os.fstat(fd).st_mode)
            if not device:
                RC.remove_stale_next(path)
            tail = RC.Tail() if device else RC.recover(path, fd, key, signing_key)
            if not existed:
                F.fsync_dir(path.parent)
            ensure_public_key(R.pub_path(path), signing_key.public_key())
        except BaseException:
            os.close(fd)
            raise
        w = cls(path, fd, key, signing_key, clock=clock, io=io,
                head_every_records=head_every_records, head_every_seconds=head_every_seconds,
                tail=tail, monotonic=monotonic, inline_limit_s=inline_limit_s, durability=durability,
                flush_after_s=flush_after_s, segment_bytes=segment_bytes, keep_segments=keep_segments,
                device=device, check=check)
        try:
            w._settle_recovery(tail)
        except BaseException:
            w.close()
            raise
        return w

    def _settle_recovery(self, tail: RC.Tail) -> None:
        """Start an empty active segment after a rotation, and re-anchor what a dead
        writer left unsigned, before anything new is appended."""
        if tail.carry is not None:
            with self._lock:
                self._pending.append(tail.carry.line)
            self.append_sync(SegmentStarted(after_crash=True))
        if tail.unanchored or tail.torn:
            self.append_sync(LogRecovered(unanchored_records=tail.unanchored, torn_bytes=tail.torn))
            found = [f"{tail.unanchored} record(s) its last writer did not sign (checked with the key, "
                     "now anchored)"] if tail.unanchored else []
            found += [f"a torn last line ({tail.torn} bytes, never acknowledged) cut away"] if tail.torn else []
            log.warning("audit log %s recovered: %s", self.path, "; ".join(found))

    # ---- the public surface --------------------------------------------------

    async def append(self, event: Event, *, in_flight: int = 1) -> int:
        """Append `event`; returns its seq once the record is durable. AuditError if not.

        The flush is not done here but in a callback scheduled after every task
        that is ready to run now, so the appends those tasks make share its
        fdatasync (group commit). `in_flight`: how many of the caller's
        operations are in progress, this one included. When all of them are
        waiting for this flush, nothing else needs the loop meanwhile, so a
        fast disk is synced inline; otherwise the sync goes to the flush
        thread and the others run while it waits.
        """
        loop = self._bind(asyncio.get_running_loop())
        seq, gen = self._stage(self._encode(event))
        fut: asyncio.Future[int] = loop.create_future()
        self._waiters.append((seq, fut, gen))
        self._in_flight = in_flight
        self._schedule_flush(loop)
        return await fut

    async def append_answer(self, event: Event, *, in_flight: int = 1) -> int:
        """Append the record an answer waits for; returns its seq. AuditError if it cannot be.

        ``strict``: durable on return, as `append`. ``default``: written on
        return (a crash or SIGKILL of this process cannot lose it), durable
        with the next sync, which the flush timer starts at most
        `flush_after_s` later if no durable append comes first.
        """
        if self.durability == "strict":
            return await self.append(event, in_flight=in_flight)
        loop = self._bind(asyncio.get_running_loop())
        seq, gen = self._stage(self._encode(event))
        if not (self._loop_may_write() and self._write_inline()):
            # the file is busy (a rotation in the flush thread) or a write was slow lately:
            # write from a thread, so the loop waits on neither
            await loop.run_in_executor(None, self._write)
        self._check_generation(gen)
        if self._flush_timer is None and self._durable_seq < seq:
            self._flush_timer = loop.call_later(self._flush_after_s, self._on_flush_timer)
        return seq

    def append_nowait(self, event: Event) -> int:
        """Queue `event` in order without waiting: it is written and synced with the next
        flush (the next `append` or `append_answer`, or a timer). For records that precede
        a durable one in the same call, so one fdatasync covers the whole call."""
        seq, _ = self._stage(self._encode(event))
        loop = self._bind(asyncio.get_running_loop())
        if self._flush_timer is None:
            self._flush_timer = loop.call_later(self._flush_after_s, self._on_flush_timer)
        return seq

    def append_sync(self, event: Event) -> int:
        """Blocking `append` (its own write and sync), for CLI tools, threads and tests."""
        seq, gen = self._stage(self._encode(event))
        self._flush(publish=True)
        self._check_generation(gen)
        return seq

    def signed_head(self) -> dict[str, Any] | None:
        """The newest signed head that is durable in the log: ``{"seq", "hash"}``, or None."""
        head = self._durable_head
        return None if head is None else {"seq": head.seq, "hash": head.hash.decode()}

    def durable_tip(self) -> dict[str, Any] | None:
        """The newest record durable in the log, ``{"seq", "hash"}``, or None yet: its hash
        commits to every record before it, signed or not yet. A runner compares it (and
        `signed_head`) with the log on disk to catch a log rewritten behind the daemon's back."""
        tip = self._durable_tip
        return None if tip is None else {"seq": tip[0], "hash": tip[1].decode()}

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def failure_reason(self) -> str | None:
        return self._failure

    @property
    def failed_at(self) -> float | None:
        """When the log failed (time.time()), while it is failed."""
        return self._failed_at if self._failure is not None else None

    @property
    def resumable(self) -> bool:
        """Failed for lack of room only: `resume` may lift it once there is room."""
        return self._failure is not None and self._room and not (self._closing or self._abandoned)

    def resume(self, event: Event) -> bool:
        """Blocking (a thread): lift a failure for lack of room, if there is room now. True once
        `event` (a ``log_resumed``) is durable, chained to the last record on disk, and appends
        are accepted again; False while there is still no room, or for good when the failure is
        not one a resume may lift (`resumable` then says so)."""
        from vault.audit.resume import resume  # only a halted writer needs it

        return resume(self, self._encode(event), ROOM_ERRNOS)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def abandon(self, why: str) -> None:
        """The log's directory left its path (the home unmounted, moved): write and sync what is
        staged through the open descriptor, then accept nothing more. Nothing is written by path
        from here on (no head file, no rotation), as it would land in whatever directory now has
        the name; `close` then only releases the file. Its next start signs the unsigned tail."""
        with self._lock:
            if self._failure is not None or self._closing or self._abandoned is not None:
                return
            # from here: no new record, no head file, no rotation (checked under the same lock)
            self._abandoned = f"audit log {self.path}: {why}; no further records are accepted"
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._end_abandoned()
        else:  # the write and fdatasync block on a stalled disk: never in the loop thread
            loop.run_in_executor(None, self._end_abandoned)

    def _end_abandoned(self) -> None:
        with contextlib.suppress(AuditError):
            self._flush(publish=False, rotate=False)
        with self._lock:
            if self._failure is None:
                self._failure = self._abandoned

    def close(self) -> None:
        """Write and sync what is queued, sign the last record, release the lock.

        Raises AuditError only if that last flush fails (a writer that had
        already failed just releases the file). Idempotent.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._failure is None and self._abandoned is None and self._next_seq - 1 > self._head_seq:
                try:
                    self._stage_head(self._clock_time())
                except ValueError as exc:
                    self._fail(exc, "reading the clock")
            ending_abandoned = self._failure is None and self._abandoned is not None
            failed_before = self._failure or self._abandoned  # abandoned: its own flush, nothing by path
        for timer in (self._timer, self._flush_timer):  # close runs in the loop thread (or after it)
            if timer is not None:
                timer.cancel()
        self._timer = self._flush_timer = None
        try:
            if failed_before is None:
                self._flush(publish=True)
            elif ending_abandoned:  # its thread may not have written them yet: before the fd closes
                self._end_abandoned()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            with self._slock, self._wlock:
                if not self._fd_closed:
                    self._fd_closed = True
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                    finally:
                        os.close(self._fd)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "AuditWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- staging (caller's thread) ------------------------------------------

    def _encode(self, event: Event) -> bytes:
        if isinstance(event, AuditEvent):
            return _encode_event(event.to_event())
        if self._check is not None and isinstance(event, dict):
            self._check(event)
        return _encode_event(event)

    def _stage(self, payload: bytes) -> tuple[int, int]:
        """Stage a record: its seq, and the writer's generation (a resume drops what was staged
        and not written, and reuses those seqs: `_check_generation`)."""
        with self._lock:
            if self._failure is not None or self._abandoned is not None:
                raise AuditError(self._failure or self._abandoned or "")
            if self._closing:
                raise AuditError(f"audit log {self.path} is closed")
            try:
                t = self._clock_time()
            except ValueError as exc:
                self._fail(exc, "reading the clock")
                raise AuditError(self._failure or "") from None
            seq = self._next_seq
            self._pending.append(self._record(payload, t))
            if (not self._headed or seq - self._head_seq >= self._every_records
                    or t - self._head_time >= self._every_seconds):
                self._stage_head(t)
            return seq, self._generation

    def _check_generation(self, gen: int) -> None:
        """AuditError if the log failed and resumed since that record was staged: it was dropped
        unwritten (its seq now names another record)."""
        if gen != self._generation:
            raise AuditError(f"audit log {self.path} failed before this record was written; it was not")

    def _record(self, payload: bytes, t: float) -> bytes:
        """Encrypt and chain the next record; returns its line (caller holds _lock)."""
        seq, time_b = self._next_seq, R.time_text(t)
        at = self._nonce_at
        if at >= len(self._nonces) or self._nonce_gen != _fork_generation:
            self._nonces, at, self._nonce_gen = os.urandom(R.NONCE_BYTES * NONCE_POOL), 0, _fork_generation
        nonce, self._nonce_at = self._nonces[at:at + R.NONCE_BYTES], at + R.NONCE_BYTES
        ct = self._aes.encrypt(nonce, payload, R.aad(b"%d" % seq, time_b, self._prev))
        line, self._prev = R.record_line(seq, time_b, self._prev, nonce, ct)
        self._next_seq = seq + 1
        return line

    def _stage_head(self, t: float) -> None:
        """Queue a signed head for the last staged record (caller holds _lock)."""
        seq = self._next_seq - 1
        message = R.head_message(seq, self._prev, R.time_text(t))
        head = RC.HeadRef(seq, self._prev, R.head_line(message, self._signing_key.sign(message)))
        self._pending.append(head.line)
        self._staged_head = head
        self._head_seq, self._head_time, self._headed = seq, t, True

    def _clock_time(self) -> float:
        t = float(self._clock())
        if not math.isfinite(t):
            raise ValueError("the clock returned a non-finite time")
        return t

    # ---- writing and syncing (any thread) -------------------------------------

    def _write(self, blocking: bool = True) -> bool:
        """Write everything staged so far, in order. False if `blocking` is off and the
        file is busy; AuditError if the log failed."""
        if not self._wlock.acquire(blocking):
            return False
        try:
            with self._lock:
                if self._failure is not None:
                    raise AuditError(self._failure)
                lines, self._pending = self._pending, []
                head, last = self._staged_head, self._next_seq - 1
                tip = (last, self._prev) if last >= 0 else None
            if lines and not self._fd_closed:
                data = lines[0] if len(lines) == 1 else b"".join(lines)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[self._io.write(self._fd, view):]
                except BaseException as exc:
                    self._fail(exc, "write")
                    self._cut_back(self._fd)
                    raise AuditError(self._failure or "audit log failed") from None
                self._size += len(data)
                self._writes += 1
                if self._unsynced_at is None:
                    self._unsynced_at = time.monotonic()
                if self._segment_bytes and self._size >= self._segment_bytes:
                    self._rotate_due = True
            self._written_seq, self._written_head, self._written_tip = last, head, tip
            return True
        finally:
            self._wlock.release()

    def _sync(self, rotate: bool = True) -> RC.HeadRef | None:
        """fdatasync what is written; rotate if due and `rotate`. Returns a head that is now
        durable and not yet in the head file (the caller publishes it). AuditError if the
        log failed."""
        with self._slock:
            with self._wlock:
                target, head, fd, writes = self._written_seq, self._written_head, self._fd, self._writes
                tip, taken_at = self._written_tip, time.monotonic()
                if self._fd_closed:
                    return None
            if self._failure is not None:
                raise AuditError(self._failure)
            if writes > self._synced_writes:
                try:
                    self._io.fdatasync(fd)
                except BaseException as exc:
                    self._fail(exc, "fdatasync")
                    raise AuditError(self._failure or "audit log failed") from None
                self._synced_writes = writes
                self._durable_seq, self._durable_head, self._durable_tip = target, head, tip
                with self._wlock:  # a write after the snapshot above was made after `taken_at`
                    self._unsynced_at = None if self._writes == writes else taken_at
            if rotate and self._rotate_due and not self._closing:
                self._rotate()
                return None  # the rotation published its own, newer head
            return head if head is not None and head.seq > self._published_seq else None

    def _flush(self, publish: bool, rotate: bool = True) -> RC.HeadRef | None:
        """Write and sync everything staged so far; publish the head file here or return
        the head for the caller to publish later."""
        self._write()
        head = self._sync(rotate)
        if head is not None and publish:
            self._publish(head)
            return None
        return head

    def _publish(self, head: RC.HeadRef) -> None:
        """Replace the head file with `head` (durable in the log already), all or nothing."""
        with self._hlock:
            if head.seq <= self._published_seq or self._abandoned is not None:
                return
            try:
                F.atomic_write(R.head_path(self.path), head.line)
            except OSError as exc:
                self._fail(exc, "updating the head file")
                raise AuditError(self._failure or "audit log failed") from None
            self._published_seq = head.seq

    def _publish_quietly(self, head: RC.HeadRef) -> None:
        try:
            self._publish(head)
        except AuditError:
            log.error("%s", self._failure)

    def _rotate(self) -> None:
        """Close the active segment with a signed head and start the next (holds _slock)."""
        with self._wlock:
            if self._fd_closed:
                return
            with self._lock:
                if self._failure is not None or self._closing or self._abandoned is not None:
                    return
                old_name = F.segment_path(self.path, self._first_seq)
                try:
                    t = self._clock_time()
                except ValueError as exc:
                    self._fail(exc, "reading the clock")
                    raise AuditError(self._failure or "") from None
                if self._head_seq < self._next_seq - 1:
                    self._stage_head(t)
                carry = self._staged_head
                if carry is None or carry.seq != self._next_seq - 1:  # nothing written yet
                    self._rotate_due = False
                    return
                lines, self._pending = self._pending, []
                first = self._next_seq
                started = self._record(self._encode(SegmentStarted(previous=old_name.name)), t)
                started_tip = (first, self._prev)
            stage, nxt, new_fd = "rotating: checking its file", F.next_path(self.path), -1
            try:
                # the rename below takes whatever is at the path: a file put there behind the
                # daemon's back (a FIFO, another log) would join the set while what this daemon
                # wrote, unlinked, is gone; fail closed instead, naming it
                if not _same_file(self._fd, self.path):
                    raise AuditError(f"{self.path} is no longer the file this daemon writes (removed or "
                                     "replaced behind its back); not rotated")
                stage = "rotating: write"
                data = memoryview(b"".join(lines))
                closing = len(data)
                while data:
                    data = data[self._io.write(self._fd, data):]
                # the segment holds them now: a later step's failure must not cut them back
                self._size += closing
                stage = "rotating: fdatasync"
                self._io.fdatasync(self._fd)
                self._written_seq = self._durable_seq = carry.seq
                self._written_head = self._durable_head = carry
                self._written_tip = self._durable_tip = (carry.seq, carry.hash)
                stage = "rotating: updating the head file"
                with self._hlock:
                    F.atomic_write(R.head_path(self.path), carry.line)
                    self._published_seq = max(self._published_seq, carry.seq)
                stage = "rotating: starting the next segment"
                new_fd = os.open(nxt, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
                fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                data = memoryview(carry.line + started)
                while data:
                    data = data[self._io.write(new_fd, data):]
                stage = "rotating: fdatasync of the next segment"
                self._io.fdatasync(new_fd)
                stage = "rotating: renaming the segments"
                os.rename(self.path, old_name)
                os.rename(nxt, self.path)
                F.fsync_dir(self.path.parent, strict=True)
            except BaseException as exc:
                if stage == "rotating: write":
                    self._cut_back(self._fd)
                if new_fd >= 0:
                    os.close(new_fd)
                if os.path.lexists(nxt):
                    os.unlink(nxt)
                self._fail(exc, stage)
                raise AuditError(self._failure or "audit log failed") from None
            old_fd, self._fd = self._fd, new_fd
            os.close(old_fd)  # releases its lock; the new segment's is held
            self._first_seq, self._size = first, len(carry.line) + len(started)
            self._written_seq = self._durable_seq = first
            self._written_tip = self._durable_tip = started_tip
            self._synced_writes = self._writes
            self._unsynced_at = None
            self._rotate_due = False
        self._apply_retention()

    def _apply_retention(self) -> None:
        """Remove the oldest rotated segments beyond `keep_segments`."""
        if self._keep is None:
            return
        segments = F.rotated(self.path)
        extra = segments[: max(0, len(segments) - self._keep)]
        for _, path in extra:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # the log itself is fine: say so, keep serving
                log.warning("audit log %s: could not remove old segment %s: %s", self.path, path.name,
                            exc.strerror)
        if extra:
            F.fsync_dir(self.path.parent)

    def _cut_back(self, fd: int) -> None:
        """Cut what a failed write left of its lines (a full disk takes part of a write):
        the segment ends with its last whole record, as `verify` must find it, not torn.
        Shrinking a file needs no free space. The caller holds _wlock."""
        if self._device:
            return
        try:
            os.ftruncate(fd, self._size)
        except OSError as exc:  # recovery at the next open cuts the torn line instead
            log.warning("audit log %s: could not cut a torn last line: %s", self.path, exc.strerror)

    def _fail(self, exc: BaseException, what: str) -> None:
        if isinstance(exc, AuditError):
            detail = exc.message
        elif isinstance(exc, OSError):
            name = errno.errorcode.get(exc.errno or 0, "")
            detail = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
        else:
            detail = f"{type(exc).__name__}: {exc}"
        if self._failure is None:
            self._failure = (f"audit log {self.path} failed ({what}: {detail}); "
                             "no further records are accepted")
            self._failed_at = time.time()
            # a write refused for room left the file as it was (cut back): once there is room
            # it can go on; anything else (an fdatasync above all) is never retried
            self._room = (isinstance(exc, OSError) and exc.errno in ROOM_ERRNOS and what in ROOM_STAGES)

    # ---- the async side (event loop thread) ----------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """Serve `loop`; arm the head timer. One loop at a time while flushes are pending."""
        if self._loop is not loop:
            if self._waiters or self._sync_task is not None:
                raise AuditError("an AuditWriter serves one event loop at a time")
            # a timer or flush armed in an earlier loop will never run in this one
            self._loop, self._timer, self._flush_handle, self._flush_timer = loop, None, None, None
        if self._timer is None:
            self._timer = loop.call_later(self._every_seconds, self._on_timer)
        return loop

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._flush_handle is None and self._sync_task is None:
            self._flush_handle = loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        """Flush what is staged: inline if nothing else needs the loop, else in the flush thread.

        Inline, the loop waits out one write+fdatasync (0.1-0.3 ms on an SSD)
        that every operation in progress is waiting for anyway, and saves the
        round trip to a thread and back, which costs about as much again in
        wake-ups. When other operations are still running (an HTTP exchange,
        say), they get the loop while the flush thread syncs. Slow syncs (a
        slow, busy or failing disk: two over `inline_limit_s` within 10 s, or
        one ten times over) move the later flushes to the flush thread for a
        while (`_slow_inline_sync`), so a bad disk cannot stall the loop
        (status, lock, approvals) again soon. A rotation always runs in the thread.
        """
        self._flush_handle = None
        if self._sync_task is not None:  # started meanwhile (a timer): it serves every waiter
            return
        if not self._inline_fits():
            self._start_sync_task()
            return
        error: AuditError | None = None
        head: RC.HeadRef | None = None
        started = self._monotonic()
        try:
            head = self._flush(publish=False, rotate=False)
        except AuditError as exc:
            error = exc
        took = self._monotonic() - started
        if took > self._inline_limit_s:
            self._slow_inline_sync(started, took)
        self._settle(error)
        if head is not None:  # the head file is replaced off the loop
            executor = self._flusher()
            if executor is not None:
                executor.submit(self._publish_quietly, head)
        if self._rotate_due:  # that write filled the segment: rotate in the flush thread
            self._start_sync_task()

    def _slow_inline_sync(self, started: float, took: float) -> None:
        """A sync in the loop thread took over `inline_limit_s`. On a busy host that is mostly
        the loop thread waiting for a core after the sync, not the disk: one alone is noted, and
        the flushes go to the thread (for `_inline_backoff_s`, doubling) at the second within
        INLINE_BACKOFF_S, or at once when one took INLINE_SLOW_ALONE times the limit."""
        again = self._slow_at is not None and started - self._slow_at < INLINE_BACKOFF_S
        if not again and took <= INLINE_SLOW_ALONE * self._inline_limit_s:
            self._slow_at = started
            log.info("audit log %s: a write+fdatasync took %.0f ms; flushes stay in the loop thread unless "
                     "another is as slow within %.0f s", self.path, took * 1000, INLINE_BACKOFF_S)
            return
        self._slow_at = None
        self._inline_again_at = started + took + self._inline_backoff_s
        log.warning("audit log %s: a write+fdatasync took %.0f ms; flushes run in a thread for %.0f s",
                    self.path, took * 1000, self._inline_backoff_s)
        self._inline_backoff_s = min(self._inline_backoff_s * 2, INLINE_BACKOFF_MAX_S)

    def _inline_fits(self) -> bool:
        """Is the loop thread the place for the next flush? Every operation in progress is
        waiting for it, the disk has been fast lately, and no rotation is due."""
        return self._loop_may_block() and len(self._waiters) >= self._in_flight and not self._rotate_due

    def _loop_may_block(self) -> bool:
        """May the loop thread do file I/O now? Not if inline flushes are off, or a sync
        proved slow lately."""
        return self._inline and not (self._inline_again_at and self._monotonic() < self._inline_again_at)

    def _loop_may_write(self) -> bool:
        """May the loop thread write(2) an answer's record now? A write lands in the page cache
        and does not wait for the disk as an fdatasync does, so a slow sync leaves it in the loop
        (sending it to a thread cost a hop there and back for each answer while the flushes were
        in the thread); only a write that was itself slow sends the next ones to a thread for a
        while. Never with inline flushes off."""
        return self._inline and not (self._write_again_at and self._monotonic() < self._write_again_at)

    def _write_inline(self) -> bool:
        """Write what is staged in the loop thread, if the file is free (False if not), timed."""
        started = self._monotonic()
        if not self._write(blocking=False):
            return False
        took = self._monotonic() - started
        if took > self._inline_limit_s:
            self._write_again_at = started + took + INLINE_BACKOFF_S
            log.warning("audit log %s: a write took %.0f ms; answers' writes run in a thread for %.0f s",
                        self.path, took * 1000, INLINE_BACKOFF_S)
        return True

    def _start_sync_task(self) -> None:
        if self._sync_task is None and self._loop is not None:
            self._sync_task = self._loop.create_task(self._sync_loop())

    def _sync_due(self) -> bool:
        return bool(self._waiters or self._pending) or (
            not self._closing and self._failure is None
            and (self._synced_writes < self._writes or self._rotate_due))

    async def _sync_loop(self) -> None:
        """Flushes in the writer's own thread, one after another, while that is the place.

        It hands back as soon as it is not: when every operation in progress waits for
        the next flush (and the disk is fast), the loop syncs it inline; when only
        written answers are left unsynced, their flush timer covers them (the next
        intent's sync usually comes first). Staying on under a steady load made nearly
        every flush a thread hand-off, and synced answers nobody waited for.
        """
        loop = asyncio.get_running_loop()
        inline = False
        try:
            while self._sync_due():
                await asyncio.sleep(0)  # let just-woken appenders queue their next record
                if self._waiters and self._inline_fits():
                    inline = True
                    break
                if not (self._waiters or self._pending or self._rotate_due or self._closing) and self._young():
                    break  # only written answers, none due yet: left to their flush timer (armed below)
                error: AuditError | None = None
                try:
                    try:
                        await loop.run_in_executor(self._flusher(), self._flush, True)
                    except RuntimeError:  # closed meanwhile: its flush lock is the wait
                        await loop.run_in_executor(None, self._flush, True)
                except AuditError as exc:
                    error = exc
                self._settle(error)
                if error is not None:
                    return
        finally:
            self._sync_task = None
        if inline:
            self._schedule_flush(loop)
        self._arm_flush_timer(loop)

    def _young(self) -> bool:
        """Is the oldest written record not yet durable far from its `flush_after_s`? (The
        flush timer's own test: past it, that timer starts the sync and it must be done.)"""
        at = self._unsynced_at
        return at is not None and self._flush_after_s - (time.monotonic() - at) > self._flush_after_s / 10

    def _arm_flush_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the flush timer for the oldest written record not yet durable, if none is armed:
        it is synced at most `flush_after_s` after its write."""
        at = self._unsynced_at
        if self._flush_timer is None and at is not None and self._failure is None and not self._closing:
            left = max(0.0, self._flush_after_s - (time.monotonic() - at))
            self._flush_timer = loop.call_later(left, self._on_flush_timer)

    def _flusher(self) -> ThreadPoolExecutor | None:
        with self._lock:
            if self._closing:
                return None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"audit-flush:{self.path.name}")
            return self._executor

    def _settle(self, error: AuditError | None) -> None:
        durable, gen_now, still = self._durable_seq, self._generation, []
        for seq, fut, gen in self._waiters:
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(AuditError(error.message))
            elif gen != gen_now:  # staged before a resume dropped it: never written
                fut.set_exception(AuditError(f"audit log {self.path} failed before this record was written"))
            elif seq <= durable:
                fut.set_result(seq)
            else:
                still.append((seq, fut, gen))
        self._waiters = still

    def _on_flush_timer(self) -> None:
        """Start a sync (off the loop) for the written records that have waited `flush_after_s`.

        The timer was armed for the oldest write not yet durable then; under a steady stream
        of calls the next intent's sync has usually covered it, and a sync now would only be
        an extra one (a thread hop that the next call's intent then waits behind). So when
        the oldest write still not durable is younger than `flush_after_s`, the timer is
        armed again for the moment it turns that old; otherwise the sync starts now.
        """
        self._flush_timer = None
        if self._flush_handle is not None or not self._sync_due():
            return  # a flush is on its way (it covers every write before it), or nothing is due
        if (self._loop is not None and not (self._pending or self._waiters or self._rotate_due)
                and self._sync_task is None and self._young()):  # below a tenth of it: not worth a timer
            self._arm_flush_timer(self._loop)
            return
        self._start_sync_task()

    def _on_timer(self) -> None:
        self._timer = None
        with self._lock:
            if self._closing or self._failure is not None or self._next_seq - 1 <= self._head_seq:
                return
            try:
                self._stage_head(self._clock_time())
            except ValueError as exc:
                self._fail(exc, "reading the clock")
                return
        if self._loop is not None:
            self._start_sync_task()


# ---- helpers ------------------------------------------------------------------


def _encode_event(event: dict[str, Any]) -> bytes:
    # pydantic_core's encoder: compact UTF-8 JSON, as json.dumps would give with
    # tight separators, in a fifth of the time (this runs for every record);
    # a NaN or infinity is written as null, since JSON has no spelling for it
    if not isinstance(event, dict):
        raise AuditError("an audit event must be a dict")
    try:
        data = to_json(event, inf_nan_mode="null")
    except (TypeError, ValueError) as exc:  # PydanticSerializationError too; the value is never echoed
        raise AuditError(f"audit event is not JSON-serializable ({type(exc).__name__})") from None
    if len(data) > MAX_EVENT_BYTES:
        raise AuditError(f"audit event is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    return data


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` (not followed) is the file open as `fd`."""
    try:
        here, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)
