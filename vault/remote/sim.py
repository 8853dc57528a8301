"""Test-only introspection under `/_sim/`: loopback only, the runner's token required.

A runner that started the remote as a subprocess reads the ground truth here
and changes the fault between cases. Every request must carry the server's
`sim_token` as `X-Sim-Token` (checked in vault.remote.server, before this
module sees it): an agent that finds the remote must not be able to clear
the fault it is being tested against.

    GET  /_sim/ledger                  {"operations": [ledger entries]}
    GET  /_sim/events[?correlation_id=C]  [event, ...]  (a bare list)
    GET  /_sim/state                   {"issues": [...], "releases": [...], ...}
    GET  /_sim/fault                   {"fault": {...}|null, "url": ..., "service_url": ...}
    POST /_sim/fault                   body {"fault": "name:k=v,op=X"} or {"name", "params", "operation"}
                                       or {"fault": null} to clear; answers like GET
    POST /_sim/release                 ends every stalled response now
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from vault.errors import BadInput
from vault.remote.faults import FaultSpec

if TYPE_CHECKING:
    from vault.remote.server import RemoteServer


def handle(server: "RemoteServer", method: str, path: str, query: dict[str, str],
           body: bytes) -> tuple[int, Any]:
    if method == "GET" and path == "/_sim/ledger":
        return 200, {"operations": server.ledger.snapshot()}
    if method == "GET" and path == "/_sim/events":
        return 200, server.events.snapshot(query.get("correlation_id"))
    if method == "GET" and path == "/_sim/state":
        return 200, server.store.snapshot()
    if path == "/_sim/fault" and method in ("GET", "POST"):
        if method == "POST":
            try:
                server.set_fault(_parse_fault(body))
            except BadInput as exc:
                return 400, {"error": "bad_fault", "message": exc.message}
        return 200, fault_info(server)
    if method == "POST" and path == "/_sim/release":
        server.release()
        return 200, {"released": True}
    return 404, {"error": "not_found", "message": "no such _sim endpoint"}


def fault_info(server: "RemoteServer") -> dict[str, Any]:
    spec = server.fault
    return {"fault": spec.to_dict() if spec else None, "url": server.url, "service_url": server.service_url}


def _parse_fault(body: bytes) -> FaultSpec | None:
    try:
        data = json.loads(body) if body else {}
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise BadInput("body must be JSON") from None
    if not isinstance(data, dict):
        raise BadInput("body must be a JSON object")
    if "fault" in data:
        text = data["fault"]
        if text is None:
            return None
        if not isinstance(text, str):
            raise BadInput("'fault' must be a string like name:k=v or null")
        return FaultSpec.parse(text)
    return FaultSpec.from_dict(data)
