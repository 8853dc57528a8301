"""Session grants: in memory only, bound to session + process identity + scope.

A grant answers one question: may this exact process, in this session, run this
operation on this target without asking again? It never survives the process,
the connection, a lock, a revoke or its TTL.

A TTL runs on the boot clock (CLOCK_BOOTTIME: steady, and it counts a suspend), never on the
wall clock: a wall clock stepped while a grant is live (NTP, a user, a VM restored) would
lengthen or shorten it. `created` and `expires_at` are wall times, for people to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vault.ids import new_id
from vault.daemon.peer import ProcessIdentity
from vault.gate.fatigue import BOOT_CLOCK


@dataclass(frozen=True)
class Grant:
    id: str
    session_id: str
    identity: ProcessIdentity
    operation: str
    scope: str
    created: float
    expires_at: float | None
    due: float | None = None  # the TTL's end on the table's steady clock

    def to_wire(self) -> dict[str, object]:
        return {"grant_id": self.id, "session_id": self.session_id, "operation": self.operation,
                "scope": self.scope, "pid": self.identity.pid, "created": self.created,
                "expires_at": self.expires_at}


@dataclass
class GrantTable:
    clock: Callable[[], float] = time.time
    steady: Callable[[], float] = BOOT_CLOCK
    grants: dict[str, Grant] = field(default_factory=dict)

    def add(self, session_id: str, identity: ProcessIdentity, operation: str, scope: str,
            ttl_s: float | None) -> Grant:
        now = self.clock()
        for g in self.grants.values():
            if g.session_id == session_id and g.scope == scope:
                return g
        g = Grant(new_id("g"), session_id, identity, operation, scope, now,
                  now + ttl_s if ttl_s else None, self.steady() + ttl_s if ttl_s else None)
        self.grants[g.id] = g
        return g

    def find(self, session_id: str, identity: ProcessIdentity, scope: str) -> Grant | None:
        now = self.steady()
        for g in self.grants.values():
            if (g.session_id == session_id and g.scope == scope
                    and g.identity.same_process(identity)
                    and (g.due is None or now < g.due)):
                return g
        return None

    def expired(self) -> list[Grant]:
        now = self.steady()
        return [g for g in self.grants.values() if g.due is not None and now >= g.due]

    def __len__(self) -> int:
        return len(self.grants)

    def get(self, grant_id: str) -> Grant | None:
        return self.grants.get(grant_id)

    def remove(self, grant_id: str) -> Grant | None:
        return self.grants.pop(grant_id, None)

    def for_session(self, session_id: str) -> list[Grant]:
        return [g for g in self.grants.values() if g.session_id == session_id]

    def all(self) -> list[Grant]:
        return list(self.grants.values())
