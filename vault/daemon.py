"""The vault daemon: holds credentials, runs the gate, performs calls for agents.

Process model (DESIGN.md "Processes"): one daemon per vault home, guarded by
an exclusive lock on `daemon.lock`; two Unix sockets (agent, approver), 0600
in a 0700 home; asyncio throughout. Every call is answered with a Result; the
remote is touched only after the intent is in the audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import __version__, agent_api, approver_api
from .catalog import Operation
from .config import Resolved
from .errors import AlreadyRunning, AuditError, CredentialError, HomeError, MissingCredential
from .executors.base import CallContext, ExecOutcome, Executor
from .home import VaultHome, write_private
from .ids import correlation_id, token
from .models import Category, Result, make_result
from .rpc_server import Connection, RpcServer
from .sessions import Session, SessionTable
from .gate.engine import Gate

log = logging.getLogger("vaultsim.daemon")

_REAP_INTERVAL_S = 0.2


class AuditSink(Protocol):
    async def append(self, event: dict[str, Any]) -> int: ...
    def append_nowait(self, event: dict[str, Any]) -> int: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class CallRecord:
    operation: str
    idempotency_key: str | None
    session_id: str
    agent: str
    run_id: str | None


def _timed_out(diagnostic: dict[str, Any] | None) -> bool:
    """Did the executor give up on a deadline? (http: a *Timeout error; ssh: timed_out)"""
    if not diagnostic:
        return False
    error = diagnostic.get("error")
    kind = error.get("type", "") if isinstance(error, dict) else ""
    return bool(diagnostic.get("timed_out")) or "Timeout" in str(kind)


def acquire_home_lock(home: VaultHome) -> int:
    """Take the one-daemon-per-home lock, or explain who holds it."""
    fd = os.open(home.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = _read_pid(home)
        who = f" (pid {pid})" if pid else ""
        raise AlreadyRunning(f"a vaultsim daemon{who} already serves {home.root}; "
                             "stop it with `vaultsim stop` first") from None
    return fd


def _read_pid(home: VaultHome) -> int | None:
    try:
        return int(home.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def clear_stale_socket(path: Path) -> None:
    """A socket left by a killed daemon is removed, but only if nobody answers on it."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise HomeError(f"{path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        log.info("removed stale socket %s", path)
        return
    except OSError:
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise AlreadyRunning(f"another process answers on {path}; refusing to take it over")


def approver_token(home: VaultHome) -> str:
    path = home.approver_token_file
    if path.exists():
        if stat.S_IMODE(path.stat().st_mode) != 0o600:
            os.chmod(path, 0o600)
        return path.read_text().strip()
    value = token(32)
    write_private(path, value.encode())
    return value


class VaultDaemon:
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
        self.started = time.time()
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._servers: list[RpcServer] = []

    # ---- audit ---------------------------------------------------------------

    async def audit(self, event: dict[str, Any], durable: bool = True) -> None:
        """Record an event. `durable=False` only queues it (in order): used for
        records that a durable one of the same call follows before any answer
        or side effect, so a call costs one fdatasync, shared by group commit."""
        if self.audit_sink is None:
            return
        if self.halted:
            raise AuditError(self.halted)
        event = {"time": time.time(), **event}
        try:
            if durable:
                await self.audit_sink.append(event)
            else:
                self.audit_sink.append_nowait(event)
        except AuditError as exc:
            # a failed write or fsync is never retried: stop serving calls, say why
            self.halted = f"audit log failed: {exc.message}"
            log.error("%s; the daemon no longer serves calls", self.halted)
            raise

    # ---- sessions --------------------------------------------------------------

    async def open_session(self, conn: Connection, agent: str, run_id: str | None) -> Session:
        s = self.sessions.open(agent, run_id, conn.peer, conn.id)
        with contextlib.suppress(AuditError):
            await self.audit({"type": "session_opened", "session_id": s.id, "agent": agent,
                              "pid": s.identity.pid, "run_id": run_id}, durable=False)
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

    async def call(self, s: Session, op: Operation, params: dict[str, Any],
                   idem: str | None, wait_s: float | None) -> Result:
        cid = correlation_id()
        self.calls[cid] = CallRecord(op.name, idem, s.id, s.agent, s.run_id)
        if idem:
            self.by_idem[idem] = cid
        if self.halted:
            return make_result(Category.local_failure, op.name, cid,
                               f"the vault stopped serving calls ({self.halted}); nothing was sent")
        try:
            await self.audit({"type": "call_requested", "correlation_id": cid, "session_id": s.id,
                              "operation": op.name, "risk": str(op.risk), "target": op.scope(params)},
                             durable=False)
            result = await self.gate.call(s, op, params, cid, wait_s,
                                          lambda: self._execute(s, op, params, cid, idem))
        except AuditError:
            result = make_result(Category.local_failure, op.name, cid,
                                 "the audit log could not record this call; nothing was sent")
        return await self.record_result(s, result)

    async def record_result(self, s: Session, result: Result, resumed: bool = False) -> Result:
        """Make the call's records durable, then tell approvers; returns what the agent gets."""
        touched = result.correlation_id in self._touched
        self._touched.discard(result.correlation_id)
        try:
            await self.audit({"type": "classification", "correlation_id": result.correlation_id,
                              "session_id": s.id, "operation": result.operation,
                              "category": str(result.category),
                              "retry": str(result.retry), "diagnostic_id": result.diagnostic_id,
                              "resumed": resumed})
        except AuditError:
            if touched:
                result = make_result(Category.outcome_unknown, result.operation, result.correlation_id,
                                     "the remote was contacted but the result could not be recorded; "
                                     "its outcome must be treated as unknown")
        await self.gate.broadcast("activity", {
            "time": time.time(), "agent": s.agent, "pid": s.identity.pid, "session_id": s.id,
            "operation": result.operation, "category": str(result.category),
            "retry": str(result.retry), "correlation_id": result.correlation_id})
        return result

    def _context(self, s: Session, cid: str, idem: str | None, workdir: str | None) -> CallContext:
        return CallContext(correlation_id=cid, session_id=s.id, idempotency_key=idem, run_id=s.run_id,
                           deadline=time.monotonic() + self.config.call_timeout_s, workdir=workdir)

    async def _prepare(self, op: Operation, cid: str) -> tuple[Any, Any, Executor] | Result:
        service = self.config.services.get(op.service)
        executor = self.executors.get(op.executor)
        if service is None or executor is None:
            return make_result(Category.local_failure, op.name, cid,
                               f"service {op.service!r} is not configured in this vault; nothing was sent")
        try:
            credential = self.store.get(op.credential)
        except MissingCredential:
            return make_result(Category.authentication_failed, op.name, cid,
                               f"the vault holds no credential {op.credential!r} for {op.name}; "
                               "an operator must set it (vaultsim secret set). Nothing was sent")
        except CredentialError as exc:
            return make_result(Category.local_failure, op.name, cid,
                               f"the credential store is unavailable ({exc.message}); nothing was sent")
        return credential, service, executor

    async def _execute(self, s: Session, op: Operation, params: dict[str, Any],
                       cid: str, idem: str | None) -> Result:
        prepared = await self._prepare(op, cid)
        if isinstance(prepared, Result):
            return prepared
        credential, service, executor = prepared
        try:
            # on disk before the credential leaves the vault, reads included: no unaudited action
            await self.audit({"type": "intent", "correlation_id": cid, "operation": op.name,
                              "target": op.scope(params), "idempotency_key": bool(idem)})
        except AuditError as exc:
            return make_result(Category.local_failure, op.name, cid,
                               "the audit log could not record the intent; the call was refused "
                               f"before anything was sent ({exc.message})")
        workdir = self._workdir(cid) if op.executor == "ssh" else None
        try:
            with contextlib.suppress(AuditError):
                await self.audit({"type": "dispatch_started", "correlation_id": cid}, durable=False)
            outcome = await self._run_executor(executor, op, params, credential, service,
                                               self._context(s, cid, idem, workdir))
        finally:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        return await self._finish(op, cid, outcome, credential, "remote_result")

    async def _run_executor(self, executor: Executor, op: Operation, params: dict[str, Any],
                            credential: Any, service: Any, ctx: CallContext) -> ExecOutcome:
        try:
            return await executor.execute(op, params, credential, service, ctx)
        except Exception as exc:  # an executor bug: we cannot know what reached the remote
            log.error("executor %s failed: %s", op.executor, type(exc).__name__)
            cat = Category.outcome_unknown if op.mutates else Category.local_failure
            return ExecOutcome(make_result(cat, op.name, ctx.correlation_id,
                                           "the vault's executor failed unexpectedly; "
                                           "the remote outcome is not known"), remote_touched=True)

    async def _finish(self, op: Operation, cid: str, outcome: ExecOutcome, credential: Any,
                      event_type: str, link: dict[str, Any] | None = None) -> Result:
        result = outcome.result
        if outcome.remote_touched:
            self._touched.add(cid)
        # raw evidence is kept for failures only: a success needs no forensics
        if outcome.diagnostic and not result.ok and self.diagnostics is not None:
            try:
                did = self.diagnostics.record(outcome.diagnostic, secrets=[credential])
                result = result.model_copy(update={"diagnostic_id": did})
            except Exception as exc:  # diagnostics are best effort; never block the answer
                log.error("could not store diagnostic: %s", type(exc).__name__)
        try:
            if _timed_out(outcome.diagnostic):
                await self.audit({"type": "client_timeout", "correlation_id": cid,
                                  "phase": (outcome.diagnostic or {}).get("phase")}, durable=False)
            await self.audit({"type": event_type, "correlation_id": cid,
                              "category": str(result.category), "remote_touched": outcome.remote_touched,
                              "diagnostic_id": result.diagnostic_id, "reconciled": result.reconciled,
                              **(link or {})},
                             durable=False)
        except AuditError:
            if outcome.remote_touched:
                return make_result(Category.outcome_unknown, op.name, cid,
                                   "the remote was contacted but the result could not be recorded; "
                                   "its outcome must be treated as unknown")
            return make_result(Category.local_failure, op.name, cid,
                               "the audit log failed; nothing was recorded as sent")
        return result

    def _workdir(self, cid: str) -> str:
        base = self.home.root / "work"
        base.mkdir(mode=0o700, exist_ok=True)
        path = base / cid
        path.mkdir(mode=0o700)
        return str(path)

    async def lookup(self, s: Session, cid: str | None, idem: str | None, operation: str | None) -> Result:
        if cid is None and idem:
            cid = self.by_idem.get(idem)
        record = self.calls.get(cid) if cid else None
        if record is not None and (record.agent != s.agent or record.run_id != s.run_id):
            record = None  # another agent's history is not this agent's to read
        op_name = record.operation if record else operation
        op = self.catalog.get(op_name) if op_name else None
        lookup_cid = correlation_id()
        if op is None:
            return make_result(Category.success, operation or "lookup", lookup_cid,
                               "no operation is known for that id; tell the vault which operation to look up",
                               reconciled="unknown")
        if self.halted:
            return make_result(Category.local_failure, op.name, lookup_cid,
                               f"the vault stopped serving calls ({self.halted}); nothing was sent")
        if self.gate.locked:
            return make_result(Category.vault_locked, op.name, lookup_cid,
                               "the vault is locked; nothing was sent")
        prepared = await self._prepare(op, lookup_cid)
        if isinstance(prepared, Result):
            return prepared
        credential, service, executor = prepared
        idem = idem or (record.idempotency_key if record else None)
        try:
            outcome = await executor.lookup(op, credential, service, self._context(s, lookup_cid, idem, None),
                                            correlation_id=cid, idempotency_key=idem)
        except Exception as exc:
            log.error("lookup on %s failed: %s", op.executor, type(exc).__name__)
            outcome = ExecOutcome(make_result(Category.success, op.name, lookup_cid,
                                              "the lookup failed; the earlier outcome is still unknown",
                                              reconciled="unknown"))
        # the reconciliation names the call it settles, so that call's history includes it
        link = {"lookup_of": cid} if record is not None else None
        result = await self._finish(op, lookup_cid, outcome, credential, "reconciliation", link)
        return await self.record_result(s, result)

    # ---- lifecycle -------------------------------------------------------------

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
