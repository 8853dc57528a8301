"""The vault daemon: composes its parts and runs their lifecycle.

Process model (DESIGN.md "Processes"): one daemon per vault home, guarded by
an exclusive lock on `daemon.lock` (vault.daemon.instance); two Unix sockets (agent,
approver), 0600 in a 0700 home; asyncio throughout.

The parts, each typed and given what it needs (nothing here is a mixin):

    Recorder        vault.daemon.recorder        the audit log's one door; a failed log halts calls
    Gate            vault.gate.engine            decides: lock, policy, grants, prompts (no wire)
    ApproverHub     vault.daemon.approver_hub    subscribed approvers; the gate's `notify`/`routable`
    AgentSessions   vault.daemon.agent_sessions  sessions opened and ended with their process
    CallService     vault.daemon.calls           a call from the gate to its recorded Result
    AgentApi        vault.daemon.agent_api       the agent socket's methods
    ApproverApi     vault.daemon.approver_api    the approver socket's methods
    RpcServer       vault.daemon.rpc_server      framing, identity per line, limits

The housekeeping loop only expires grants, drops approvers that stopped
reading, polls the few processes no pidfd could be had for, and stops the
daemon when its home leaves its path (`_check_paths`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any

from vault import __version__, stop_signals
from vault.audit_events import ConnectionRefused, DaemonStarted, RequestRefused
from vault.daemon.agent_api import AgentApi
from vault.daemon.agent_sessions import AgentSessions
from vault.daemon.approver_api import ApproverApi
from vault.daemon.approver_guard import ApproverGuard
from vault.daemon.approver_hub import ApproverHub
from vault.daemon.calls import CallService, Credentials, Diagnostics
from vault.config import Resolved
from vault.errors import AuditError
from vault.executors.base import Executor
from vault.gate.engine import Gate
from vault.home import VaultHome
from vault.daemon.instance import approver_token, clear_stale_socket, mark_stopping
from vault.daemon.limits import APPROVER_RESERVE, MAX_CONNECTIONS, MAX_SESSIONS, PerProcessCount, sampled
from vault.daemon.processes import FALLBACK_POLL_S, Busy, ProcessTable
from vault.daemon.recorder import AuditSink, Recorder
from vault.daemon.peer import ProcessIdentity
from vault.daemon.rpc_server import RpcServer, raise_fd_limit
from vault.daemon.sessions import SessionTable

log = logging.getLogger("vaultsim.daemon")

# grants' TTLs, approvers that stopped reading, processes without a pidfd
_HOUSEKEEPING_S = FALLBACK_POLL_S


class VaultDaemon:
    def __init__(self, home: VaultHome, config: Resolved, *, store: Credentials, unlocked: bool = False,
                 keyring_backend: str = "", diagnostics: Diagnostics | None = None,
                 audit: AuditSink | None = None, executors: dict[str, Executor] | None = None) -> None:
        self.home = home
        self.config = config
        self.catalog = config.catalog
        self.keyring_backend = keyring_backend
        self.executors = executors or {}
        self.recorder = Recorder(audit)
        self.sessions = SessionTable()
        self.processes = ProcessTable()
        self._floods = PerProcessCount()  # connection refusals per process tree
        self._busy = PerProcessCount()  # requests refused for those in progress, per process tree
        self.hub = ApproverHub()
        self.gate = Gate(config.policy, self.sessions, self.recorder.record, notify=self.hub.notify,
                         routable=self.hub.routable, locked=not unlocked)
        self.hub.on_leave = self.gate.approver_left
        self.guard = ApproverGuard(self.sessions, self.processes)
        self.agent_sessions = AgentSessions(self.sessions, self.processes, self.gate, self.recorder,
                                            self.hub.notify, daemon_cgroup=self.guard.cgroup)
        self.calls = CallService(services=config.services, call_timeout_s=config.call_timeout_s,
                                 catalog=config.catalog, store=store, diagnostics=diagnostics,
                                 executors=self.executors, gate=self.gate, recorder=self.recorder,
                                 notify=self.hub.notify, workdir=home.root / "work",
                                 listeners=self.hub.subscribers)
        self.recorder.busy = self.calls.busy
        self.agent_api = AgentApi(self.agent_sessions, config.catalog, self.calls, status=self.status)
        self.approver_api = ApproverApi(self.gate, self.hub, self.sessions, approver_token(home),
                                        guard=self.guard, audit_soon=self.recorder.record_soon,
                                        status=self.status, request_stop=self.request_stop)
        # monotonic: a wall clock set back (NTP, a VM resumed) made uptime_s negative
        self.started = time.monotonic()
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self.stop_signal: signal.Signals | None = None  # the signal that stopped it, if one did
        # when (wall clock) it was continued (SIGCONT): a SIGSTOP leaves no trace of its own, so a
        # stop undone before the runner looked is seen by the SIGCONT that undid it
        self.continued: list[float] = []
        self.continued_count = 0
        self._servers: list[RpcServer] = []
        self._home_id: tuple[int, int] | None = None  # (device, inode) of the home it serves
        self._home_gone = 0  # housekeeping ticks in a row that found another home (or none) there
        self._socket_lost: set[str] = set()  # sockets already said to be replaced

    @property
    def audit_sink(self) -> AuditSink | None:
        return self.recorder.sink

    @audit_sink.setter
    def audit_sink(self, sink: AuditSink | None) -> None:
        """Swap the log before serving (a test that opens it with its own options does)."""
        self.recorder.sink = sink

    @property
    def halted(self) -> str | None:
        return self.recorder.halted

    async def _housekeeping(self) -> None:
        """End grants whose TTL passed, drop approvers that stopped reading, and poll the
        processes that have no pidfd. Sessions of exited processes end by notification."""
        while not self._stop.is_set():
            self._check_paths()
            self.processes.poll_unwatched()
            self.hub.check_stalled()
            with contextlib.suppress(AuditError):
                await self.gate.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), _HOUSEKEEPING_S)

    def _check_paths(self) -> None:
        """Is the home still at its path, and are the sockets there still ours? A home that left
        its path (`umount -l`, moved, replaced) stops the daemon: clients can no longer find it
        (`status` says none serves, a second daemon can start there), and whatever it wrote by
        path (the audit head, a rotation) would land in the other directory. Its log is ended
        through the open descriptor, unsigned; the next start on the real home signs it.
        A socket replaced while the home stays is said once (the runner names who did it)."""
        if self._home_id is None or self._stop.is_set():
            return
        try:
            st = os.stat(self.home.root)
            here: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except (FileNotFoundError, NotADirectoryError):
            here = None
        except OSError:
            return  # EIO, ESTALE, EACCES for a moment (a network file system): not proof it left
        # seen twice in a row (a tick apart): the stop cannot be undone, one look is not enough
        self._home_gone = self._home_gone + 1 if here != self._home_id else 0
        if self._home_gone >= 2:
            why = (f"the vault home {self.home.root} is no longer at its path (unmounted, moved or "
                   "replaced); nothing more is written there by path")
            log.error("%s; stopping", why)
            abandon = getattr(self.audit_sink, "abandon", None)
            if callable(abandon):
                abandon(why)
            self.request_stop(why)
            return
        for srv in self._servers:
            if srv.path not in self._socket_lost and not srv.owns_path():
                self._socket_lost.add(srv.path)
                log.warning("%s is no longer this daemon's socket (removed or replaced): new clients "
                            "cannot reach it there; held connections are still served", srv.path)

    # ---- status and lifecycle -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"version": __version__, "pid": os.getpid(), "home": str(self.home.root),
                "keyring_backend": self.keyring_backend, "sessions": len(self.sessions.sessions),
                "uptime_s": round(time.monotonic() - self.started, 3), "halted": self.halted,
                "audit": self.audit_sink is not None, **self.gate.status(), "approvers": len(self.hub),
                # what clients hold, against the limits in vault.daemon.limits
                "connections": self.processes.connections, "partial_bytes": self.processes.partial_bytes,
                "approvers_dropped": self.hub.dropped,
                # the runner checks the log on disk against these (FAIL_AUDIT_TAMPER)
                "audit_head": self.audit_sink.signed_head() if self.audit_sink is not None else None,
                "audit_tip": self.audit_sink.durable_tip() if self.audit_sink is not None else None,
                # each failure the log resumed from once there was room (a full disk freed): the
                # runner grades a trial by it as by `halted` (vault.runner.trial)
                "audit_resumed": list(self.recorder.resumed),
                # each SIGCONT it received (its first 64, wall clock) and how many: a stop undone
                "continued": list(self.continued), "continued_count": self.continued_count}

    def _flooded(self, peer: ProcessIdentity, tree: tuple[int, float], held: int, where: str | None) -> None:
        """Audit a connection refused for its process tree's share, or its process's (`where`
        "process"): its first 32, then powers of two, counted per tree (the runner names the
        agent: FAIL_TOOL_ACCESS)."""
        n = self._floods.add(tree)
        if not sampled(n, 32):
            return
        extra = self.processes.who(peer)
        if where:
            extra["where"] = where
        self.recorder.record_soon(ConnectionRefused(tree_pid=tree[0], held=held, count=n, **extra))

    def _busy_refused(self, opener: ProcessIdentity, tree: tuple[int, float], busy: Busy) -> None:
        """Audit a request refused for the requests already in progress: its first 32, then powers
        of two, counted per tree (the runner names the agent's request flood: FAIL_TOOL_ACCESS)."""
        n = self._busy.add(tree)
        if not sampled(n, 32):
            return
        self.recorder.record_soon(RequestRefused(tree_pid=tree[0], limit="in_progress", where=busy.where,
                                                 at_most=busy.at_most, count=n, **self.processes.who(opener)))

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason
        self._stop.set()

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stop_signal is None:  # the first one says how it stopped (SIGINT: the CLI's 130)
            self.stop_signal = sig
        self.request_stop(f"signal {sig.name}")

    def _on_continued(self) -> None:
        """SIGCONT: someone had stopped this daemon (or signalled it for nothing); `status` says when."""
        self.continued_count += 1
        if len(self.continued) < 64:
            self.continued.append(time.time())
        log.warning("continued (SIGCONT): this daemon had been stopped, or was signalled")

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        loop = asyncio.get_running_loop()
        # SIGHUP: a foreground daemon's terminal closed; it stops as on TERM, its log signed.
        # One ignored at start (`nohup vaultsim daemon --foreground`) stays ignored; TERM never is
        for sig in stop_signals.caught():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGCONT, self._on_continued)
        if self.audit_sink is not None:
            # one durable record before any call is accepted: a log that cannot be written (full
            # device, I/O error) halts call serving now, before anything reaches a remote;
            # status stays up and says why
            with contextlib.suppress(AuditError):
                await self.recorder.record(DaemonStarted(pid=os.getpid(), version=__version__))
        for path in (self.home.agent_sock, self.home.approver_sock):
            clear_stale_socket(path)
        # a descriptor per connection and per watched process, plus files: as many as allowed
        nofile = raise_fd_limit(MAX_CONNECTIONS + MAX_SESSIONS + 1024)
        self.processes.max_connections = max(16, min(MAX_CONNECTIONS, (nofile - 256) // 2))
        self._servers = [RpcServer(str(self.home.agent_sock), self.agent_api.dispatcher(), self.processes,
                                   leave_free=APPROVER_RESERVE, on_flood=self._flooded,
                                   on_busy=self._busy_refused),
                         RpcServer(str(self.home.approver_sock), self.approver_api.dispatcher(), self.processes,
                                   on_flood=self._flooded)]
        home = os.stat(self.home.root)
        self._home_id = (home.st_dev, home.st_ino)
        for srv in self._servers:
            await srv.start()
        reaper = asyncio.create_task(self._housekeeping())
        log.info("vaultsim daemon serving %s (locked=%s)", self.home.root, self.gate.locked)
        if ready is not None:
            ready.set()
        await self._stop.wait()
        log.info("stopping: %s", self._stop_reason or "requested")
        mark_stopping()  # before its sockets close: from then on `status` says stopping, not starting
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
        self.recorder.close()
