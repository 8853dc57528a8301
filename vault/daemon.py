"""The vault daemon: holds credentials, runs the gate, performs calls for agents.

Process model (DESIGN.md "Processes"): one daemon per vault home, guarded by
an exclusive lock on `daemon.lock` (vault.instance); two Unix sockets (agent,
approver), 0600 in a 0700 home; asyncio throughout. Sessions, the audit sink
and the lifecycle live here; the call pipeline is vault.calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any, Protocol

from . import __version__, agent_api, approver_api
from .calls import CallPipeline, CallRecord
from .config import Resolved
from .errors import AuditError
from .executors.base import Executor
from .gate.engine import Gate
from .home import VaultHome
from .instance import approver_token, clear_stale_socket
from .peer import has_ancestor
from .rpc_server import Connection, RpcServer
from .sessions import ClientLabel, Session, SessionTable

log = logging.getLogger("vaultsim.daemon")

_REAP_INTERVAL_S = 0.2


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
        self.gate = Gate(config.policy, self.sessions, self.audit, locked=not unlocked)
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
            if durable:
                # calls waiting for a person do not need the loop while the log syncs
                busy = max(1, self.in_flight - len(self.gate.pending))
                await self.audit_sink.append(event, in_flight=busy)
            else:
                self.audit_sink.append_nowait(event)
        except AuditError as exc:
            # a failed write or fsync is never retried: stop serving calls, say why
            self.halted = f"audit log failed: {exc.message}"
            log.error("%s; the daemon no longer serves calls", self.halted)
            raise

    # ---- sessions --------------------------------------------------------------

    async def open_session(self, conn: Connection, agent: str, run_id: str | None,
                           client: ClientLabel | None = None) -> Session:
        # the label is the opener's claim; the one part the daemon can check is the host's ancestry
        verified = client is not None and client.host_pid is not None and \
            has_ancestor(conn.peer.pid, client.host_pid)
        s = self.sessions.open(agent, run_id, conn.peer, conn.id, client, verified)
        event: dict[str, Any] = {"type": "session_opened", "session_id": s.id, "agent": agent,
                                 "pid": s.identity.pid, "run_id": run_id}
        if client is not None:
            event["client"] = s.client_wire()
        with contextlib.suppress(AuditError):
            await self.audit(event, durable=False)
        await self.gate.broadcast("session.opened", s.to_wire())
        return s

    async def close_session(self, s: Session, reason: str) -> None:
        if self.sessions.remove(s.id) is None:
            return
        await self.gate.end_session(s, reason)
        with contextlib.suppress(AuditError):
            await self.audit({"type": "session_closed", "session_id": s.id, "reason": reason})
        await self.gate.broadcast("session.closed", {"session_id": s.id, "reason": reason})

    async def _reaper(self) -> None:
        """End sessions whose process exited, and grants whose TTL passed."""
        while not self._stop.is_set():
            for s in self.sessions.dead():
                await self.close_session(s, "process exited")
            with contextlib.suppress(AuditError):
                await self.gate.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), _REAP_INTERVAL_S)

    # ---- calls -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"version": __version__, "pid": os.getpid(), "home": str(self.home.root),
                "keyring_backend": self.keyring_backend, "sessions": len(self.sessions.sessions),
                "uptime_s": round(time.time() - self.started, 3), "halted": self.halted,
                "audit": self.audit_sink is not None, **self.gate.status()}

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
        self._servers = [RpcServer(str(self.home.agent_sock), agent_api.build(self)),
                         RpcServer(str(self.home.approver_sock), approver_api.build(self))]
        for srv in self._servers:
            await srv.start()
        reaper = asyncio.create_task(self._reaper())
        log.info("vaultsim daemon serving %s (locked=%s)", self.home.root, self.gate.locked)
        if ready is not None:
            ready.set()
        await self._stop.wait()
        log.info("stopping: %s", self._stop_reason or "requested")
        # settle waits so in-flight calls can be answered, then drain
        self.gate.shutdown("the vault stopped before a decision")
        for srv in self._servers:
            await srv.close()
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        for ex in self.executors.values():
            with contextlib.suppress(Exception):
                await ex.aclose()
        if self.audit_sink is not None:
            with contextlib.suppress(Exception):
                self.audit_sink.close()
