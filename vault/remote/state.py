"""The fake remote's data: issues, notes, releases, builds, deployments, records.

Kept apart from the HTTP handling so a test can read the state a run left
behind (`GET /_sim/state`) and compare it with what the vault claimed. Seeded
with a few releases, builds and records that the catalog's operations act on.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

# builds are listed newest first (descending `number`): the documented order
SEED_BUILDS: list[dict[str, Any]] = [
    {"id": "b-103", "number": 103, "ref": "main", "status": "running"},
    {"id": "b-102", "number": 102, "ref": "main", "status": "failed"},
    {"id": "b-101", "number": 101, "ref": "main", "status": "passed"},
    {"id": "b-90", "number": 90, "ref": "release", "status": "passed"},
]
SEED_RELEASES: list[dict[str, Any]] = [
    {"id": "rel-1", "tag": "v1.0.0", "state": "published"},
    {"id": "rel-2", "tag": "v1.1.0", "state": "published"},
    {"id": "rel-3", "tag": "v1.2.0", "state": "published"},
    # short ids, as the daemon and gate tests name them
    {"id": "r-1", "tag": "v2.0.0", "state": "published"},
    {"id": "r-2", "tag": "v2.1.0", "state": "published"},
    {"id": "r-3", "tag": "v2.2.0", "state": "published"},
]
SEED_RECORDS: list[dict[str, Any]] = [
    {"id": "rec-1", "value": "alpha", "revision": 1},
    {"id": "rec-2", "value": "beta", "revision": 1},
]
SEED_ISSUES: list[dict[str, Any]] = [
    {"id": "ISS-1", "title": "Login page is slow", "body": "", "state": "open"},
]


class Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.issues: dict[str, dict[str, Any]] = {i["id"]: dict(i) for i in SEED_ISSUES}
        self.notes: dict[str, dict[str, Any]] = {}
        self.releases: dict[str, dict[str, Any]] = {r["id"]: dict(r) for r in SEED_RELEASES}
        self.builds: dict[str, dict[str, Any]] = {b["id"]: dict(b) for b in SEED_BUILDS}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.records: dict[str, dict[str, Any]] = {r["id"]: dict(r) for r in SEED_RECORDS}
        self._counters: dict[str, int] = {}

    def next_id(self, prefix: str, start: int = 1) -> str:
        n = self._counters.get(prefix, start - 1) + 1
        self._counters[prefix] = n
        return f"{prefix}-{n}"

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy({
                "issues": list(self.issues.values()),
                "notes": list(self.notes.values()),
                "releases": list(self.releases.values()),
                "builds": list(self.builds.values()),
                "deployments": list(self.deployments.values()),
                "records": list(self.records.values()),
            })
