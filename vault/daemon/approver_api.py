"""The approver socket: where people (TUI) and scripts decide.

    approver.hello {token, name}      must come first; token from the vault home
    subscribe      {}                 -> {pending: [...], locked, next, until}; then notifications:
                                         approval.requested, approval.settled, grant.created,
                                         grant.ended, vault.locked, activity,
                                         session.opened, session.closed (their fields: the
                                         models of vault.wire)
    pending        {after, until?}    -> {pending: [...], next}: the rest of the subscribe snapshot
    approval.detail {request_id}      -> {request_id, agent, operation, risk, params}: a waiting
                                      request with every parameter marked safe to show in full
                                      (approval.requested cuts each to 80 characters; the
                                      others stay "[hidden]"; vault.wire.ApprovalDetail). The
                                      same approvers as decide (the policy's owner, if any);
                                      settled or unknown: -32003, as decide
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

Lists come in pages (vault.daemon.paging): each answer holds at most 256 KiB or 500
items, and `next` (null on the last page) is the `after` of the following
one, so an answer never outgrows a frame and every approver can connect.

An approver is the process that said hello: another process writing on the
same connection (a child that inherited it) is not. An agent session's
process, its descendants, and processes sharing its session id, process group
or cgroup are refused (vault.daemon.approver_guard), at hello and again at every
decide, lock, unlock, revoke and shutdown; every hello, decide, lock and
unlock attempt is recorded as an `approver_attempt` audit event. So is every
connection (method `connect`, the process that opened it): without the jail an
agent finds this socket beside its own, and one that only connects (holding the
connections, reading `status`) reached for it all the same. A process's first
CONNECTS_RECORDED connections are recorded, then its 16th, 32nd, ... Refused
attempts are bounded the same way: a process's first REFUSALS_RECORDED, then its
64th, 128th, ... (the reason says which number), since no token is needed to be
refused and each record costs the log about 550 bytes: unbounded, one process
grew it by megabytes a second until the disk filled and calls stopped. Accepted
decides, locks and unlocks are all recorded; accepted hellos, a process's first
HELLOS_RECORDED, then its 16th, 32nd, ... (an approver reconnecting in a loop
is one process saying the same thing again).

`ApproverApi`'s methods are these RPC methods; it is built from its parts (the
gate, the approver hub, the sessions, the guard, the token and a few daemon
callables), never from the daemon, and `dispatcher()` puts it on a socket.
Refusals of the gate (vault.errors.Refused) reach the wire through
vault.daemon.rpc_server, which gives them their codes.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vault.audit_events import AuditEvent
from vault.daemon import paging
from vault.daemon.approver_guard import AUDITED, ApproverGuard, attempt_event
from vault.daemon.approver_hub import ApproverHub
from vault.daemon.limits import PerProcessCount, sampled
from vault.errors import Refused, RpcError
from vault.gate.approvals import Decision
from vault.gate.engine import Gate
from vault.gate.fatigue import DEFAULT_RUBBER_STAMP_S
from vault.gate.stats import PromptStats
from vault.wire import ApprovalDetail
from vault.jsonrpc import INVALID_PARAMS, NOT_AUTHORIZED
from vault.daemon.rpc_server import Connection, Dispatcher, warn_client
from vault.daemon.sessions import SessionTable

JsonObject = dict[str, Any]  # a JSON payload (params, a result)

_P = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True, allow_inf_nan=False)
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


class DetailParams(BaseModel):
    model_config = _P
    request_id: str = Field(min_length=1, max_length=128)


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


CONNECTS_RECORDED = 8
REFUSALS_RECORDED = 32  # a process's refused attempts recorded one by one; past it, at powers of two
HELLOS_RECORDED = 8  # a process's accepted hellos recorded one by one; past it, at powers of two


class ApproverApi:
    """The approver socket's methods (see the module doc), over the daemon's parts."""

    def __init__(self, gate: Gate, hub: ApproverHub, sessions: SessionTable, token: str, *,
                 guard: ApproverGuard, audit_soon: Callable[[AuditEvent], None],
                 status: Callable[[], JsonObject], request_stop: Callable[[str], None]) -> None:
        self.gate = gate
        self.hub = hub
        self.sessions = sessions
        self.token = token
        self.guard = guard
        self.audit_soon = audit_soon
        self.status_of = status
        self.request_stop = request_stop
        self._connects = PerProcessCount()
        self._refusals = PerProcessCount()
        self._hellos = PerProcessCount()

    def dispatcher(self) -> Dispatcher:
        api = Dispatcher("approver", [
            ("approver.hello", HelloParams, self.hello), ("subscribe", NoParams, self.subscribe),
            ("pending", PendingParams, self.pending), ("decide", DecideParams, self.decide),
            ("approval.detail", DetailParams, self.detail),
            ("seen", SeenParams, self.seen), ("lock", NoParams, self.lock),
            ("unlock", NoParams, self.unlock), ("sessions", PageParams, self.list_sessions),
            ("revoke", RevokeParams, self.revoke), ("stats", StatsParams, self.stats),
            ("status", NoParams, self.status), ("shutdown", NoParams, self.shutdown)])
        api.on_refused = self.refused_early
        api.on_connect = self.on_connect
        api.on_disconnect = self.on_disconnect
        return api

    # ---- who is asking ----------------------------------------------------------

    def attempt(self, conn: Connection, method: str, accepted: bool, reason: str = "",
                name: object = None, request_id: object = None) -> None:
        if method not in AUDITED:
            return
        if not accepted:
            warn_client(f"approver {method}", "refused %s from process %d: %s", method, conn.peer.pid,
                        reason[:200])
            n = self._refusals.add((conn.peer.pid, conn.peer.create_time))
            if n > REFUSALS_RECORDED:
                if not sampled(n, REFUSALS_RECORDED):
                    return
                reason = (f"[refused attempt {n} of this process; past {REFUSALS_RECORDED} only every power of "
                          f"two is recorded] {reason}")
        elif method == "approver.hello":
            # an approver reconnecting in a loop (a script's retry without a pause) recorded each
            # hello: ~700 KB of log a second toward a full disk, which stops every call
            n = self._hellos.add((conn.peer.pid, conn.peer.create_time))
            if n > HELLOS_RECORDED:
                if not sampled(n, HELLOS_RECORDED):
                    return
                reason = f"[hello {n} of this process; past {HELLOS_RECORDED} only every power of two is recorded]"
        # the opener's ancestry as read when it connected (its entry lives while the connection does)
        other = (conn.opener.pid, conn.opener.create_time) != (conn.peer.pid, conn.peer.create_time)
        chain = self.guard.processes.chain_of(conn.opener) if other else None
        self.audit_soon(attempt_event(method, conn.peer, accepted, reason, name, request_id, conn.opener, chain))

    @staticmethod
    def authed(conn: Connection) -> str:
        """The approver name of the process that sent this (it must have said hello itself)."""
        name = conn.state.get("approver")
        if not name or conn.state.get("approver_key") != (conn.peer.pid, conn.peer.create_time):
            if name:
                raise RpcError(NOT_AUTHORIZED, "this process did not say approver.hello on this connection "
                                               "(it was opened by another process); say it first")
            raise RpcError(NOT_AUTHORIZED, "say approver.hello with the approver token first")
        return str(name)

    def acting(self, conn: Connection, request_id: str | None = None) -> str:
        """authed(), plus the full guard (vault.daemon.approver_guard): the one place where the
        process is checked against the agents, and against the requester's tree."""
        who = self.authed(conn)
        why = self.guard.refusal(conn.peer, self.gate.requester(request_id) if request_id else None)
        if why:
            raise RpcError(NOT_AUTHORIZED, why)
        return who

    async def audited(self, conn: Connection, method: str, act: Callable[[str], Awaitable[JsonObject]],
                      request_id: str | None = None) -> JsonObject:
        """Run an approver action, recording the attempt and whether it was accepted."""
        said_hello = conn.state.get("approver_key") == (conn.peer.pid, conn.peer.create_time)
        name = conn.state.get("approver") if said_hello else None
        try:
            out = await act(self.acting(conn, request_id))
        except (RpcError, Refused) as exc:
            self.attempt(conn, method, False, exc.message, name, request_id)
            raise
        self.attempt(conn, method, True, "", name, request_id)
        return out

    def refused_early(self, conn: Connection, method: str, why: str, params: JsonObject | None) -> None:
        # a frame naming an audited method that never reached its handler (bad params, bad text)
        params = params or {}
        name = params.get("name") if method == "approver.hello" else conn.state.get("approver")
        self.attempt(conn, method, False, why, name, params.get("request_id"))

    async def on_connect(self, conn: Connection) -> None:
        n = self._connects.add((conn.opener.pid, conn.opener.create_time))
        if sampled(n, CONNECTS_RECORDED):
            self.audit_soon(attempt_event("connect", conn.opener, True, ""))

    async def on_disconnect(self, conn: Connection) -> None:
        self.hub.unsubscribe(conn)

    # ---- the RPC methods ----------------------------------------------------------

    async def hello(self, conn: Connection, p: HelloParams) -> JsonObject:
        why = ""
        if not hmac.compare_digest(p.token.encode(), self.token.encode()):
            why = "wrong approver token"
        else:
            why = self.guard.refusal(conn.peer)
        if why:
            self.attempt(conn, "approver.hello", False, why, p.name)
            raise RpcError(NOT_AUTHORIZED, why)
        conn.state["approver"] = p.name
        conn.state["approver_key"] = (conn.peer.pid, conn.peer.create_time)
        self.attempt(conn, "approver.hello", True, "", p.name)
        return {"approver": p.name, "locked": self.gate.locked}

    async def subscribe(self, conn: Connection, p: NoParams) -> JsonObject:
        who = self.authed(conn)
        self.hub.subscribe(conn)
        until = self.gate.newest_prompt()
        items, nxt = paging.page(self.gate.routable_for(who, 0, until))
        return {"pending": items, "locked": self.gate.locked, "next": _str(nxt), "until": str(until)}

    async def pending(self, conn: Connection, p: PendingParams) -> JsonObject:
        who = self.authed(conn)
        until = paging.cursor(p.until) if p.until else None
        items, nxt = paging.page(self.gate.routable_for(who, paging.cursor(p.after), until))
        return {"pending": items, "next": _str(nxt)}

    async def decide(self, conn: Connection, p: DecideParams) -> JsonObject:
        if p.reason and p.decision is not Decision.deny:
            raise RpcError(INVALID_PARAMS, "a reason goes with a deny only")
        if p.reason and self.token and self.token in p.reason:
            # the agent receives the reason: the approver's secret never rides along
            raise RpcError(INVALID_PARAMS, "the reason holds the approver token; write it again without")
        return await self.audited(conn, "decide",
                                  lambda who: self.gate.decide(who, p.request_id, p.decision, p.reason),
                                  p.request_id)

    async def detail(self, conn: Connection, p: DetailParams) -> ApprovalDetail:
        # the parameters in full go only where a decision could come from: the checks of decide
        return self.gate.detail(self.acting(conn, p.request_id), p.request_id)

    async def seen(self, conn: Connection, p: SeenParams) -> JsonObject:
        return self.gate.seen(self.authed(conn), p.request_id, p.detail)

    async def lock(self, conn: Connection, p: NoParams) -> JsonObject:
        return await self.audited(conn, "lock", self.gate.lock)

    async def unlock(self, conn: Connection, p: NoParams) -> JsonObject:
        return await self.audited(conn, "unlock", self.gate.unlock)

    async def list_sessions(self, conn: Connection, p: PageParams) -> JsonObject:
        self.authed(conn)
        items, nxt = paging.page(self.gate.session_view(paging.cursor(p.after)), shrink=_fewer_grants)
        return {"sessions": items, "next": _str(nxt)}

    async def revoke(self, conn: Connection, p: RevokeParams) -> JsonObject:
        who = self.acting(conn)
        if p.grant_id:
            n = await self.gate.revoke_grant(p.grant_id, who)
            if n is None:
                raise RpcError(INVALID_PARAMS, f"unknown grant {p.grant_id!r}")
            return {"revoked": n}
        if p.session_id:
            if self.sessions.get(p.session_id) is None:
                raise RpcError(INVALID_PARAMS, f"unknown session {p.session_id!r}")
            return {"revoked": await self.gate.revoke_session(p.session_id, who)}
        raise RpcError(INVALID_PARAMS, "revoke needs grant_id or session_id")

    async def stats(self, conn: Connection, p: StatsParams) -> JsonObject:
        self.authed(conn)
        return _stats_page(self, p.run_id, paging.cursor(p.after), p.rubber_stamp_s)

    async def status(self, conn: Connection, p: NoParams) -> JsonObject:
        self.authed(conn)
        return self.status_of()

    async def shutdown(self, conn: Connection, p: NoParams) -> JsonObject:
        who = self.acting(conn)
        self.request_stop(f"stopped by {who}")
        return {"stopping": True}


def _str(n: int | None) -> str | None:
    return None if n is None else str(n)


def _fewer_grants(session: dict[str, Any], budget: int) -> dict[str, Any]:
    grants = session.get("grants") or []
    return {**session, "grants": grants[:_GRANTS_SHOWN], "grants_total": len(grants)}


class _HasStats(Protocol):
    @property
    def stats(self) -> PromptStats: ...


class _HasGate(Protocol):
    @property
    def gate(self) -> _HasStats: ...


def _stats_page(holder: _HasGate, run_id: str | None, after: int,
                rubber_stamp_s: float = DEFAULT_RUBBER_STAMP_S) -> JsonObject:
    """Prompt statistics, paged: the runs first, then the sessions (positions count both)."""
    st = holder.gate.stats
    runs = [(r, c) for r, c in st.runs.items() if run_id is None or r == run_id]
    sessions = [(s, c) for s, c in st.sessions.items() if run_id is None or st.session_run.get(s) == run_id]

    def items() -> Iterator[tuple[int, tuple[str, str, JsonObject]]]:
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

