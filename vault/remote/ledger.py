"""What really happened at the remote: the effect ledger and the event log.

The vault's Result is a claim; these are the ground truth the tests and the
runner grade it against. The ledger counts, per logical operation (the
Idempotency-Key when the client sent one, scoped to the operation's route as
providers scope them, else the request id), how many attempts arrived and how
many effects were committed, so a duplicate effect is one number, and one key
used for an issue and for a note is two operations, not one that took effect
twice. The event log is the remote's own story, one JSON line per
step (`received`, `mutation_committed`, `response_write_delayed`,
`connection_closed`, `response_sent`, `rejected`, ...), each with the
correlation id. Neither ever holds a header value other than the correlation
id and idempotency key, so no credential can reach them.

Both are written from the server's event loop and read from tests or the
runner in other threads, hence the locks.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vault.atomic import open_append


@dataclass
class LedgerEntry:
    key: str
    key_kind: str  # "idempotency_key" | "request_id"
    route: str
    attempts: int = 0
    effects: int = 0
    in_flight: int = 0
    request_ids: list[str] = field(default_factory=list)
    resources: list[dict[str, str]] = field(default_factory=list)
    # attempts that did not come through the vault (vault.remote.vouch); 0 when unchecked
    not_via_vault: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "key_kind": self.key_kind, "route": self.route,
            "attempts": self.attempts, "effects": self.effects, "in_flight": self.in_flight,
            "request_ids": list(self.request_ids), "resources": [dict(r) for r in self.resources],
            "not_via_vault": self.not_via_vault,
        }

    @property
    def state(self) -> str:
        # an effect is final; a stalled attempt may still commit; else nothing happened
        if self.effects:
            return "committed"
        if self.in_flight:
            return "in_progress"
        return "not_committed"


class EffectLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, LedgerEntry] = {}
        self._by_request: dict[str, str] = {}
        self._anon = 0

    def arrived(self, route: str, request_id: str | None, idempotency_key: str | None,
                via: bool | None = None) -> LedgerEntry:
        with self._lock:
            if idempotency_key:
                key, kind = f"idem:{route}:{idempotency_key}", "idempotency_key"
            elif request_id:
                key, kind = "req:" + request_id, "request_id"
            else:
                self._anon += 1
                key, kind = f"anon:anonymous-{self._anon}", "request_id"
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = LedgerEntry(idempotency_key or key.split(":", 1)[1], kind, route)
            entry.attempts += 1
            entry.in_flight += 1
            if via is False:
                entry.not_via_vault += 1
            if request_id:
                entry.request_ids.append(request_id)
                self._by_request[request_id] = key
            return entry

    def committed(self, entry: LedgerEntry, resources: list[dict[str, str]]) -> None:
        with self._lock:
            entry.effects += 1
            entry.resources.extend(resources)

    def finished(self, entry: LedgerEntry) -> None:
        with self._lock:
            entry.in_flight = max(0, entry.in_flight - 1)

    def find(self, *, request_id: str | None = None, idempotency_key: str | None = None,
             route: str | None = None) -> dict[str, Any] | None:
        """An operation's entry by request id, or by key (of `route`, when given). A key a client
        used on several routes names several operations: the answer is theirs together, and
        `in_progress` (cannot tell) unless they all agree."""
        with self._lock:
            if idempotency_key:
                entries = [e for e in self._entries.values() if e.key_kind == "idempotency_key"
                           and e.key == idempotency_key and (route is None or e.route == route)]
            elif request_id:
                key = self._by_request.get(request_id)
                entries = [self._entries[key]] if key in self._entries else []
            else:
                entries = []
            if not entries:
                return None
            if len(entries) == 1:
                return {**entries[0].to_dict(), "state": entries[0].state}
            states = {e.state for e in entries}
            merged = {**entries[0].to_dict(), "route": ",".join(e.route for e in entries),
                      "attempts": sum(e.attempts for e in entries), "effects": sum(e.effects for e in entries),
                      "request_ids": [r for e in entries for r in e.request_ids],
                      "resources": [dict(r) for e in entries for r in e.resources]}
            return {**merged, "state": states.pop() if len(states) == 1 else "in_progress"}

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**e.to_dict(), "state": e.state} for e in self._entries.values()]

    def total_effects(self) -> int:
        with self._lock:
            return sum(e.effects for e in self._entries.values())

    def total_attempts(self) -> int:
        with self._lock:
            return sum(e.attempts for e in self._entries.values())


class EventLog:
    """Events in memory and, optionally, appended as JSON lines to a file."""

    def __init__(self, path: Path | None = None) -> None:
        self._cond = threading.Condition()
        self._events: list[dict[str, Any]] = []
        self._file = None
        if path is not None:
            fd = open_append(path)  # a FIFO nobody reads: said at once, not a remote that never starts
            self._file = os.fdopen(fd, "a", encoding="utf-8")

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"t": round(time.time(), 6), "event": event}
        record.update({k: v for k, v in fields.items() if v is not None})
        with self._cond:
            record["seq"] = len(self._events) + 1
            self._events.append(record)
            if self._file is not None:
                try:
                    self._file.write(json.dumps(record, sort_keys=True) + "\n")
                    self._file.flush()
                except OSError as exc:  # e.g. a full disk: events stay in memory, the remote serves on
                    print(f"vaultsim remote: cannot write the event log ({exc.strerror}); "
                          "events are kept in memory only", file=sys.stderr)
                    self._drop_file()
            self._cond.notify_all()
        return record

    def snapshot(self, correlation_id: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            events = list(self._events)
        if correlation_id is not None:
            events = [e for e in events if e.get("correlation_id") == correlation_id]
        return [dict(e) for e in events]

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 5.0) -> dict[str, Any] | None:
        """Block (another thread) until an event matches; None at the timeout."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for event in self._events[seen:]:
                    if predicate(event):
                        return dict(event)
                seen = len(self._events)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def close(self) -> None:
        with self._cond:
            self._drop_file()

    def _drop_file(self) -> None:
        """Stop writing to the file (caller holds the lock); a failed close is no news."""
        if self._file is not None:
            f, self._file = self._file, None
            try:
                f.close()
            except OSError:
                pass
