"""Agent sessions: each bound to the process that opened it and its connection.

A session id is a handle, not a credential: it is honoured only when presented
by the same process (pid + create_time + exe) that opened it, and only while
that process lives (its pidfd is polled at every use: a frame the process
wrote just before it exited does not act for it). A fresh process, a child, or
a successor that reused the pid owns nothing.

A request refused because another process presented a session is recorded
(vault.daemon.agent_api): `presented_by_other` names the session's owner, also
for the last `CLOSED_REMEMBERED` sessions that ended (a child handed the id of
a parent that has exited is as much a hand-off as one whose parent waits).

The table also keeps what the approver side must refuse: the processes that
hold sessions (an approver may be none of them, nor descend from one) and the
markers their trees share (`marks`: a session id, process group or cgroup
that belongs to the agent alone, see vault.daemon.approver_guard).

A session may carry a `ClientLabel`: who the opener says it serves (an MCP
bridge names its host, e.g. "claude-code 1.2, pid 4121, via mcp"). It is a
claim, shown to approvers as one; the only fact is the opener's own process.
The daemon checks one part of it: whether the named host pid is an ancestor of
the opener (`host_verified`).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt, field_validator

from vault.ids import new_id
from vault.daemon.peer import ProcessIdentity
from vault.lineage import same_start
from vault.daemon.processes import Key, ProcessEntry

_seq = itertools.count(1)

Mark = tuple[str, object]  # ("sid", 4121) | ("pgid", 4121) | ("cgroup", "/agents/a1")

# ended sessions whose owner is remembered, to name it when another process presents one
# (one id and one identity each: about 200 bytes apiece)
CLOSED_REMEMBERED = 4096


class ClientLabel(BaseModel):
    """Who a session's process says it acts for; printable and short, since approvers read it."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    name: str = Field(min_length=1, max_length=64)
    version: str | None = Field(default=None, max_length=32)
    host_pid: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1)  # `true` is no pid
    via: str | None = Field(default=None, max_length=16)

    @field_validator("name", "version", "via")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("must be printable text (no control or format characters)")
        return value

    def text(self) -> str:
        """e.g. "claude-code 1.2 (pid 4121) via mcp"."""
        out = self.name + (f" {self.version}" if self.version else "")
        if self.host_pid is not None:
            out += f" (pid {self.host_pid})"
        return out + (f" via {self.via}" if self.via else "")


@dataclass(frozen=True)
class Session:
    id: str
    agent: str
    run_id: str | None
    identity: ProcessIdentity
    conn_id: str
    opened: float
    seq: int = field(default_factory=lambda: next(_seq))
    sid: int = -1
    pgid: int = -1
    marks: tuple[Mark, ...] = ()
    process: ProcessEntry | None = field(default=None, compare=False, repr=False)
    client: ClientLabel | None = None
    host_verified: bool = False

    @property
    def key(self) -> Key:
        return (self.identity.pid, self.identity.create_time)

    def alive(self) -> bool:
        return self.process.alive() if self.process is not None else True

    def client_wire(self) -> dict[str, JsonValue] | None:
        """The label as approvers get it: marked as a claim, with what the daemon could check."""
        if self.client is None:
            return None
        return {**self.client.model_dump(exclude_none=True), "text": self.client.text(),
                "claimed": True, "host_verified": self.host_verified}

    def to_wire(self) -> dict[str, object]:
        out: dict[str, object] = {"session_id": self.id, "agent": self.agent, "run_id": self.run_id,
                                  "pid": self.identity.pid, "exe": self.identity.exe, "opened": self.opened}
        if self.client is not None:
            out["client"] = self.client_wire()
        return out


@dataclass
class SessionTable:
    sessions: dict[str, Session] = field(default_factory=dict)
    _by_conn: dict[str, set[str]] = field(default_factory=dict)
    _by_process: dict[Key, set[str]] = field(default_factory=dict)
    _by_pid: dict[int, set[Key]] = field(default_factory=dict)
    _marks: Counter[Mark] = field(default_factory=Counter)
    _closed: OrderedDict[str, ProcessIdentity] = field(default_factory=OrderedDict)

    def open(self, agent: str, run_id: str | None, identity: ProcessIdentity, conn_id: str, *,
             process: ProcessEntry | None = None, sid: int = -1, pgid: int = -1,
             marks: tuple[Mark, ...] = (), client: ClientLabel | None = None,
             host_verified: bool = False) -> Session:
        s = Session(new_id("s"), agent, run_id, identity, conn_id, time.time(), sid=sid, pgid=pgid,
                    marks=marks, process=process, client=client, host_verified=host_verified)
        self.sessions[s.id] = s
        self._by_conn.setdefault(conn_id, set()).add(s.id)
        self._by_process.setdefault(s.key, set()).add(s.id)
        self._by_pid.setdefault(identity.pid, set()).add(s.key)
        self._marks.update(marks)
        return s

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: str) -> Session | None:
        s = self.sessions.pop(session_id, None)
        if s is None:
            return None
        _discard(self._by_conn, s.conn_id, s.id)
        _discard(self._by_process, s.key, s.id)
        if s.key not in self._by_process:
            keys = self._by_pid.get(s.identity.pid)
            if keys is not None:
                keys.discard(s.key)
                if not keys:
                    del self._by_pid[s.identity.pid]
        self._marks.subtract(s.marks)
        for m in s.marks:
            if self._marks[m] <= 0:
                del self._marks[m]
        self._closed[s.id] = s.identity
        if len(self._closed) > CLOSED_REMEMBERED:
            self._closed.popitem(last=False)
        return s

    def for_conn(self, conn_id: str) -> list[Session]:
        return [self.sessions[i] for i in self._by_conn.get(conn_id, ())]

    def for_process(self, key: Key) -> list[Session]:
        return [self.sessions[i] for i in self._by_process.get(key, ())]

    def count_for_process(self, key: Key) -> int:
        return len(self._by_process.get(key, ()))

    def holds(self, pid: int, create_time: float) -> bool:
        """Does this process (a create_time read from /proc or psutil) hold an open session?"""
        return any(same_start(k[1], create_time) for k in self._by_pid.get(pid, ()))

    def marked(self, mark: Mark) -> bool:
        return self._marks.get(mark, 0) > 0

    def dead(self) -> list[Session]:
        return [s for s in self.sessions.values() if not s.alive()]

    def all(self) -> list[Session]:
        return list(self.sessions.values())

    def identities(self) -> list[ProcessIdentity]:
        return [s.identity for s in self.sessions.values()]

    def check(self, session_id: str, caller: ProcessIdentity) -> tuple[Session | None, str]:
        """Return (session, "") if `caller` owns it and still runs, else (None, why not)."""
        s = self.sessions.get(session_id)
        if s is None:
            return None, ("unknown or closed session: sessions end when their process exits "
                          "or its connection closes; open a new session")
        if not s.identity.same_process(caller):
            return None, (f"session {s.id} belongs to process {s.identity.pid}, not to this process "
                          f"(pid {caller.pid}); approvals never pass between processes, "
                          "open your own session")
        if not s.alive():
            return None, (f"session {s.id} ended: its process {s.identity.pid} has exited")
        return s, ""

    def presented_by_other(self, session_id: str, caller: ProcessIdentity) -> tuple[ProcessIdentity, str] | None:
        """When `caller` presented a session another process opened: that process, and
        ``not_owner`` (it still runs), ``owner_exited`` or ``closed`` (the session had ended).
        None for an id never seen (or long forgotten) and for the caller's own session."""
        s = self.sessions.get(session_id)
        if s is not None:
            if s.identity.same_process(caller):
                return None
            return s.identity, ("not_owner" if s.alive() else "owner_exited")
        owner = self._closed.get(session_id)
        if owner is None or owner.same_process(caller):
            return None
        return owner, "closed"

    def ended_own(self, session_id: str, caller: ProcessIdentity) -> bool:
        """Did `caller` present a session of its own that had ended (it closed it, or the
        connection that opened it closed)? The runner names the step it left undone so."""
        owner = self._closed.get(session_id)
        return owner is not None and session_id not in self.sessions and owner.same_process(caller)


def _discard(index: dict[Any, set[str]], key: Any, sid: str) -> None:
    ids = index.get(key)
    if ids is not None:
        ids.discard(sid)
        if not ids:
            del index[key]
