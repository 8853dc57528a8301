"""Prompts an agent caused by asking from another session than the one holding the grant.

The contract (§3): a grant "for the session" covers that one session; a child (a worker per step)
that calls a gated operation its parent's session was granted asks the owner again, and those
prompts count (`FAIL_APPROVAL_FATIGUE`). The default prompt budget counts one prompt per gated
step, which a worker per step stays within, so that case is found here: a prompt in a session of
agent i for a scope another process of the same agent i held a live grant for when it was asked.
The same holds for another session of the same process (§3: open one session per process): a
session per gated step, the first still open with its grant, makes each step ask again.
A restart (the runner's next process, another agent index) and a grant that had ended (its
session closed, a lock, a revoke, or its policy's `ttl_s` passed: the daemon records an expiry
only when it next grants) are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vault.runner.evidence import Evidence
from vault.text import quoted


def asked_beside_grant(ev: Evidence, ttl_of: Callable[[str], float | None]) -> list[str]:
    """ttl_of: an operation's grant lifetime under the run's policy (None: until its session ends)."""
    t = ev.transcript
    agent_of: dict[str, int] = {}
    by_cid: dict[str, Any] = {}
    for e in sorted(t.entries, key=lambda e: e.time):
        by_cid.setdefault(e.correlation_id, e)
        if e.agent_index is not None and e.session_id:
            agent_of.setdefault(e.session_id, e.agent_index)
    out = []
    for p in t.prompts:
        entry = by_cid.get(str(p.get("correlation_id")))
        if entry is None or entry.session_id not in agent_of:
            continue
        sid, scope = entry.session_id, str(p.get("scope"))
        at = float(p.get("time") or entry.time or 0.0)
        pid = _pid(t.sessions, sid)
        ttl = ttl_of(str(p.get("operation") or entry.operation))
        holder = next((g for g in t.grants
                       if g.get("scope") == scope and g.get("session_id") != sid
                       and agent_of.get(str(g.get("session_id"))) == agent_of[sid]
                       and _pid(t.sessions, str(g.get("session_id"))) is not None
                       and float(g.get("time") or 0.0) <= at < _end(g, ttl)), None)
        if holder is not None:
            other = _pid(t.sessions, str(holder.get("session_id")))
            if other == pid:
                out.append(f"agent {agent_of[sid]} asked for {quoted(scope)} in another session of its process {pid} "
                           "while an earlier session of it, still open, held a session grant for it: a grant covers its "
                           "own session only; open one session per process and make gated calls there")
                continue
            out.append(f"agent {agent_of[sid]} asked for {quoted(scope)} from process {pid} while its process "
                       f"{other} held a session grant for it: a grant covers its own session only; make gated "
                       "calls from the process whose session holds the grant")
    return out


def _end(grant: dict[str, Any], ttl: float | None) -> float:
    ended = float(grant.get("ended") or float("inf"))
    return min(ended, float(grant.get("time") or 0.0) + ttl) if ttl else ended


def _pid(sessions: dict[str, dict[str, Any]], sid: str) -> int | None:
    pid = (sessions.get(sid) or {}).get("pid")
    return pid if isinstance(pid, int) else None
