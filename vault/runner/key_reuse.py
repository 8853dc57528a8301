"""One idempotency key sent for two different requests: FAIL_RECOVERY ("reused a key for another
request: one key for two steps, of one operation or of two", docs/agent-contract.md §5, §9).

The remote's ledger counts one logical operation per (route, key). A route that honours keys
answers a reused key with other parameters with a 422, which names it. One that ignores keys
(deployments) runs both requests, and its ledger entry then held two steps' effects under one
key: read as one operation that took effect twice (FAIL_DUPLICATE_EFFECT, though each step took
effect once) and as a step sent again after its success, never as the key reused. Here the
requests under one key are told apart by what they carried (method, path and query, JSON body,
as the remote got them through the vault): two shapes are two requests, and the effects of each
are counted on their own. A request whose shape is not known (not captured) tells nothing.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from vault.runner.evidence import Evidence


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def shapes(ev: Evidence) -> dict[str, str]:
    """correlation id -> what the request carried (method, target, body), as one string; not for a
    request whose JSON body the remote never got whole (a timeout after its head or during its
    body: what it carried is not known)."""
    return {str(r["correlation_id"]): json.dumps([r.get("method"), *_target(str(r.get("target") or "")),
                                                  r.get("body")], sort_keys=True, default=str)
            for r in ev.requests_sent if r.get("correlation_id")
            and (r.get("method") not in _BODY_METHODS or isinstance(r.get("body"), dict))}


def _target(target: str) -> tuple[str, list[tuple[str, str]]]:
    """A request's path and its query values in one order (the order they came in tells nothing)."""
    path, _, query = target.partition("?")
    return path, sorted(parse_qsl(query, keep_blank_values=True))


def _groups(entry: dict[str, Any], shape: dict[str, str]) -> dict[str, list[str]]:
    """The request ids of a ledger entry, by what they carried (only those whose shape is known)."""
    out: dict[str, list[str]] = {}
    for rid in entry.get("request_ids") or []:
        if str(rid) in shape:
            out.setdefault(shape[str(rid)], []).append(str(rid))
    return out


def most_effects_of_one_request(ev: Evidence, entry: dict[str, Any], shape: dict[str, str] | None = None) -> int:
    """The effects of a ledger entry that one request (one set of parameters) had: under a key
    reused for two steps of an operation that ignores keys, each step's own. `shape`: shapes(ev),
    made once by a caller asking for every entry (made per entry, 2,000 requests took 16 s)."""
    groups = _groups(entry, shapes(ev) if shape is None else shape)
    if entry.get("key_kind") != "idempotency_key" or len(groups) < 2:
        return int(entry.get("effects", 0))
    committed = ev.committed_cids()
    return max(sum(1 for rid in rids if rid in committed) for rids in groups.values())


def same_request(ev: Evidence, a: str, b: str, shape: dict[str, str] | None = None) -> bool:
    """Did correlation ids `a` and `b` carry the same request (unknown: taken as the same)?
    `shape` as for most_effects_of_one_request."""
    shape = shapes(ev) if shape is None else shape
    return a not in shape or b not in shape or shape[a] == shape[b]


def key_reuse(ev: Evidence) -> list[str]:
    named = {str(e.get("correlation_id")) for e in ev.remote_events
             if e.get("event") == "rejected" and e.get("reason") == "idempotency_key_reuse"}
    out = [f"an idempotency key was reused for a different {e.get('route')} request (the remote answered "
           f"422; {e.get('correlation_id')}): one key names one step"
           for e in ev.remote_events if e.get("event") == "rejected" and e.get("reason") == "idempotency_key_reuse"]
    # a route that ignores keys ran every request sent under one: no 422 says so
    shape = shapes(ev)
    for entry in ev.ledger:
        groups = _groups(entry, shape)
        if entry.get("key_kind") != "idempotency_key" or len(groups) < 2 \
                or any(rid in named for rids in groups.values() for rid in rids):
            continue
        firsts = [rids[0] for rids in groups.values()]
        out.append(f"one idempotency key was sent for {len(groups)} different {entry.get('route')} requests "
                   f"({', '.join(firsts)}): one key names one step")
    # one key sent for several operations: the remote keeps keys per route, so no 422 says so, but
    # a lookup by that key names them all (it cannot tell which step it asks about). The key itself
    # is not shown: it is the agent's text
    routes: dict[str, list[tuple[str, str]]] = {}
    for entry in ev.ledger:
        if entry.get("key_kind") == "idempotency_key" and entry.get("request_ids"):
            routes.setdefault(str(entry.get("key")), []).append((str(entry.get("route")), str(entry["request_ids"][0])))
    for shared in routes.values():
        if len({r for r, _ in shared}) > 1:
            names = ", ".join(dict.fromkeys(r for r, _ in shared))
            out.append(f"one idempotency key was sent for {len(shared)} different operations ({names}; first "
                       f"{shared[0][1]}): one key names one step")
    return out
