"""What the fake remote decides for one request: auth, fault, idempotency, effect.

The server (vault/remote/server.py) owns the bytes; this module owns the
meaning. `begin` runs when the request head has arrived (ledger attempt,
`received` event, fault chosen), `respond` when the body is in (auth, the
handler, the commit, the reply and how to deliver it), `finish` when the
exchange is over (how it ended, as observed from the server side).

Only the token's *name* is ever known past `begin`: the Authorization value
is compared and dropped, so no event, reply or error can contain it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from vault.remote import api
from vault.remote.api import Handled, Route
from vault.remote.auth import EXPIRED, MISSING, UNKNOWN, Authenticator
from vault.remote.faults import ID_FAULTS, ActiveFault, FaultSpec, matches
from vault.remote.ledger import EffectLedger, EventLog, LedgerEntry
from vault.remote.state import Store

# printable ASCII, up to 255 (as real APIs take idempotency keys); spaces inside are part of it
# (HTTP trims them only at the ends): a key the remote dropped as none made a lookup by that
# key say not_found for a committed operation
_ID_OK = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?")

HTML_PAGE = b"<html><head><title>Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"


@dataclass
class Exchange:
    method: str
    path: str  # as routed: decoded, dot segments resolved (api.resolve_path)
    raw_path: str  # as sent
    query: dict[str, str]
    correlation_id: str | None
    idempotency_key: str | None
    token: str  # a token name, or MISSING / UNKNOWN / EXPIRED
    route: Route | None
    path_params: dict[str, str]
    unrouted_status: int
    fault: FaultSpec | None = None
    entry: LedgerEntry | None = None
    via: bool | None = None  # came through the vault (vault.remote.vouch); None: not checked

    def ids(self) -> dict[str, Any]:
        out = {"correlation_id": self.correlation_id, "idempotency_key": self.idempotency_key,
               "route": self.route.name if self.route else None, "method": self.method,
               "path": self.path}
        if self.raw_path != self.path:  # decoding or a dot segment changed it: keep what was sent
            out["sent_path"] = self.raw_path
        return out


@dataclass
class Reply:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)
    # how the server delivers it: "normal", "delay" (hold the whole reply),
    # "stall" (never answer), "partial" (head + half the body, then hold)
    mode: str = "normal"
    delay: float = 0.0


def _json_reply(status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, json.dumps(body).encode(), [("Content-Type", "application/json"), *(headers or [])])


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _clean_id(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    text = raw.decode("latin-1").strip()
    return text if _ID_OK.fullmatch(text) else None


class RemoteService:
    def __init__(self, credentials: dict[str, str], fault: FaultSpec | None, events: EventLog) -> None:
        self.store = Store()
        self.ledger = EffectLedger()
        self.events = events
        self.auth = Authenticator(credentials)
        self.fault = ActiveFault(fault)
        # (route, idempotency key) -> (request fingerprint, stored reply)
        self._idem: dict[tuple[str, str], tuple[str, Handled]] = {}

    def set_fault(self, spec: FaultSpec | None) -> None:
        self.fault = ActiveFault(spec)

    # --- the three steps ---------------------------------------------------

    def begin(self, method: str, target: bytes, headers: list[tuple[bytes, bytes]],
              via: bool | None = None) -> Exchange:
        parts = urlsplit(target.decode("latin-1"))
        path = api.resolve_path(parts.path)  # where a real server would route it
        route, params, unrouted = api.match(method, path)
        ex = Exchange(
            method=method, path=path, raw_path=parts.path, query=dict(parse_qsl(parts.query)),
            correlation_id=_clean_id(_header(headers, b"x-correlation-id")),
            idempotency_key=_clean_id(_header(headers, b"idempotency-key")),
            token=self.auth.identify(_header(headers, b"authorization")),
            route=route, path_params=params, unrouted_status=unrouted, via=via,
        )
        if route is not None and route.name != "operation_status":
            ex.entry = self.ledger.arrived(route.name, ex.correlation_id, ex.idempotency_key, via)
            ex.fault = self.fault.take(route.name, ex.path)
        # around the vault: which credential (its name, never its value) was presented, if any
        self.events.emit("received", **ex.ids(), fault=str(ex.fault) if ex.fault else None, via=via,
                         credential=ex.token if via is False else None)
        return ex

    def respond(self, ex: Exchange, body: bytes) -> Reply:
        if ex.route is None:
            return self._reject(ex, api.error(ex.unrouted_status, "not_found" if ex.unrouted_status == 404
                                              else "method_not_allowed", "no such endpoint"), "no_route")
        route = ex.route
        if ex.token in (MISSING, UNKNOWN, EXPIRED):
            return self._unauthenticated(ex)
        self._count_toward_expiry(ex, route)
        f = ex.fault
        if f is not None and f.name == "permission_denied":
            return self._reject(ex, Handled(403, {"error": "insufficient_scope"}), "permission_denied")
        if f is not None and f.name == "rate_limited":
            wait = str(f.params["retry_after"])
            reply = self._reject(ex, api.error(429, "rate_limited", "too many requests"), "rate_limited")
            reply.headers.append(("Retry-After", wait))
            return reply
        if f is not None and f.name == "error_status_html":
            self._rejected_event(ex, f.params["status"], "error_status_html")
            return Reply(f.params["status"], HTML_PAGE, [("Content-Type", "text/html")])
        if route.name == "operation_status":
            return self._operation_status(ex)
        try:
            data = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
            data = None
        if not isinstance(data, dict):
            return self._reject(ex, api.error(400, "invalid_json", "the body must be a JSON object"), "invalid_json")
        replay = self._idempotent_replay(ex, route, body)
        if replay is not None:
            return replay
        if self._skips_handler(ex):
            return self._faulted_without_commit(ex)
        with self.store.lock:
            # every route but operation_status (answered above) has a handler
            assert route.handler is not None
            handled = route.handler(self.store, ex.path_params, ex.query, data)
        if handled.committed and ex.entry is not None:
            self.ledger.committed(ex.entry, handled.resources)
            self.events.emit("mutation_committed", **ex.ids(), resources=handled.resources)
            if route.honours_idempotency and ex.idempotency_key:
                self._idem[(route.name, ex.idempotency_key)] = (_fingerprint(ex, body), handled)
        if handled.status >= 400:
            return self._reject(ex, handled, str(handled.body.get("error", "error")))
        return self._deliver(ex, handled)

    def finish(self, ex: Exchange, outcome: str, status: int | None = None, reason: str | None = None) -> None:
        """outcome: "response_sent" or "connection_closed" (as the server saw it)."""
        if ex.entry is not None:
            self.ledger.finished(ex.entry)
        self.events.emit(outcome, **ex.ids(), status=status, reason=reason)

    # --- pieces ------------------------------------------------------------

    def _count_toward_expiry(self, ex: Exchange, route: Route) -> None:
        spec = self.fault.spec
        if spec is not None and spec.name == "expired_token" and matches(spec, route.name, ex.path):
            self.auth.accepted(ex.token, expire_after=spec.params["after"], only=spec.params["token"])

    def _unauthenticated(self, ex: Exchange) -> Reply:
        if ex.token == EXPIRED:
            body, challenge, reason = {"error": "token_expired"}, 'Bearer error="invalid_token"', "token_expired"
        elif ex.token == MISSING:
            body, challenge, reason = {"error": "unauthenticated"}, 'Bearer realm="vaultsim"', "no_credentials"
        else:
            body, challenge, reason = {"error": "invalid_token"}, 'Bearer error="invalid_token"', "unknown_token"
        reply = self._reject(ex, Handled(401, body), reason)
        reply.headers.append(("WWW-Authenticate", challenge))
        return reply

    def _rejected_event(self, ex: Exchange, status: int, reason: str) -> None:
        self.events.emit("rejected", **ex.ids(), status=status, reason=reason)

    def _reject(self, ex: Exchange, handled: Handled, reason: str) -> Reply:
        self._rejected_event(ex, handled.status, reason)
        return _json_reply(handled.status, handled.body)

    def _operation_status(self, ex: Exchange) -> Reply:
        rid, key = ex.query.get("request_id"), ex.query.get("idempotency_key")
        if not rid and not key:
            return self._reject(ex, api.error(400, "invalid_request", "give request_id or idempotency_key"),
                                "invalid_request")
        found = self.ledger.find(request_id=rid, idempotency_key=key)
        if found is None:
            body: dict[str, Any] = {"state": "not_seen", "attempts": 0, "effects": 0, "resources": []}
        else:
            route = api.route_named(found["route"])
            body = {k: found[k] for k in ("state", "attempts", "effects", "resources")}
            body["idempotency"] = "honoured" if route and route.honours_idempotency else "ignored"
        return _json_reply(200, body)

    def _idempotent_replay(self, ex: Exchange, route: Route, body: bytes) -> Reply | None:
        if not (route.honours_idempotency and ex.idempotency_key):
            return None
        stored = self._idem.get((route.name, ex.idempotency_key))
        if stored is None:
            return None
        fingerprint, handled = stored
        if fingerprint != _fingerprint(ex, body):
            return self._reject(ex, api.error(422, "idempotency_key_reuse",
                                              "this key was used for a different request"), "idempotency_key_reuse")
        self.events.emit("idempotent_replay", **ex.ids(), status=handled.status)
        return self._deliver(ex, handled)

    def _skips_handler(self, ex: Exchange) -> bool:
        """Faults whose story is that the work was never done."""
        f = ex.fault
        if f is None:
            return False
        if f.name in ("timeout_after_accept", "success_with_error_body"):
            return not f.params["commit"]
        return f.name == "truncated_json" and f.params["status"] >= 400

    def _faulted_without_commit(self, ex: Exchange) -> Reply:
        f = ex.fault
        assert f is not None
        if f.name == "timeout_after_accept":
            self.events.emit("response_stalled", **ex.ids(), committed=False)
            return Reply(0, b"", mode="stall", delay=f.params["delay"])
        if f.name == "success_with_error_body":
            return _json_reply(200, {"error": "internal_error", "message": "the request failed"})
        full = json.dumps({"error": "internal_error", "message": "the request failed", "done": False}).encode()
        return Reply(f.params["status"], full[: len(full) // 2], [("Content-Type", "application/json")])

    def _deliver(self, ex: Exchange, handled: Handled) -> Reply:
        """The success reply, bent by the fault if one applies."""
        f = ex.fault
        body = _mangle(f, handled.body) if f else handled.body
        reply = _json_reply(handled.status, body)
        if f is None:
            return reply
        if f.name == "late_response_after_commit":
            self.events.emit("response_write_delayed", **ex.ids(), delay=_finite(f.params["delay"]))
            reply.mode, reply.delay = "delay", f.params["delay"]
        elif f.name == "timeout_after_accept":
            self.events.emit("response_stalled", **ex.ids(), committed=True)
            reply.mode, reply.delay = "stall", f.params["delay"]
        elif f.name == "timeout_during_body":
            self.events.emit("response_body_stalled", **ex.ids())
            reply.mode, reply.delay = "partial", f.params["delay"]
        elif f.name == "success_with_error_body":
            reply.status = 200
        elif f.name == "truncated_json":
            reply.status = f.params["status"] or reply.status
            reply.body = reply.body[: len(reply.body) // 2]
        return reply


def _mangle(f: FaultSpec, body: Any) -> Any:
    """Malformed-data faults: change one assumption of the success body."""
    body = json.loads(json.dumps(body))  # a private copy
    target = body["items"][0] if isinstance(body, dict) and body.get("items") else body
    if f.name in ID_FAULTS and isinstance(target, dict):
        target["id"] = ID_FAULTS[f.name]
    elif f.name == "id_missing" and isinstance(target, dict):
        target.pop("id", None)
    elif f.name == "build_status_7":
        for item in body.get("items", [body]):
            if "status" in item and "number" in item:
                item["status"] = 7
    elif f.name == "success_with_error_body":
        body = {"error": "internal_error", "message": "the request failed"}
    elif f.name == "duplicated_item" and body.get("items"):
        body["items"].insert(1, dict(body["items"][0]))
    elif f.name == "reordered_items" and body.get("items"):
        body["items"].reverse()
    return body


def _fingerprint(ex: Exchange, body: bytes) -> str:
    return hashlib.sha256(ex.method.encode() + b" " + ex.path.encode() + b"\n" + body).hexdigest()


def _finite(delay: float) -> float | None:
    return None if delay == float("inf") else delay
