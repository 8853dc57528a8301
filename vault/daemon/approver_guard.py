"""Who may act on the approver socket: never an agent, nor anything from an agent's tree.

The token file is the first door, but an agent runs as the same user and,
without the jail, may read it. So every approver hello, decide, lock, unlock,
revoke and shutdown is also checked against the agents the daemon knows, at
the moment it is made (a process can become an agent after its hello):

    refused when the process                              because
    opened an agent session at any time in its life       an agent never approves (a parent that
                                                          said hello first, then opened a session)
    is, or descends from, a process holding a session     its own tree
    shares a session id, process group or cgroup that     a double fork leaves the tree but keeps
    belongs to an agent (`marks`)                         these
    (decide) is, descends from, or shares a mark with     even after that session ended
    the process whose request it decides

A marker belongs to the agent alone only when the agent leads it: its pid is
the session id (it or its launcher called setsid) or the process group id, or
its cgroup is its own (not its parent's, not the daemon's). A session id
shared with the shell that also started the approver would refuse that
approver, so it is not used. What a process can still do past these (setsid in
a double-forked child, in a shared cgroup) only the agent jail prevents: the
README's threat model says so.

Every attempt at hello, decide, lock and unlock, accepted or refused, is one
`approver_attempt` audit event, with the process that made it.
"""

from __future__ import annotations

import os
from typing import Any

from vault.audit_events import ApproverAttempt
from vault.daemon.peer import Markers, ProcessIdentity, cgroup_of
from vault.lineage import RECORDED_DEPTH, lineage, same_start
from vault.daemon.processes import ProcessTable
from vault.daemon.sessions import Mark, Session, SessionTable

AUDITED = frozenset({"approver.hello", "decide", "lock", "unlock"})


def marks_of(identity: ProcessIdentity, markers: Markers, daemon_cgroup: str) -> tuple[Mark, ...]:
    """The markers that belong to this agent process alone (see the module doc)."""
    out: list[Mark] = []
    if markers.sid == identity.pid:
        out.append(("sid", markers.sid))
    if markers.pgid == identity.pid:
        out.append(("pgid", markers.pgid))
    if markers.cgroup and markers.cgroup != daemon_cgroup:
        try:
            parent = os.getppid() if identity.pid == os.getpid() else _ppid(identity.pid)
        except OSError:
            parent = -1
        if parent > 0 and cgroup_of(parent) not in ("", markers.cgroup):
            out.append(("cgroup", markers.cgroup))
    return tuple(out)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # the comm field may hold spaces and parentheses: the ppid follows the last ")"
    return int(stat[stat.rindex(b")") + 2:].split()[1])


_WHAT = {"sid": "session id", "pgid": "process group", "cgroup": "cgroup"}


class ApproverGuard:
    def __init__(self, sessions: SessionTable, processes: ProcessTable) -> None:
        self.sessions = sessions
        self.processes = processes
        self.cgroup = cgroup_of(os.getpid())

    def refusal(self, caller: ProcessIdentity, request: Session | None = None) -> str:
        """Why `caller` may not act as an approver now ("" when it may)."""
        key = (caller.pid, caller.create_time)
        entry = self.processes.find(key)
        if entry is not None and entry.was_agent:
            return ("refused: this process opened an agent session; an agent never approves "
                    "its own requests (nor its children's)")
        ancestry = lineage(caller.pid)
        if not ancestry or not same_start(ancestry[0][1], caller.create_time):
            return "refused: the process that sent this has exited"
        if any(self.sessions.holds(pid, start) for pid, start in ancestry):
            return ("refused: this process is an agent session's process or one of its descendants; "
                    "an agent never approves its own requests")
        markers = Markers.of(caller.pid)
        for kind, value in (("sid", markers.sid), ("pgid", markers.pgid), ("cgroup", markers.cgroup)):
            if value not in (-1, "") and self.sessions.marked((kind, value)):
                return (f"refused: this process shares its {_WHAT[kind]} with an agent session's process "
                        "(it came from an agent's process tree); an agent never approves its own requests")
        if request is not None:
            if any(pid == request.identity.pid and same_start(start, request.identity.create_time)
                   for pid, start in ancestry):
                return (f"refused: request comes from this process or one of its ancestors "
                        f"(pid {request.identity.pid}); an agent never approves its own requests")
            for kind, mark in request.marks:
                if (kind, mark) in (("sid", markers.sid), ("pgid", markers.pgid), ("cgroup", markers.cgroup)):
                    return (f"refused: this process shares its {_WHAT[kind]} with the process that made "
                            "the request; an agent never approves its own requests")
        return ""


def attempt_event(method: str, caller: ProcessIdentity, accepted: bool, reason: str,
                  name: Any = None, request_id: Any = None, opener: ProcessIdentity | None = None,
                  opener_chain: list[tuple[int, float]] | None = None) -> ApproverAttempt:
    """The `approver_attempt` audit event (its shape is read by the runner's grading). `opener`:
    the process that opened the connection, `opener_chain` its ancestry as read at accept."""
    markers = Markers.of(caller.pid) if caller.pid > 0 else Markers(-1, -1, "")
    chain = lineage(caller.pid)[:RECORDED_DEPTH] if caller.pid > 0 else []
    if chain and not same_start(chain[0][1], caller.create_time):
        chain = []  # gone, and its pid reused: not its ancestry
    extra: dict[str, Any] = {"lineage": chain} if chain else {}  # absent, not null, when unknown
    if opener is not None:
        # a root process names any pid as a line's writer (SCM_CREDENTIALS), never as the
        # connection's opener: the runner grades by the opener where the two differ
        extra["opener_pid"] = opener.pid
        if (opener.pid, opener.create_time) != (caller.pid, caller.create_time) and opener_chain:
            extra["opener_lineage"] = opener_chain[:RECORDED_DEPTH]
    return ApproverAttempt(method=method, pid=caller.pid, sid=markers.sid, pgid=markers.pgid, exe=caller.exe,
                           accepted=accepted, reason=reason[:_MAX_TEXT * 4],
                           # as sent (bounded): the record shows what was tried, not a cleaned-up version
                           name=name[:_MAX_TEXT] if isinstance(name, str) else None,
                           request_id=request_id[:_MAX_TEXT] if isinstance(request_id, str) else None, **extra)


_MAX_TEXT = 128
