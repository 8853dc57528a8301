"""The idempotency key a remote is given for an agent's key: the agent's own, in its run.

An agent picks its keys as it likes (contract §5: "any text"), so two agents, or two runs
against one remote, may pick the same one ("create-1"). The remote keeps one logical operation
per key: the second would be refused 422 (other parameters) or replayed the first one's result,
and a lookup by that key would read the other agent's call. So the key the remote receives is
`DIGEST:KEY`: a short digest of (run id, agent name), then the agent's key. It is a pure
function of the three (no daemon secret), so every resend and lookup of one agent and run,
a restarted agent's or across a daemon restart, sends the same key; and the digest's fixed
length means two (run, agent) pairs meet only if their 64-bit digests collide. The executors
encode the result for their transport (http: `wire_key`, percent-encoded or its SHA-256 past
255 characters; ssh: hashed into a marker name), as they did the agent's key alone.
"""

from __future__ import annotations

import hashlib
import json

DIGEST_CHARS = 16  # hex: 64 bits, short enough to leave a person reading the ledger the key


def scope(run_id: str | None, agent: str) -> str:
    """The digest naming one agent in one run (JSON: no separator can be forged by a name)."""
    return hashlib.sha256(json.dumps([run_id, agent]).encode()).hexdigest()[:DIGEST_CHARS]


def remote_key(run_id: str | None, agent: str, key: str) -> str:
    """The key the executors send for `key` of `agent` in `run_id`."""
    return f"{scope(run_id, agent)}:{key}"
