"""The vault daemon: holds credentials, runs the gate, performs calls for agents.

Process model (DESIGN.md "Processes"): one daemon per vault home, guarded by
an exclusive lock on `daemon.lock` (vault.instance); two Unix sockets (agent,
approver), 0600 in a 0700 home; asyncio throughout. Sessions, the audit sink
and the lifecycle live here; the call pipeline is vault.calls.

A session ends the moment its process exits: the process is watched through a
pidfd (vault.processes), so nothing polls every session. The housekeeping
loop only expires grants, drops approvers that stopped reading, and polls the
few processes no pidfd could be had for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any, Protocol

from pydantic_core import to_json

from . import __version__, agent_api, approver_api
from .approver_guard import ApproverGuard, marks_of
from .approver_hub import ApproverHub
from .audit.writer import MAX_EVENT_BYTES
from .calls import CallPipeline, CallRecord
from .config import Resolved
from .errors import AuditError
from .executors.base import Executor
from .gate.engine import Gate
from .home import VaultHome
from .instance import approver_token, clear_stale_socket
from .limits import MAX_CONNECTIONS, MAX_SESSIONS
from .peer import Markers, has_ancestor
from .processes import FALLBACK_POLL_S, ProcessEntry, ProcessTable
from .rpc_server import Connection, RpcServer, raise_fd_limit
from .sessions import ClientLabel, Session, SessionTable
from .wire import SessionClosed, SessionOpened

log = logging.getLogger("vaultsim.daemon")

# grants' TTLs, approvers that stopped reading, processes without a pidfd
_HOUSEKEEPING_S = FALLBACK_POLL_S


class AuditSink(Protocol):
    async def append(self, event: dict[str, Any], *, in_flight: int = 1) -> int: ...
    def append_nowait(self, event: dict[str, Any]) -> int: ...
    def close(self) -> None: ...


class VaultDaemon(CallPipeline):
    def __init__(self, home: VaultHome, config: Resolved, *, unlocked: bool = False,
                 keyring_backend: str = "", store: Any = None, diagnostics: Any = None,
                 audit: AuditSink | None = None, executors: dict[str, Executor] | None = None) -> None:
        self.home = home
        self.config = config
        self.catalog = config.catalog
        self.store = store
        self.diagnostics = diagnostics
        self.audit_sink = audit
        self.executors = executors or {}
        self.keyring_backend = keyring_backend
        self.sessions = SessionTable()
        self.processes = ProcessTable()
        self.hub = ApproverHub()
        self.gate = Gate(config.policy, self.sessions, self.audit, locked=not unlocked, hub=self.hub)
        self.guard = ApproverGuard(self.sessions, self.processes)
        self.approver_token = approver_token(home)
        self.calls: dict[str, CallRecord] = {}
        self.by_idem: dict[str, str] = {}
        self._touched: set[str] = set()  # correlation ids whose remote was contacted
        self.halted: str | None = None  # set when the audit log failed: no more calls
        self.in_flight = 0  # calls and lookups being served right now
        self.started = time.time()
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._servers: list[RpcServer] = []
        self._bg: set[asyncio.Future[Any]] = set()

    # ---- audit ---------------------------------------------------------------

    async def audit(self, event: dict[str, Any], durable: bool = True) -> None:
        """Record an event. `durable=False` only queues it (in order): used for
        records that a durable one of the same call follows before any answer
        or side effect, so a call costs one fdatasync, shared by group commit.
        The event carries no time of its own: its record's time is when it was
        staged, and every reader (`audit show`, the runner) takes it from there."""
        if self.audit_sink is None:
            return
        if self.halted:
            raise AuditError(self.halted)
        try:
            await self._append(event, durable)
        except AuditError as exc:
            why = _unrecordable(event)
            if why:
                # the event, not the log, is at fault (nothing was written): record it in a form
                # that can be, and serve on; one client's text must never halt the vault
                log.error("audit event %r %s; recorded with its text escaped",
                          str(event.get("type"))[:64], why)
                await self._append(_recordable(event, why), durable)
                return
            # a failed write or fsync is never retried: stop serving calls, say why
            self.halted = f"audit log failed: {exc.message}"
            log.error("%s; the daemon no longer serves calls", self.halted)
            raise

    async def _append(self, event: dict[str, Any], durable: bool) -> None:
        assert self.audit_sink is not None
        if durable:
            # calls waiting for a person do not need the loop while the log syncs
            busy = max(1, self.in_flight - len(self.gate.pending))
            await self.audit_sink.append(event, in_flight=busy)
        else:
            self.audit_sink.append_nowait(event)

    def audit_soon(self, event: dict[str, Any]) -> None:
        """Queue an event for the next group commit; never raises (a failed log has already
        halted calls and said why)."""
        if self.audit_sink is None or self.halted:
            return
        try:
            self.audit_sink.append_nowait(event)
        except AuditError:
            why = _unrecordable(event)
            if why:
                with contextlib.suppress(AuditError):
                    self.audit_sink.append_nowait(_recordable(event, why))

    # ---- sessions --------------------------------------------------------------

    async def open_session(self, conn: Connection, agent: str, run_id: str | None,
                           client: ClientLabel | None = None) -> Session:
        """Open a session for the process that sent the request (`conn.peer`)."""
        ident = conn.peer
        entry = self.processes.get(ident)
        if entry.markers is None:
            entry.markers = Markers.of(ident.pid)
        marks = marks_of(ident, entry.markers, self.guard.cgroup)
        # the label is the opener's claim; the one part the daemon can check is the host's ancestry
        verified = client is not None and client.host_pid is not None and \
            has_ancestor(ident.pid, client.host_pid)
        s = self.sessions.open(agent, run_id, ident, conn.id, process=entry, sid=entry.markers.sid,
                               pgid=entry.markers.pgid, marks=marks, client=client, host_verified=verified)
        entry.sessions += 1
        if not entry.was_agent:
            entry.was_agent = True
            self.processes.watch(entry, self._process_exited)
        event: dict[str, Any] = {"type": "session_opened", "session_id": s.id, "agent": agent,
                                 "pid": s.identity.pid, "sid": s.sid, "pgid": s.pgid, "run_id": run_id}
        if client is not None:
            event["client"] = s.client_wire()
        with contextlib.suppress(AuditError):
            await self.audit(event, durable=False)
        await self.gate.broadcast(SessionOpened.model_validate(s.to_wire()))
        return s

    def _process_exited(self, entry: ProcessEntry) -> None:
        """A watched process exited (its pidfd said so): end its sessions now."""
        self.gate.process_exited(entry.key)
        for s in self.sessions.for_process(entry.key):
            task = asyncio.ensure_future(self.close_session(s, "process exited"))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    async def close_session(self, s: Session, reason: str) -> None:
        if self.sessions.remove(s.id) is None:
            return
        if s.process is not None:
            s.process.sessions -= 1
            self.processes.release(s.process)
        await self.gate.end_session(s, reason)
        with contextlib.suppress(AuditError):
            await self.audit({"type": "session_closed", "session_id": s.id, "reason": reason})
        await self.gate.broadcast(SessionClosed(session_id=s.id, reason=reason))

    async def _housekeeping(self) -> None:
        """End grants whose TTL passed, drop approvers that stopped reading, and poll the
        processes that have no pidfd. Sessions of exited processes end by notification."""
        while not self._stop.is_set():
            self.processes.poll_unwatched()
            self.hub.check_stalled()
            with contextlib.suppress(AuditError):
                await self.gate.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), _HOUSEKEEPING_S)

    # ---- calls -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"version": __version__, "pid": os.getpid(), "home": str(self.home.root),
                "keyring_backend": self.keyring_backend, "sessions": len(self.sessions.sessions),
                "uptime_s": round(time.time() - self.started, 3), "halted": self.halted,
                "audit": self.audit_sink is not None, **self.gate.status(),
                # what clients hold, against the limits in vault.limits
                "connections": self.processes.connections, "partial_bytes": self.processes.partial_bytes,
                "approvers_dropped": self.hub.dropped,
                # the runner checks the log on disk against these (FAIL_AUDIT_TAMPER)
                "audit_head": getattr(self.audit_sink, "signed_head", lambda: None)(),
                "audit_tip": getattr(self.audit_sink, "durable_tip", lambda: None)()}

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason
        self._stop.set()

    async def serve(self, ready: "asyncio.Event | None" = None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop, f"signal {sig.name}")
        if self.audit_sink is not None:
            # one durable record before any call is accepted: a log that cannot be written (full
            # device, I/O error) halts call serving now, before anything reaches a remote;
            # status stays up and says why
            with contextlib.suppress(AuditError):
                await self.audit({"type": "daemon_started", "pid": os.getpid(), "version": __version__})
        for path in (self.home.agent_sock, self.home.approver_sock):
            clear_stale_socket(path)
        # a descriptor per connection and per watched process, plus files: as many as allowed
        nofile = raise_fd_limit(MAX_CONNECTIONS + MAX_SESSIONS + 1024)
        self.processes.max_connections = max(16, min(MAX_CONNECTIONS, (nofile - 256) // 2))
        self._servers = [RpcServer(str(self.home.agent_sock), agent_api.build(self), self.processes),
                         RpcServer(str(self.home.approver_sock), approver_api.build(self), self.processes)]
        for srv in self._servers:
            await srv.start()
        reaper = asyncio.create_task(self._housekeeping())
        log.info("vaultsim daemon serving %s (locked=%s)", self.home.root, self.gate.locked)
        if ready is not None:
            ready.set()
        await self._stop.wait()
        log.info("stopping: %s", self._stop_reason or "requested")
        # settle waits so in-flight calls can be answered, then drain
        self.gate.shutdown("the vault stopped before a decision")
        await asyncio.gather(*(srv.close() for srv in self._servers))
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        self.processes.close()
        for ex in self.executors.values():
            with contextlib.suppress(Exception):
                await ex.aclose()
        if self.audit_sink is not None:
            with contextlib.suppress(Exception):
                self.audit_sink.close()


def _unrecordable(event: dict[str, Any]) -> str:
    """Why `event` itself cannot be recorded ("" if it can: then the log is at fault)."""
    try:
        data = to_json(event, inf_nan_mode="null")
    except (TypeError, ValueError):  # PydanticSerializationError is a ValueError
        return "holds text that is not Unicode"
    if len(data) > MAX_EVENT_BYTES:
        return f"is {len(data)} bytes (at most {MAX_EVENT_BYTES})"
    return ""


def _recordable(event: dict[str, Any], why: str) -> dict[str, Any]:
    """`event` with every string made encodable (escapes) and cut to a bounded length."""
    def fix(v: Any) -> Any:
        if isinstance(v, str):
            v = v.encode("utf-8", "backslashreplace").decode("utf-8")
            return v if len(v) <= 4096 else v[:4096] + "..."
        if isinstance(v, dict):
            return {fix(k): fix(x) for k, x in list(v.items())[:256]}
        if isinstance(v, (list, tuple)):
            return [fix(x) for x in list(v)[:256]]
        return v if v is None or isinstance(v, (bool, int, float)) else fix(str(v))
    out = fix(event)
    out["recorded_as"] = f"escaped: the event {why}"
    return out
