"""Agent sessions' lifecycle: opening one for the process that asked, ending it when that process exits.

The table of sessions is vault.daemon.sessions; this is what happens around it. A
session is opened for the process that wrote `session.open` (its identity,
the markers that belong to it alone, whether the host it names is its
ancestor), recorded (with its ancestry, vault.lineage, so a process of another
run on the same machine can be told apart from the trial's agents after it is
gone), and shown to approvers. It ends the moment its process
exits: the process is watched through a pidfd (vault.daemon.processes), so nothing
polls every session. Ending it ends its grants (vault.gate) before approvers
are told.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypedDict

from pydantic import JsonValue

from vault import audit_events as A
from vault.daemon.approver_guard import marks_of
from vault.errors import AuditError
from vault.gate.engine import Gate, Notify
from vault.daemon.peer import Markers, ProcessIdentity, has_ancestor
from vault.daemon.processes import ProcessEntry, ProcessTable
from vault.daemon.recorder import Recorder
from vault.daemon.sessions import ClientLabel, Session, SessionTable
from vault.daemon.status_asks import StatusAsks
from vault.wire import SessionClosed, SessionOpened


class _Label(TypedDict, total=False):
    client: dict[str, JsonValue] | None  # the opener's label, recorded only when it gave one
    lineage: list[tuple[int, float]]  # the opener's ancestry, recorded only when it could be read
    kin: list[tuple[int, float]]  # with it: its tree root's children older than it
    gone: list[int]  # with it: which of its ancestors and kin had exited as it opened


class AgentSessions:
    def __init__(self, table: SessionTable, processes: ProcessTable, gate: Gate, recorder: Recorder,
                 notify: Notify, *, daemon_cgroup: str) -> None:
        self.table = table
        self.processes = processes
        self.gate = gate
        self.recorder = recorder
        self.notify = notify
        self.daemon_cgroup = daemon_cgroup
        self._bg: set[asyncio.Future[None]] = set()
        self.status_asks = StatusAsks(processes)  # whose vault.status asks are recorded: it knows the openers

    async def open(self, ident: ProcessIdentity, conn_id: str, agent: str, run_id: str | None,
                   client: ClientLabel | None = None) -> Session:
        """Open a session for the process `ident` that sent the request on connection `conn_id`."""
        entry = self.processes.get(ident)
        if entry.markers is None:
            entry.markers = Markers.of(ident.pid)
        marks = marks_of(ident, entry.markers, self.daemon_cgroup)
        # the label is the opener's claim; the one part the daemon can check is the host's ancestry
        # (pid 1, every process's ancestor, says nothing about who started the agent)
        verified = client is not None and client.host_pid is not None and client.host_pid > 1 and \
            has_ancestor(ident.pid, client.host_pid)
        s = self.table.open(agent, run_id, ident, conn_id, process=entry, sid=entry.markers.sid,
                            pgid=entry.markers.pgid, marks=marks, client=client, host_verified=verified)
        entry.sessions += 1
        if not entry.was_agent:
            entry.was_agent = True
            self.processes.watch(entry, self._process_exited)
            self.status_asks.held(entry)
        label: _Label = {} if client is None else {"client": s.client_wire()}
        chain = self.processes.lineage_of(entry)
        if chain:
            label["lineage"] = chain
            # its tree root's older children (the agent among them while it is there), and which of
            # those and of its ancestors had exited as it opened (vault.daemon.gone_watch)
            if (kin := self.processes.kin_of(entry)[1]) is not None:
                label["kin"] = kin
            label["gone"] = self.processes.gone_now(entry) or []
        with contextlib.suppress(AuditError):
            await self.recorder.record(A.SessionOpened(session_id=s.id, agent=agent, pid=s.identity.pid, sid=s.sid,
                                                       pgid=s.pgid, run_id=run_id, **label), durable=False,
                                       hold=True)
        # the same evidence as the audit record, for a transcript built from these alone
        told = {k: v for k, v in label.items() if k in ("lineage", "kin", "gone")}
        self.notify(SessionOpened.model_validate({**s.to_wire(), **told}))
        return s

    def _process_exited(self, entry: ProcessEntry) -> None:
        """A watched process exited (its pidfd said so): end its sessions now."""
        self.gate.process_exited(entry.key)
        for s in self.table.for_process(entry.key):
            task = asyncio.ensure_future(self.close(s, "process exited"))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    async def close(self, s: Session, reason: str) -> None:
        if self.table.remove(s.id) is None:
            return
        if s.process is not None:
            s.process.sessions -= 1
            self.processes.release(s.process)
        await self.gate.end_session(s, reason)
        with contextlib.suppress(AuditError):
            await self.recorder.record(A.SessionClosed(session_id=s.id, reason=reason), hold=True)
        self.notify(SessionClosed(session_id=s.id, reason=reason))
