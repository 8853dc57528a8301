"""The approver socket: where people (TUI) and scripts decide.

    approver.hello {token, name}      must come first; token from the vault home
    subscribe      {}                 -> {pending: [...], locked}; then notifications:
                                         approval.requested, approval.settled, grant.created,
                                         grant.ended, vault.locked, activity
    decide         {request_id, decision: allow_once|allow_session|deny}
    lock / unlock  {}
    sessions       {}                 -> sessions with their grants
    revoke         {grant_id? | session_id?}
    stats          {run_id?}          -> prompt counts and scopes
    status         {}
    shutdown       {}                 -> stops the daemon (what `vaultsim stop` uses)

A connection from an agent session's process or any of its descendants is
refused even with the right token: an agent never approves itself.
"""

from __future__ import annotations

import hmac
import os
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import AuditError, RpcError
from .gate.approvals import Decision
from .jsonrpc import INVALID_PARAMS, NOT_AUTHORIZED
from .peer import is_same_or_descendant
from .rpc_server import Connection, Dispatcher

if TYPE_CHECKING:
    from .daemon import VaultDaemon

_P = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class HelloParams(BaseModel):
    model_config = _P
    token: str = Field(max_length=512)
    name: str = Field(default="approver", min_length=1, max_length=64)


class NoParams(BaseModel):
    model_config = _P


class DecideParams(BaseModel):
    model_config = _P
    request_id: str = Field(min_length=1, max_length=128)
    decision: Decision


class RevokeParams(BaseModel):
    model_config = _P
    grant_id: str | None = Field(default=None, max_length=128)
    session_id: str | None = Field(default=None, max_length=128)


class StatsParams(BaseModel):
    model_config = _P
    run_id: str | None = Field(default=None, max_length=128)


def build(d: "VaultDaemon") -> Dispatcher:
    api = Dispatcher("approver")

    def authed(conn: Connection) -> str:
        name = conn.state.get("approver")
        if not name:
            raise RpcError(NOT_AUTHORIZED, "say approver.hello with the approver token first")
        return str(name)

    @api.method("approver.hello", HelloParams)
    async def hello(conn: Connection, p: HelloParams) -> dict[str, Any]:
        if not hmac.compare_digest(p.token.encode(), d.approver_token.encode()):
            raise RpcError(NOT_AUTHORIZED, "wrong approver token")
        if is_same_or_descendant(conn.peer.pid, d.sessions.identities()):
            raise RpcError(NOT_AUTHORIZED, "refused: this process is an agent session's process or "
                           "one of its descendants; an agent never approves its own requests")
        conn.state["approver"] = p.name
        return {"approver": p.name, "locked": d.gate.locked}

    @api.method("subscribe", NoParams)
    async def subscribe(conn: Connection, p: NoParams) -> dict[str, Any]:
        authed(conn)
        pending = await d.gate.subscribe(conn)
        return {"pending": pending, "locked": d.gate.locked}

    @api.method("decide", DecideParams)
    async def decide(conn: Connection, p: DecideParams) -> dict[str, Any]:
        authed(conn)
        return await d.gate.decide(conn, p.request_id, p.decision)

    @api.method("lock", NoParams)
    async def lock(conn: Connection, p: NoParams) -> dict[str, Any]:
        return await d.gate.lock(authed(conn))

    @api.method("unlock", NoParams)
    async def unlock(conn: Connection, p: NoParams) -> dict[str, Any]:
        return await d.gate.unlock(authed(conn))

    @api.method("sessions", NoParams)
    async def sessions(conn: Connection, p: NoParams) -> dict[str, Any]:
        authed(conn)
        return {"sessions": d.gate.session_view()}

    @api.method("revoke", RevokeParams)
    async def revoke(conn: Connection, p: RevokeParams) -> dict[str, Any]:
        who = authed(conn)
        if p.grant_id:
            g = d.gate.grants.grants.get(p.grant_id)
            if g is None:
                raise RpcError(INVALID_PARAMS, f"unknown grant {p.grant_id!r}")
            return {"revoked": await d.gate.end_grants([g], f"revoked by {who}")}
        if p.session_id:
            if d.sessions.get(p.session_id) is None:
                raise RpcError(INVALID_PARAMS, f"unknown session {p.session_id!r}")
            grants = d.gate.grants.for_session(p.session_id)
            return {"revoked": await d.gate.end_grants(grants, f"revoked by {who}")}
        raise RpcError(INVALID_PARAMS, "revoke needs grant_id or session_id")

    @api.method("stats", StatsParams)
    async def stats(conn: Connection, p: StatsParams) -> dict[str, Any]:
        authed(conn)
        return d.gate.stats.report(p.run_id)

    @api.method("status", NoParams)
    async def status(conn: Connection, p: NoParams) -> dict[str, Any]:
        authed(conn)
        return d.status()

    @api.method("shutdown", NoParams)
    async def shutdown(conn: Connection, p: NoParams) -> dict[str, Any]:
        authed(conn)
        d.request_stop(f"stopped by {conn.state['approver']}")
        return {"stopping": True}

    async def on_disconnect(conn: Connection) -> None:
        d.gate.unsubscribe(conn)

    api.on_disconnect = on_disconnect
    _record_attempts(d, api)
    return api


# A minimal record of who tried to act as the approver (hello, decide, lock, unlock),
# accepted or refused: the runner grades any attempt by a process other than its own
# approver FAIL_SELF_APPROVAL. (Stand-in until the wire work records these itself.)
_ATTEMPTS = ("approver.hello", "decide", "lock", "unlock")


def _record_attempts(d: "VaultDaemon", api: Dispatcher) -> None:
    for method in _ATTEMPTS:
        model, handler = api.methods[method]

        async def recorded(conn: Connection, p: Any, _handler: Any = handler, _method: str = method) -> Any:
            accepted, reason = False, ""
            try:
                result = await _handler(conn, p)
                accepted = True
                return result
            except RpcError as exc:
                reason = exc.message
                raise
            finally:
                pid = conn.peer.pid
                event = {"type": "approver_attempt", "method": _method, "pid": pid, "sid": _id(os.getsid, pid),
                         "pgid": _id(os.getpgid, pid), "exe": conn.peer.exe, "accepted": accepted,
                         "reason": reason, "name": conn.state.get("approver") or getattr(p, "name", None),
                         "request_id": getattr(p, "request_id", None)}
                try:
                    await d.audit(event, durable=False)
                except AuditError:
                    pass
        api.methods[method] = (model, recorded)


def _id(get: Any, pid: int) -> int:
    try:
        return int(get(pid))
    except OSError:
        return -1
