"""The one writer of an audit log: exclusive, durable before it answers, fail closed.

Why this shape: an append must not return before its record is on disk
(fdatasync), fdatasync is slow and blocking, and the daemon appends from many
tasks at once. So appends are split in two:

1. *stage* (in the caller, under a lock): assign the next seq, encrypt the
   event, chain and hash the record, queue its line in memory. Seqs are
   assigned only here, so they are strictly increasing with no gap and no
   duplicate, and lines are queued in seq order.
2. *flush*: take every queued line, write them with one write, make them
   durable with one fdatasync, then wake every waiter whose seq is now durable.
   An async append does not flush itself: the first one schedules a flush with
   ``call_soon``, so it runs after every task already ready to run, and the
   records those tasks stage share its fdatasync (group commit). When every
   operation in progress is waiting for that flush and the disk is fast, it
   runs right there in the loop thread: nothing else needs the loop, and a
   round trip to a thread costs about as much again as the sync in wake-ups
   (0.1 ms on the reference machine). Otherwise the writer's own flush thread
   syncs while the other operations use the loop. Once a sync has taken longer
   than ``inline_limit_s`` (a slow, busy or failing disk), every later flush
   runs in the flush thread, so the loop (status, lock, approvals) never
   waits on that disk again.
   ``append_sync`` flushes in the calling thread. Flushes are serialized by a
   lock, so file order is queue order.

Protocol of one log (format: see `records`):

* open: ``flock(LOCK_EX | LOCK_NB)`` on the log itself; held -> AuditError
  "audit log ... is held by another writer" (never two interleaved writers,
  whether another process or this one). A torn last line (no newline: a crash
  mid-write) is truncated away; it was never acknowledged, since acknowledged
  records are complete lines. The last complete record must be well formed,
  hash-correct and decrypt with the key, and any head after it must verify
  with our public key, else the writer refuses to continue somebody else's or
  a damaged log. ``NAME.pub`` is written if missing and must match.
* heads: a signed head line is queued right after a record when: it is the
  first record since open, or ``head_every_records`` records or
  ``head_every_seconds`` (by `clock`) have passed since the last head. An async
  writer also arms a timer so that an idle log is anchored within
  ``head_every_seconds``; close always signs the last record. After the flush
  that made a head durable, ``NAME.head`` is replaced with it (atomic rename,
  fsync'd).
* failure: any failed write, fdatasync or head-file update puts the writer in
  the ``failed`` state with ``failure_reason``; waiters of that flush get
  AuditError, and every later append raises AuditError at once. A failed
  fdatasync is never retried: after one, the kernel may have dropped the dirty
  pages, so a retry could "succeed" over lost data. The daemon must stop.
* cancellation: an append cancelled while waiting may still be written (its
  record is already queued); it is simply not answered.

The I/O layer is injectable: `io` is any object with ``write(fd, data) -> int``
and ``fdatasync(fd)`` (default: the `os` module), so tests can fail them.
"""

from __future__ import annotations

import asyncio
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
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic_core import to_json

from ..errors import AuditError
from ..home import write_private
from . import records as R
from .keys import check_data_key, ensure_public_key

MAX_EVENT_BYTES = 256 * 1024

log = logging.getLogger("vaultsim.audit")


class AuditWriter:
    """Appends events to one audit log. Build with `AuditWriter.open`."""

    def __init__(self, path: Path, fd: int, key: bytes, signing_key: Ed25519PrivateKey, *,
                 clock: Callable[[], float], io: Any, head_every_records: int,
                 head_every_seconds: float, next_seq: int, prev: bytes, head_seq: int,
                 monotonic: Callable[[], float] = time.monotonic, inline_limit_s: float = 0.05) -> None:
        self.path = path
        self._fd = fd
        self._aes = AESGCM(bytes(key))
        self._signing_key = signing_key
        self._clock = clock
        self._io = io
        self._every_records = head_every_records
        self._every_seconds = head_every_seconds
        # chain state, guarded by _lock
        self._lock = threading.Lock()
        self._next_seq = next_seq
        self._prev = prev
        self._head_seq = head_seq  # last seq a head (written or queued) anchors; -1 if none known
        self._head_time = 0.0
        self._headed = False  # has this writer signed a head yet?
        self._pending: list[bytes] = []  # staged lines, in order
        self._pending_head: bytes | None = None  # newest staged head line
        self._pending_head_id: tuple[int, bytes] | None = None  # its (seq, hash)
        self._durable_head: tuple[int, bytes] | None = None  # the newest head on disk, for signed_head()
        self._durable_tip: tuple[int, bytes] | None = None  # the newest record on disk, for durable_tip()
        self._failure: str | None = None
        self._closing = False
        # durability, guarded by _io_lock (one flush at a time)
        self._io_lock = threading.Lock()
        self._durable_seq = next_seq - 1
        self._fd_closed = False
        # async side, touched only from the event loop
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []
        self._sync_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._monotonic = monotonic
        self._inline_limit_s = inline_limit_s
        # flush in the loop thread until a sync proves slow (a limit <= 0: never inline)
        self._inline = inline_limit_s > 0
        self._in_flight = 1  # the caller's operations in progress, as its newest append said

    # ---- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], key: bytes, signing_key: Ed25519PrivateKey, *,
             clock: Callable[[], float] = time.time, io: Any = os,
             head_every_records: int = 1000, head_every_seconds: float = 5.0,
             monotonic: Callable[[], float] = time.monotonic, inline_limit_s: float = 0.05) -> "AuditWriter":
        """Lock `path` (created 0600 if missing), recover its tail, continue its chain."""
        check_data_key(key)
        if not isinstance(signing_key, Ed25519PrivateKey):
            raise AuditError("the audit signing key must be an Ed25519 private key")
        if head_every_records < 1 or not head_every_seconds > 0:
            raise AuditError("head_every_records and head_every_seconds must be positive")
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
            next_seq, prev, head_seq = _recover(path, fd, key, signing_key)
            if not existed:
                _fsync_dir(path.parent)
            ensure_public_key(R.pub_path(path), signing_key.public_key())
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, key, signing_key, clock=clock, io=io,
                   head_every_records=head_every_records, head_every_seconds=head_every_seconds,
                   next_seq=next_seq, prev=prev, head_seq=head_seq, monotonic=monotonic,
                   inline_limit_s=inline_limit_s)

    # ---- the public surface --------------------------------------------------

    async def append(self, event: dict[str, Any], *, in_flight: int = 1) -> int:
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
        seq = self._stage(_encode_event(event))
        fut: asyncio.Future[int] = loop.create_future()
        self._waiters.append((seq, fut))
        self._in_flight = in_flight
        self._schedule_flush(loop)
        return await fut

    def append_nowait(self, event: dict[str, Any]) -> int:
        """Queue `event` in order without waiting: it becomes durable with the next
        flush (the next `append`, or the head timer). For records that precede a
        durable one in the same call, so one fdatasync covers the whole call."""
        seq = self._stage(_encode_event(event))
        self._bind(asyncio.get_running_loop())
        return seq

    def append_sync(self, event: dict[str, Any]) -> int:
        """Blocking `append` (its own flush), for CLI tools, threads and tests."""
        seq = self._stage(_encode_event(event))
        self._flush()
        return seq

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def failure_reason(self) -> str | None:
        return self._failure

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def signed_head(self) -> dict[str, Any] | None:
        """The newest signed head this writer made durable, `{"seq", "hash"}`, or None yet.

        The writer's own memory, not the file: a runner compares it with the log
        to catch a log rewritten behind the daemon's back and re-signed."""
        head = self._durable_head
        return None if head is None else {"seq": head[0], "hash": head[1].decode()}

    def durable_tip(self) -> dict[str, Any] | None:
        """The newest record this writer made durable, `{"seq", "hash"}`, or None yet: its
        hash commits to every record before it, signed or not yet."""
        tip = self._durable_tip
        return None if tip is None else {"seq": tip[0], "hash": tip[1].decode()}

    def close(self) -> None:
        """Flush what is queued, sign the last record, release the lock.

        Raises AuditError only if that last flush fails (a writer that had
        already failed just releases the file). Idempotent.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._failure is None and self._next_seq - 1 > self._head_seq:
                try:
                    self._stage_head(self._clock_time())
                except ValueError as exc:
                    self._fail(exc, "reading the clock")
            failed_before = self._failure
        if self._timer is not None:
            self._timer.cancel()  # close is called from the loop thread (or after it)
            self._timer = None
        try:
            if failed_before is None:
                self._flush()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            with self._io_lock:
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

    def _stage(self, payload: bytes) -> int:
        with self._lock:
            if self._failure is not None:
                raise AuditError(self._failure)
            if self._closing:
                raise AuditError(f"audit log {self.path} is closed")
            try:
                t = self._clock_time()
            except ValueError as exc:
                self._fail(exc, "reading the clock")
                raise AuditError(self._failure or "") from None
            seq, time_b = self._next_seq, R.time_text(t)
            nonce = os.urandom(R.NONCE_BYTES)
            ct = self._aes.encrypt(nonce, payload, R.aad(b"%d" % seq, time_b, self._prev))
            line, self._prev = R.record_line(seq, time_b, self._prev, nonce, ct)
            self._pending.append(line)
            self._next_seq = seq + 1
            if (not self._headed or seq - self._head_seq >= self._every_records
                    or t - self._head_time >= self._every_seconds):
                self._stage_head(t)
            return seq

    def _stage_head(self, t: float) -> None:
        """Queue a signed head for the last staged record (caller holds _lock)."""
        seq = self._next_seq - 1
        message = R.head_message(seq, self._prev, R.time_text(t))
        head = R.head_line(message, self._signing_key.sign(message))
        self._pending.append(head)
        self._pending_head = head
        self._pending_head_id = (seq, self._prev)
        self._head_seq, self._head_time, self._headed = seq, t, True

    def _clock_time(self) -> float:
        t = float(self._clock())
        if not math.isfinite(t):
            raise ValueError("the clock returned a non-finite time")
        return t

    # ---- flushing (any thread; one at a time) --------------------------------

    def _flush(self) -> None:
        """Write and fdatasync everything staged so far. AuditError if the log failed."""
        with self._io_lock:
            with self._lock:
                if self._failure is not None:
                    raise AuditError(self._failure)
                lines, self._pending = self._pending, []
                head, self._pending_head = self._pending_head, None
                head_id, self._pending_head_id = self._pending_head_id, None
                last, tip = self._next_seq - 1, self._prev
            if not lines or self._fd_closed:
                return
            stage = "write"
            try:
                view = memoryview(b"".join(lines))
                while view:
                    view = view[self._io.write(self._fd, view):]
                stage = "fdatasync"
                self._io.fdatasync(self._fd)
                self._durable_seq = last
                self._durable_tip = (last, tip)
                if head is not None:
                    stage = "updating the head file"
                    write_private(R.head_path(self.path), head)
                    self._durable_head = head_id
            except BaseException as exc:
                self._fail(exc, stage)
                raise AuditError(self._failure or "audit log failed") from None

    def _fail(self, exc: BaseException, what: str) -> None:
        if isinstance(exc, OSError):
            name = errno.errorcode.get(exc.errno or 0, "")
            detail = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
        else:
            detail = f"{type(exc).__name__}: {exc}"
        if self._failure is None:
            self._failure = (f"audit log {self.path} failed ({what}: {detail}); "
                             "no further records are accepted")

    # ---- the async side (event loop thread) ----------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """Serve `loop`; arm the head timer. One loop at a time while flushes are pending."""
        if self._loop is not loop:
            if self._waiters or self._sync_task is not None:
                raise AuditError("an AuditWriter serves one event loop at a time")
            # a timer or flush armed in an earlier loop will never run in this one
            self._loop, self._timer, self._flush_handle = loop, None, None
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
        say), they get the loop while the flush thread syncs. A sync slower
        than `inline_limit_s` (a slow, busy or failing disk) moves every later
        flush to the flush thread for good, so a bad disk cannot stall the
        loop (status, lock, approvals) again.
        """
        self._flush_handle = None
        if not self._inline or len(self._waiters) < self._in_flight:
            if self._sync_task is None and self._loop is not None:
                self._sync_task = self._loop.create_task(self._sync_loop())
            return
        error: AuditError | None = None
        started = self._monotonic()
        try:
            self._flush()
        except AuditError as exc:
            error = exc
        took = self._monotonic() - started
        if took > self._inline_limit_s:
            self._inline = False
            log.warning("audit log %s: a write+fdatasync took %.0f ms; later flushes run in a thread",
                        self.path, took * 1000)
        self._settle(error)

    async def _sync_loop(self) -> None:
        """The slow-disk path: flushes in the writer's own thread, one after another."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiters or self._pending:
                await asyncio.sleep(0)  # let just-woken appenders queue their next record
                error: AuditError | None = None
                try:
                    try:
                        await loop.run_in_executor(self._flusher(), self._flush)
                    except RuntimeError:  # closed meanwhile: its flush lock is the wait
                        await loop.run_in_executor(None, self._flush)
                except AuditError as exc:
                    error = exc
                self._settle(error)
                if error is not None:
                    return
        finally:
            self._sync_task = None

    def _flusher(self) -> ThreadPoolExecutor | None:
        with self._lock:
            if self._closing:
                return None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"audit-flush:{self.path.name}")
            return self._executor

    def _settle(self, error: AuditError | None) -> None:
        durable, still = self._durable_seq, []
        for seq, fut in self._waiters:
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(AuditError(error.message))
            elif seq <= durable:
                fut.set_result(seq)
            else:
                still.append((seq, fut))
        self._waiters = still

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
            self._schedule_flush(self._loop)


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


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _recover(path: Path, fd: int, key: bytes, signing_key: Ed25519PrivateKey) -> tuple[int, bytes, int]:
    """Drop a torn tail; return (next seq, hash of last record, seq of last head or -1)."""
    st = os.fstat(fd)
    if stat.S_ISCHR(st.st_mode):  # e.g. /dev/full or /dev/null in tests: nothing to continue
        return 0, R.GENESIS, -1
    if not stat.S_ISREG(st.st_mode):
        raise AuditError(f"audit log {path} is not a regular file")
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    try:
        end, lines = _read_tail(fd, st.st_size)
        if end < st.st_size:
            os.ftruncate(fd, end)
            os.fsync(fd)
    except OSError as exc:
        raise AuditError(f"cannot recover the tail of audit log {path}: {exc.strerror}") from None
    if not lines:
        _check_head_file(path, signing_key, None)
        return 0, R.GENESIS, -1
    damaged = (f"audit log {path} ends with a damaged line; run `vaultsim audit verify {path}` "
               "and move the log aside")
    rec = R.parse_record(lines[0])
    if rec is None:
        raise AuditError(damaged)
    try:
        AESGCM(bytes(key)).decrypt(rec.nonce, rec.ct, rec.aad)
    except InvalidTag:
        raise AuditError(f"the audit key does not decrypt the last record of {path}: "
                         "wrong key or damaged log") from None
    head_seq = -1
    public = signing_key.public_key()
    for line in lines[1:]:
        head = R.parse_head(line)
        if head is None or head.seq != rec.seq or head.hash != rec.hash:
            raise AuditError(damaged)
        try:
            public.verify(head.sig, head.message)
        except InvalidSignature:
            raise AuditError(f"the last head of audit log {path} was signed by another key") from None
        head_seq = rec.seq
    _check_head_file(path, signing_key, rec)
    return rec.seq + 1, rec.hash, head_seq


def _check_head_file(path: Path, signing_key: Ed25519PrivateKey, last: R.Record | None) -> None:
    """Refuse to continue a log that was cut back behind its newest signed head.

    Continuing would sign a new head over the cut and erase the evidence; the
    operator has to look at it first (`vaultsim audit verify`).
    """
    hp = R.head_path(path)
    try:
        side = hp.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AuditError(f"cannot read head file {hp}: {exc.strerror}") from None
    head = R.parse_head(side[:-1]) if side.endswith(b"\n") else None
    try:
        if head is None:
            raise InvalidSignature
        signing_key.public_key().verify(head.sig, head.message)
    except InvalidSignature:
        raise AuditError(f"head file {hp} is damaged or signed by another key; "
                         f"run `vaultsim audit verify {path}`") from None
    last_seq = last.seq if last is not None else -1
    if head.seq > last_seq or (head.seq == last_seq and last is not None and head.hash != last.hash):
        raise AuditError(f"audit log {path} ends at seq {last_seq} but {hp.name} says seq {head.seq} "
                         f"was signed: the log was cut or rolled back; run `vaultsim audit verify {path}`")


def _read_tail(fd: int, size: int) -> tuple[int, list[bytes]]:
    """(offset just past the last complete line, complete lines from the last record on)."""
    window = 64 * 1024
    while True:
        start = max(0, size - window)
        buf = os.pread(fd, size - start, start)
        cut = buf.rfind(b"\n") + 1
        if cut or start == 0:
            lines = buf[:cut].split(b"\n")[:-1]
            if start > 0:
                lines = lines[1:]  # may begin mid-line
            for i in range(len(lines) - 1, -1, -1):
                if lines[i].startswith(R.RECORD_START):
                    return start + cut, lines[i:]
            if start == 0:
                return cut, lines
        window *= 4
