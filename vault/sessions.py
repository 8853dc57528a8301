"""Agent sessions: each bound to the process that opened it and its connection.

A session id is a handle, not a credential: it is honoured only when presented
by the same process (pid + create_time + exe) that opened it. A fresh process,
a child, or a successor that reused the pid owns nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .ids import new_id
from .peer import ProcessIdentity


@dataclass(frozen=True)
class Session:
    id: str
    agent: str
    run_id: str | None
    identity: ProcessIdentity
    conn_id: str
    opened: float

    def to_wire(self) -> dict[str, object]:
        return {"session_id": self.id, "agent": self.agent, "run_id": self.run_id,
                "pid": self.identity.pid, "exe": self.identity.exe, "opened": self.opened}


@dataclass
class SessionTable:
    sessions: dict[str, Session] = field(default_factory=dict)

    def open(self, agent: str, run_id: str | None, identity: ProcessIdentity, conn_id: str) -> Session:
        s = Session(new_id("s"), agent, run_id, identity, conn_id, time.time())
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
