"""Agent sessions: each bound to the process that opened it and its connection.

A session id is a handle, not a credential: it is honoured only when presented
by the same process (pid + create_time + exe) that opened it. A fresh process,
a child, or a successor that reused the pid owns nothing.

A session may carry a `ClientLabel`: who the opener says it serves (an MCP
bridge names its host, e.g. "claude-code 1.2, pid 4121, via mcp"). It is a
claim, shown to approvers as one; the only fact is the opener's own process.
The daemon checks one part of it: whether the named host pid is an ancestor of
the opener (`host_verified`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .ids import new_id
from .peer import ProcessIdentity


class ClientLabel(BaseModel):
    """Who a session's process says it acts for; printable and short, since approvers read it."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    name: str = Field(min_length=1, max_length=64)
    version: str | None = Field(default=None, max_length=32)
    host_pid: int | None = Field(default=None, ge=1, le=2**31 - 1)
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
    client: ClientLabel | None = None
    host_verified: bool = False

    def client_wire(self) -> dict[str, object] | None:
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

    def open(self, agent: str, run_id: str | None, identity: ProcessIdentity, conn_id: str,
             client: ClientLabel | None = None, host_verified: bool = False) -> Session:
        s = Session(new_id("s"), agent, run_id, identity, conn_id, time.time(), client, host_verified)
        self.sessions[s.id] = s
        return s

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: str) -> Session | None:
        return self.sessions.pop(session_id, None)

    def for_conn(self, conn_id: str) -> list[Session]:
        return [s for s in self.sessions.values() if s.conn_id == conn_id]

    def dead(self) -> list[Session]:
        return [s for s in self.sessions.values() if not s.identity.alive()]

    def all(self) -> list[Session]:
        return list(self.sessions.values())

    def identities(self) -> list[ProcessIdentity]:
        return [s.identity for s in self.sessions.values()]

    def check(self, session_id: str, caller: ProcessIdentity) -> tuple[Session | None, str]:
        """Return (session, "") if `caller` owns it, else (None, why not)."""
        s = self.sessions.get(session_id)
        if s is None:
            return None, ("unknown or closed session: sessions end when their process exits "
                          "or its connection closes; open a new session")
        if not s.identity.same_process(caller):
            return None, (f"session {s.id} belongs to process {s.identity.pid}, not to this process "
                          f"(pid {caller.pid}); approvals never pass between processes, "
                          "open your own session")
        return s, ""
