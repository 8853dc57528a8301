"""The approver hub: who is subscribed, who can receive a prompt, and telling them.

Kept apart from the gate, which decides, so that delivery can never hold a
decision up: `notify` encodes a notification once and hands it to each
subscriber's connection without waiting. A subscriber that stops reading (a
stopped process, a TUI under Ctrl-Z, a slow script) only grows its own
backlog; once that backlog passes MAX_SUBSCRIBER_BACKLOG, or has not moved
for SUBSCRIBER_STALL_S, or the backlogs of all subscribers together pass
MAX_SUBSCRIBERS_BACKLOG, the subscriber is disconnected and the daemon logs
it. Its prompts then reach the other approvers (they had them already), or,
with nobody left who can receive them, are settled unroutable by the gate
(`on_leave`), exactly as when an approver disconnects on its own.
"""

from __future__ import annotations

from typing import Callable

from vault import jsonrpc as rpc
from vault.daemon.limits import MAX_SUBSCRIBER_BACKLOG, MAX_SUBSCRIBERS_BACKLOG, SUBSCRIBER_STALL_S, KiB, MiB
from vault.daemon.rpc_server import Connection
from vault.wire import Notification


class ApproverHub:
    def __init__(self) -> None:
        self.subscribers: dict[str, Connection] = {}  # conn id -> connection
        self.dropped = 0  # subscribers disconnected for not reading
        # called after a subscriber left (disconnected, dropped): the gate re-routes
        self.on_leave: Callable[[], None] | None = None

    @staticmethod
    def name(conn: Connection) -> str:
        return str(conn.state.get("approver", "?"))

    def subscribe(self, conn: Connection) -> None:
        self.subscribers[conn.id] = conn

    def unsubscribe(self, conn: Connection) -> None:
        if self.subscribers.pop(conn.id, None) is not None and self.on_leave is not None:
            self.on_leave()

    def __len__(self) -> int:
        return len(self.subscribers)

    def targets(self, owner: str | None = None) -> list[Connection]:
        """Subscribers that receive a prompt for `owner` (None: any approver)."""
        return [c for c in self.subscribers.values()
                if not c.closed.is_set() and (owner is None or self.name(c) == owner)]

    def routable(self, owner: str | None) -> bool:
        return any(not c.closed.is_set() and (owner is None or self.name(c) == owner)
                   for c in self.subscribers.values())

    def notify(self, note: Notification, owner: str | None = None) -> None:
        """Send one notification to every subscriber it is for; never waits."""
        targets = self.targets(owner)
        if not targets:
            return
        frame = rpc.encode_notification(note.METHOD, note.to_params())
        self._shed(len(frame) * len(targets))
        for conn in targets:
            why = self._too_slow(conn, len(frame))
            if why:
                self.drop(conn, why)
            elif not conn.closed.is_set():
                conn.send(frame)

    def check_stalled(self) -> None:
        """Housekeeping: drop subscribers whose backlog stopped moving while nothing new came."""
        for conn in list(self.subscribers.values()):
            why = self._too_slow(conn, 0)
            if why:
                self.drop(conn, why)

    @staticmethod
    def _too_slow(conn: Connection, adding: int) -> str:
        backlog = conn.backlog()
        if backlog + adding > MAX_SUBSCRIBER_BACKLOG:
            return (f"it stopped reading: {backlog // KiB} KiB of notifications wait for it "
                    f"(at most {MAX_SUBSCRIBER_BACKLOG // KiB} KiB)")
        stalled = conn.stalled_for()
        if stalled > SUBSCRIBER_STALL_S:
            return f"it stopped reading: its notifications have not moved for {stalled:.0f} s"
        return ""

    def _shed(self, adding: int) -> None:
        """Each subscriber may hold 1 MiB, but a thousand that stopped reading held a gigabyte: once
        all backlogs together would pass MAX_SUBSCRIBERS_BACKLOG, the largest are dropped until
        half of it is left (one that keeps up, with no backlog, is never dropped for the others)."""
        total = sum(c.backlog() for c in self.subscribers.values())
        if total + adding <= MAX_SUBSCRIBERS_BACKLOG:
            return
        for conn in sorted(self.subscribers.values(), key=lambda c: c.backlog(), reverse=True):
            backlog = conn.backlog()
            if not backlog or total <= MAX_SUBSCRIBERS_BACKLOG // 2:
                break
            total -= backlog
            self.drop(conn, f"it stopped reading ({backlog // KiB} KiB wait for it) while the approvers' "
                            f"unsent notifications reached {MAX_SUBSCRIBERS_BACKLOG // MiB} MiB in all")

    def drop(self, conn: Connection, why: str) -> None:
        """Disconnect a subscriber (the server logs why)."""
        self.dropped += 1
        self.unsubscribe(conn)
        conn.drop(why)
