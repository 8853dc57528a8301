"""The daemon's one door to its audit log, and the rule that a failed log halts calls.

Every part that records (the gate, the call service, the session keeper, the
approver API) is handed `Recorder.record` or `Recorder.record_soon`, never the
log itself, and gives it an event model of `vault.audit_events` (so mypy checks
every producer's field names and types). A write or fsync that fails halts calls: the recorder says
why in `halted`, and from then on calls are refused with nothing sent while
status stays up. A failed fsync (or any I/O error) is never retried. A write that failed for
lack of room (a full disk) lost nothing: about once a second the recorder asks the log to
resume (`AuditWriter.resume`, in a thread), which succeeds once there is room and its
`log_resumed` record is durable; then calls are served again, and `resumed` keeps what
failed for status (the runner grades a trial by it). Events that wait for nothing (a session
opened or closed, a refusal; `record(hold=True)`, `record_soon`) that happen while the log is
halted for room are kept, up to HELD_KEPT, and recorded right after `log_resumed`, marked
`recorded_as` "held …" with when they happened: a session opened on a full disk and used once
there is room again has its `session_opened` (its opener's ancestry, which the runner grades
by). An event that cannot be encoded (text that is not Unicode,
too big) is the event's fault, not the log's: it is recorded escaped and the
daemon serves on, since one client's text must never halt the vault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic_core import to_json

from vault.audit.writer import MAX_EVENT_BYTES
from vault.audit_events import AuditEvent, LogResumed
from vault.errors import AuditError

log = logging.getLogger("vaultsim.daemon")

RESUME_EVERY_S = 1.0  # a halted log tries to resume this often (one write of one record)
RESUMED_KEPT = 16  # failures lifted, kept for status
HELD_KEPT = 4096  # events kept while halted for room, recorded once it resumes (the rest: counted, logged)

# what the sink is given: an event model; a dict only for the escaped form of one whose
# text could not be encoded (`_recordable`)
SinkEvent = AuditEvent | dict[str, Any]


class AuditSink(Protocol):
    """What the daemon needs of an audit log (vault.audit.writer.AuditWriter is one)."""

    async def append(self, event: SinkEvent, *, in_flight: int = 1) -> int: ...
    async def append_answer(self, event: SinkEvent, *, in_flight: int = 1) -> int: ...
    def append_nowait(self, event: SinkEvent) -> int: ...
    def signed_head(self) -> dict[str, Any] | None: ...
    def durable_tip(self) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


class Recorder:
    """Records events in the sink (none: recording is a no-op, e.g. `--no-audit`).

    `busy()` says how many calls share the next group commit: the writer waits for
    them, so calls waiting for a person are not counted (they do not need the log)."""

    def __init__(self, sink: AuditSink | None, busy: Callable[[], int] = lambda: 1) -> None:
        self.sink = sink
        self.busy = busy
        self._halted: str | None = None  # set when the log failed: no more calls
        self.refused = 0  # calls refused for the log since it failed (`refuse()`), the first included
        self.resumed: list[dict[str, Any]] = []  # each failure lifted once there was room
        self._resumer: asyncio.Task[None] | None = None
        self._closed = False
        self._held: list[tuple[AuditEvent, float]] = []  # (event, when) while halted for room
        self.held_lost = 0  # events past HELD_KEPT while halted (logged at the resume)

    @property
    def halted(self) -> str | None:
        """Why calls are no longer served (None while they are). The log can fail where no
        record was being written (the head file, replaced in the flush thread or on a timer):
        the writer's own state counts too, so status says so before the next call finds out."""
        if self._halted is None and self.sink is not None:
            failure = getattr(self.sink, "failure_reason", None)
            if isinstance(failure, str) and failure:
                self._mark_halted(failure)
        if self._halted is not None:
            self._watch()
        return self._halted

    def _watch(self) -> None:
        """While halted by a log that may resume (no room, nothing lost), try it about once a
        second (in the event loop, when there is one: status or the next call starts it)."""
        if self._resumer is not None or self._closed or not getattr(self.sink, "resumable", False):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._resumer = loop.create_task(self._resume_when_room())

    async def _resume_when_room(self) -> None:
        sink = self.sink
        try:
            while self._halted is not None and not self._closed and getattr(sink, "resumable", False):
                await asyncio.sleep(RESUME_EVERY_S)
                failed_at = getattr(sink, "failed_at", None) or time.time()
                event = LogResumed(failed=str(getattr(sink, "failure_reason", "") or self._halted),
                                   failed_at=round(failed_at, 6), halted_s=round(time.time() - failed_at, 3),
                                   refused_calls=self.refused)
                if self._closed:
                    return
                if await asyncio.to_thread(sink.resume, event):  # type: ignore[union-attr]
                    self.resumed = [*self.resumed, {**event.to_event(), "resumed_at": time.time()}][-RESUMED_KEPT:]
                    self._halted, self.refused = None, 0
                    self._record_held()
                    log.warning("audit log resumed after %.1f s without room (%d calls refused meanwhile); "
                                "calls are served again", event.halted_s, event.refused_calls)
                    return
            failure = getattr(sink, "failure_reason", None)
            if self._halted is not None and isinstance(failure, str) and failure:
                self._halted = f"audit log failed: {failure}"  # it says why it cannot resume
        finally:
            self._resumer = None

    def refuse(self) -> None:
        """Count a call refused because the log could not be written: the one whose record
        failed, and each one after it until the log resumes (its `log_resumed.refused_calls`)."""
        self.refused += 1

    async def record(self, event: AuditEvent, durable: bool = True, hold: bool = False) -> None:
        """Record an event. `durable=False` only queues it (in order): used for
        records that a durable one of the same call follows before any answer
        or side effect, so a call costs one fdatasync, shared by group commit.
        The event carries no time of its own: its record's time is when it was
        staged, and every reader (`audit show`, the runner) takes it from there.
        `hold`: an event nothing waits for, kept while the log is halted for room
        and recorded when it resumes (it still raises: not recorded yet)."""
        if self.sink is None:
            return
        if self.halted:
            if hold:
                self._hold(event)
            raise AuditError(self.halted)
        try:
            await self._append(event, durable)
        except AuditError as exc:
            why = _unrecordable(event)
            if not why:
                raise self._halt(exc)
            # the event, not the log, is at fault (nothing was written): record it in a form
            # that can be, and serve on
            log.error("audit event %r %s; recorded with its text escaped", event.type[:64], why)
            await self._append(_recordable(event, why), durable)

    async def _append(self, event: SinkEvent, durable: bool) -> None:
        assert self.sink is not None
        if durable:
            await self.sink.append(event, in_flight=self.busy())
        else:
            self.sink.append_nowait(event)

    async def record_answer(self, event: AuditEvent) -> None:
        """Record what an agent is about to be told. The writer's durability decides
        how far it goes before this returns: written (default; a crash of the daemon
        cannot lose it, a power loss within the next group commit can) or synced
        (``strict``). A failure halts call serving, as for any record."""
        if self.sink is None:
            return
        if self.halted:
            raise AuditError(self.halted)
        try:
            await self.sink.append_answer(event, in_flight=self.busy())
        except AuditError as exc:
            raise self._halt(exc)

    def record_soon(self, event: AuditEvent) -> None:
        """Queue an event for the next group commit; never raises (a failed log has already
        halted calls and said why)."""
        if self.sink is None:
            return
        if self.halted:
            self._hold(event)
            return
        try:
            self.sink.append_nowait(event)
        except AuditError:
            why = _unrecordable(event)
            if why:
                with contextlib.suppress(AuditError):
                    self.sink.append_nowait(_recordable(event, why))

    def _hold(self, event: AuditEvent) -> None:
        """Keep an event that happened while halted, if the log may resume (a failure that
        never resumes writes nothing more: nothing to keep it for)."""
        if self._closed or not getattr(self.sink, "resumable", False):
            return
        if len(self._held) < HELD_KEPT:
            self._held.append((event, time.time()))
        else:
            self.held_lost += 1

    def _record_held(self) -> None:
        """Record, in order, the events kept while halted: after `log_resumed`, each marked
        as held with when it happened (its record's time is now)."""
        held, self._held = self._held, []
        for event, when in held:
            mark = f"held: it happened at {when:.6f}, while the log had no room"
            self.record_soon(event.model_copy(update={"recorded_as": mark}))
        if self.held_lost:
            log.warning("%d events that happened while the audit log had no room were not kept "
                        "(at most %d are)", self.held_lost, HELD_KEPT)
            self.held_lost = 0

    def _halt(self, exc: AuditError) -> AuditError:
        # stop serving calls, say why; a write that failed for room may resume (`_watch`)
        self._mark_halted(exc.message)
        self._watch()
        return exc

    def _mark_halted(self, why: str, then: str = "the daemon no longer serves calls") -> None:
        self._halted = f"audit log failed: {why}"
        log.error("%s; %s", self._halted, then)

    def close(self) -> None:
        """Close the log, signing its last record. If that fails (a full disk), say so and
        set `halted`: the log is left unanchored, and whoever stopped the daemon must know."""
        self._closed = True
        if self._resumer is not None:
            self._resumer.cancel()
        if self.sink is None:
            return
        try:
            self.sink.close()
        except AuditError as exc:
            if not self.halted:
                self._mark_halted(exc.message, "its last records are left unsigned (its next start checks "
                                               "and signs them)")
        except Exception as exc:
            log.error("closing the audit log failed: %s", type(exc).__name__)


def _unrecordable(event: SinkEvent) -> str:
    """Why `event` itself cannot be recorded ("" if it can: then the log is at fault)."""
    try:
        data = to_json(_fields(event), inf_nan_mode="null")
    except (TypeError, ValueError):  # PydanticSerializationError is a ValueError
        return "holds text that is not Unicode"
    if len(data) > MAX_EVENT_BYTES:
        return f"is {len(data)} bytes (at most {MAX_EVENT_BYTES})"
    return ""


def _recordable(event: SinkEvent, why: str) -> dict[str, Any]:
    """`event` with every string made encodable (escapes) and cut to a bounded length."""
    def fix(v: object) -> object:
        if isinstance(v, str):
            v = v.encode("utf-8", "backslashreplace").decode("utf-8")
            return v if len(v) <= 4096 else v[:4096] + "..."
        if isinstance(v, dict):
            return {fix(k): fix(x) for k, x in list(v.items())[:256]}
        if isinstance(v, (list, tuple)):
            return [fix(x) for x in list(v)[:256]]
        return v if v is None or isinstance(v, (bool, int, float)) else fix(str(v))
    out = {str(fix(k)): fix(x) for k, x in list(_fields(event).items())[:256]}
    out["recorded_as"] = f"escaped: the event {why}"
    return out


def _fields(event: SinkEvent) -> dict[str, Any]:
    return event.to_event() if isinstance(event, AuditEvent) else event
