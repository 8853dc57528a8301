"""The approver socket: where people (TUI) and scripts decide.

    approver.hello {token, name}      must come first; token from the vault home
    subscribe      {}                 -> {pending: [...], locked, next, until}; then notifications:
                                         approval.requested, approval.settled, grant.created,
                                         grant.ended, vault.locked, activity,
                                         session.opened, session.closed (their fields: the
                                         models of vault.wire)
    pending        {after, until?}    -> {pending: [...], next}: the rest of the subscribe snapshot
    decide         {request_id, decision: allow_once|allow_session|deny, reason?}
                                      reason: a deny's short note (<= 200 printable characters),
                                      the only thing of the approver's the agent receives
    seen           {request_id, detail?}  the prompt is visible to the person (detail: its
                                      detail is open); the vault's clock records when, for the
                                      fatigue figures (vault.gate.fatigue). Never audited alone:
                                      the times go into the decision event
    lock / unlock  {}
    sessions       {after?}           -> {sessions: [...], next}: sessions with their grants
    revoke         {grant_id? | session_id?}
    stats          {run_id?, after?, rubber_stamp_s?}
                                      -> {runs, sessions, next}: prompt counts, scopes and the
                                         fatigue figures per run (rubber-stamp threshold default 1 s)
    status         {}
    shutdown       {}                 -> stops the daemon (what `vaultsim stop` uses)

Lists come in pages (vault.paging): each answer holds at most 256 KiB or 500
items, and `next` (null on the last page) is the `after` of the following
one, so an answer never outgrows a frame and every approver can connect.

An approver is the process that said hello: another process writing on the
same connection (a child that inherited it) is not. An agent session's
process, its descendants, and processes sharing its session id, process group
or cgroup are refused (vault.approver_guard), at hello and again at every
decide, lock, unlock, revoke and shutdown; every hello, decide, lock and
unlock attempt is recorded as an `approver_attempt` audit event.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import paging
from .approver_guard import AUDITED, attempt_event
from .errors import RpcError
from .gate.approvals import Decision
from .gate.fatigue import DEFAULT_RUBBER_STAMP_S
from .jsonrpc import INVALID_PARAMS, NOT_AUTHORIZED
from .rpc_server import Connection, Dispatcher, warn_client

if TYPE_CHECKING:
    from .daemon import VaultDaemon

_P = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
_Cursor = Field(default=None, max_length=20, pattern=r"^[0-9]*$")
_GRANTS_SHOWN = 100  # per session in one page; `grants_total` says how many there are


class HelloParams(BaseModel):
    model_config = _P
    token: str = Field(max_length=512)
    name: str = Field(default="approver", min_length=1, max_length=64)


class NoParams(BaseModel):
    model_config = _P


class PageParams(BaseModel):
    model_config = _P
    after: str | None = _Cursor


class PendingParams(BaseModel):
    model_config = _P
    after: str | None = _Cursor
    until: str | None = _Cursor


MAX_REASON = 200


class DecideParams(BaseModel):
    model_config = _P
    request_id: str = Field(min_length=1, max_length=128)
    decision: Decision
    reason: str = Field(default="", max_length=MAX_REASON)

    @field_validator("reason")
    @classmethod
    def _printable(cls, value: str) -> str:
        value = value.strip()
        if not value.isprintable():
            raise ValueError("a reason is printable text on one line")
        return value


class SeenParams(BaseModel):
    model_config = _P
    request_id: str = Field(min_length=1, max_length=128)
    detail: bool = False


class RevokeParams(BaseModel):
    model_config = _P
    grant_id: str | None = Field(default=None, max_length=128)
    session_id: str | None = Field(default=None, max_length=128)


class StatsParams(BaseModel):
    model_config = _P
    run_id: str | None = Field(default=None, max_length=128)
    after: str | None = _Cursor
    rubber_stamp_s: float = Field(default=DEFAULT_RUBBER_STAMP_S, ge=0, le=3600)


def build(d: "VaultDaemon") -> Dispatcher:
    api = Dispatcher("approver")

    def attempt(conn: Connection, method: str, accepted: bool, reason: str = "",
                name: Any = None, request_id: Any = None) -> None:
        if method not in AUDITED:
            return
        if not accepted:
            warn_client(f"approver {method}", "refused %s from process %d: %s", method, conn.peer.pid,
                        reason[:200])
        d.audit_soon(attempt_event(method, conn.peer, accepted, reason, name, request_id))

    def authed(conn: Connection) -> str:
        """The approver name of the process that sent this (it must have said hello itself)."""
        name = conn.state.get("approver")
        if not name or conn.state.get("approver_key") != (conn.peer.pid, conn.peer.create_time):
            if name:
                raise RpcError(NOT_AUTHORIZED, "this process did not say approver.hello on this connection "
                                               "(it was opened by another process); say it first")
            raise RpcError(NOT_AUTHORIZED, "say approver.hello with the approver token first")
        return str(name)

    def acting(conn: Connection, request_id: str | None = None) -> str:
        """authed(), plus the full guard (vault.approver_guard)."""
        who = authed(conn)
        ap = d.gate.pending.get(request_id) if request_id else None
        why = d.guard.refusal(conn.peer, ap.session if ap is not None else None)
        if why:
            raise RpcError(NOT_AUTHORIZED, why)
        return who

    async def audited(conn: Connection, method: str, act: Any, request_id: str | None = None) -> Any:
        """Run an approver action, recording the attempt and whether it was accepted."""
        said_hello = conn.state.get("approver_key") == (conn.peer.pid, conn.peer.create_time)
        name = conn.state.get("approver") if said_hello else None
        try:
            out = await act(acting(conn, request_id))
        except RpcError as exc:
            attempt(conn, method, False, exc.message, name, request_id)
            raise
        attempt(conn, method, True, "", name, request_id)
        return out

    def refused_early(conn: Connection, method: str, why: str, params: dict[str, Any] | None) -> None:
        # a frame naming an audited method that never reached its handler (bad params, bad text)
        params = params or {}
        name = params.get("name") if method == "approver.hello" else conn.state.get("approver")
        attempt(conn, method, False, why, name, params.get("request_id"))

    api.on_refused = refused_early

    @api.method("approver.hello", HelloParams)
    async def hello(conn: Connection, p: HelloParams) -> dict[str, Any]:
        why = ""
        if not hmac.compare_digest(p.token.encode(), d.approver_token.encode()):
            why = "wrong approver token"
        else:
            why = d.guard.refusal(conn.peer)
        if why:
            attempt(conn, "approver.hello", False, why, p.name)
            raise RpcError(NOT_AUTHORIZED, why)
        conn.state["approver"] = p.name
        conn.state["approver_key"] = (conn.peer.pid, conn.peer.create_time)
        attempt(conn, "approver.hello", True, "", p.name)
        return {"approver": p.name, "locked": d.gate.locked}

    @api.method("subscribe", NoParams)
    async def subscribe(conn: Connection, p: NoParams) -> dict[str, Any]:
        authed(conn)
        until = d.gate.subscribe(conn)
        items, nxt = paging.page(d.gate.routable_for(conn, 0, until))
        return {"pending": items, "locked": d.gate.locked, "next": _str(nxt), "until": str(until)}

    @api.method("pending", PendingParams)
    async def pending(conn: Connection, p: PendingParams) -> dict[str, Any]:
        authed(conn)
        until = paging.cursor(p.until) if p.until else None
        items, nxt = paging.page(d.gate.routable_for(conn, paging.cursor(p.after), until))
        return {"pending": items, "next": _str(nxt)}

    @api.method("decide", DecideParams)
    async def decide(conn: Connection, p: DecideParams) -> dict[str, Any]:
        if p.reason and p.decision is not Decision.deny:
            raise RpcError(INVALID_PARAMS, "a reason goes with a deny only")
        if p.reason and d.approver_token and d.approver_token in p.reason:
            # the agent receives the reason: the approver's secret never rides along
            raise RpcError(INVALID_PARAMS, "the reason holds the approver token; write it again without")
        return await audited(conn, "decide",
                             lambda who: d.gate.decide(conn, p.request_id, p.decision, p.reason), p.request_id)

    @api.method("seen", SeenParams)
    async def seen(conn: Connection, p: SeenParams) -> dict[str, Any]:
        authed(conn)
        return d.gate.seen(conn, p.request_id, p.detail)

    @api.method("lock", NoParams)
    async def lock(conn: Connection, p: NoParams) -> dict[str, Any]:
        return await audited(conn, "lock", d.gate.lock)

    @api.method("unlock", NoParams)
    async def unlock(conn: Connection, p: NoParams) -> dict[str, Any]:
        return await audited(conn, "unlock", d.gate.unlock)

    @api.method("sessions", PageParams)
    async def sessions(conn: Connection, p: PageParams) -> dict[str, Any]:
        authed(conn)
        items, nxt = paging.page(d.gate.session_view(paging.cursor(p.after)), shrink=_fewer_grants)
        return {"sessions": items, "next": _str(nxt)}

    @api.method("revoke", RevokeParams)
    async def revoke(conn: Connection, p: RevokeParams) -> dict[str, Any]:
        who = acting(conn)
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
        return _stats_page(d, p.run_id, paging.cursor(p.after), p.rubber_stamp_s)

    @api.method("status", NoParams)
    async def status(conn: Connection, p: NoParams) -> dict[str, Any]:
        authed(conn)
        return d.status()

    @api.method("shutdown", NoParams)
    async def shutdown(conn: Connection, p: NoParams) -> dict[str, Any]:
        who = acting(conn)
        d.request_stop(f"stopped by {who}")
        return {"stopping": True}

    async def on_disconnect(conn: Connection) -> None:
        d.gate.unsubscribe(conn)

    api.on_disconnect = on_disconnect
    return api


def _str(n: int | None) -> str | None:
    return None if n is None else str(n)


def _fewer_grants(session: dict[str, Any], budget: int) -> dict[str, Any]:
    grants = session.get("grants") or []
    return {**session, "grants": grants[:_GRANTS_SHOWN], "grants_total": len(grants)}


def _stats_page(d: "VaultDaemon", run_id: str | None, after: int,
                rubber_stamp_s: float = DEFAULT_RUBBER_STAMP_S) -> dict[str, Any]:
    """Prompt statistics, paged: the runs first, then the sessions (positions count both)."""
    st = d.gate.stats
    runs = [(r, c) for r, c in st.runs.items() if run_id is None or r == run_id]
    sessions = [(s, c) for s, c in st.sessions.items() if run_id is None or st.session_run.get(s) == run_id]

    def items() -> Any:
        for i, (r, c) in enumerate(runs, start=1):
            if i > after:
                yield i, ("run", r, c.to_wire(rubber_stamp_s))
        for i, (s, c) in enumerate(sessions, start=len(runs) + 1):
            if i > after:
                yield i, ("session", s, {"run_id": st.session_run.get(s), **c.to_wire(None)})

    def shrink(item: tuple[str, str, dict[str, Any]], budget: int) -> tuple[str, str, dict[str, Any]]:
        return item[0], item[1], paging.trim_counts(item[2], budget)

    taken, nxt = paging.page(items(), shrink=shrink)
    out: dict[str, Any] = {"runs": {}, "sessions": {}, "next": _str(nxt)}
    for kind, key, counts in taken:
        out["runs" if kind == "run" else "sessions"][key] = counts
    return out
