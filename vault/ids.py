"""Identifiers: random, time-ordered, never derived from a secret; and the scope that makes an
agent's idempotency key and call ids its own in its run (`scope`, `remote_key`).

An agent picks its keys as it likes (contract §5: "any text"), so two agents, or two runs
against one remote, may pick the same one ("create-1"). The remote keeps one logical operation
per key: the second would be refused 422 (other parameters) or replayed the first one's result,
and a lookup by that key would read the other agent's call. So the key the remote receives is
`DIGEST:KEY`: a short digest of (run id, agent name), then the agent's key. It is a pure
function of the three (no daemon secret), so every resend and lookup of one agent and run,
a restarted agent's or across a daemon restart, sends the same key; and the digest's fixed
length means two (run, agent) pairs meet only if their 64-bit digests collide. The executors
encode the result for their transport (http: `wire_key`, percent-encoded or its SHA-256 past
255 characters; ssh: hashed into a marker name), as they did the agent's key alone. (Here, not in
a module of its own: every call takes it, and a call's path is kept to few modules, #17.)
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import time


def _stamp() -> str:
    # millisecond time prefix keeps ids sortable in logs; the rest is random
    return f"{int(time.time() * 1000):011x}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{_stamp()}{secrets.token_hex(8)}"


def correlation_id() -> str:
    return new_id("c")


def token(nbytes: int = 32) -> str:
    return secrets.token_urlsafe(nbytes)


DIGEST_CHARS = 16  # hex: 64 bits, short enough to leave a person reading the ledger the key


@functools.lru_cache(maxsize=1024)
def scope(run_id: str | None, agent: str) -> str:
    """The digest naming one agent in one run (JSON: no separator can be forged by a name).
    Every call's correlation id ends with it: the few (run, agent) pairs of a daemon's sessions
    are hashed once, not per call (bounded: a flood of names only evicts)."""
    return hashlib.sha256(json.dumps([run_id, agent]).encode()).hexdigest()[:DIGEST_CHARS]


def remote_key(run_id: str | None, agent: str, key: str) -> str:
    """The key the executors send for `key` of `agent` in `run_id`."""
    return f"{scope(run_id, agent)}:{key}"
