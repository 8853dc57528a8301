"""The agent socket: the only surface an agent has (DESIGN.md "Wire protocol").

    session.open   {agent, run_id?, client?}                         -> {session_id}
    call           {session_id, operation, params, idempotency_key?, wait_s?} -> Result
    call.resume    {session_id, resume_token, wait_s?}                -> Result
    call.cancel    {session_id, resume_token}                         -> {withdrawn, state, request_id}
    lookup         {session_id, correlation_id? | idempotency_key?, operation?} -> Result
    session.close  {session_id}                                       -> {}
    catalog        {}                                                 -> {fingerprint, operations}
    vault.status   {}                                                 -> daemon status (no secrets)

`client` is an optional label the opener claims ({name, version?, host_pid?, via?}:
an MCP bridge names the host it serves); approvers see it marked as a claim.
`call.cancel` withdraws the agent's own pending request (its MCP client cancelled
the call): the approver's row goes away and it never runs. `catalog` lists what
an agent may name: each operation's description, risk, parameters and the
policy's approval mode; no endpoint, service or credential.

An agent names an operation and its parameters; it never sends a URL, a header
or a credential and never receives one.

Each request acts for the process that wrote it (`conn.peer`, from
SCM_CREDENTIALS), not for whoever opened the connection: a child riding its
parent's connection owns none of the parent's sessions. Sessions are capped
per connection, per process and in all (vault.daemon.limits); past a cap,
`session.open` is answered -32004 and nothing is opened.

A request that presents a session another process opened (a child handed its
parent's id by environment or file; the runner's intruder) is refused, and
recorded as a `session_refused` audit event: the method, the operation if it
named one, the sending process and the owner (never its parameters, resume
token or key), so a report can name the hand-off. Requests are not otherwise
rate-bounded, so neither are these records but for one bound: a process's
first `REFUSALS_RECORDED` refusals are recorded, then only its 64th, 128th,
256th ... (each with its `count`), so a flood of them adds a few records per
process, not one per request (per process, not per connection: reconnecting
starts no new count). An id never seen is refused unrecorded (it
names no owner). A process presenting its own session after it ended (its
connection closed) is recorded alike, reason `ended`: the report says why its
step was refused.

A `call` or `lookup` in the sender's own session that names an operation the
catalog does not have (refused -32602, or looked up as `unknown`) is recorded
too, as an `unknown_operation` audit event under the same bound: without it a
call of `drop_database` left no trace, and a report could not name the misuse.
So is a `call` refused for parameters its operation does not declare (their
names in `unknown_params`), or for values its declared ones refuse (their names
in `refused_params`): `create_issue` with `admin: true` left none either.

`AgentApi`'s methods are these RPC methods, over the parts they need (the
sessions, the catalog, the call service); it never sees the daemon, and
`dispatcher()` puts it on a socket.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vault.audit_events import ForeignReference, RequestRefused, SessionRefused, UnknownOperation
from vault.daemon.agent_sessions import AgentSessions
from vault.daemon.calls import CallService
from vault.catalog import Catalog
from vault.errors import BadInput, RpcError
from vault.gate.policy import Policy
from vault.ids import correlation_id
from vault.jsonrpc import INVALID_PARAMS, LIMIT
from vault.daemon.limits import (MAX_SESSIONS, MAX_SESSIONS_PER_CONNECTION, MAX_SESSIONS_PER_PROCESS,
                                 PerProcessCount, sampled)
from vault.models import Category, Result, make_result
from vault.lineage import ancestors_gone
from vault.daemon.gone_watch import REQUEST_GONE
from vault.daemon.rpc_server import Connection, Dispatcher, warn_client
from vault.daemon.sessions import ClientLabel, Session

JsonObject = dict[str, Any]  # a JSON payload (params, a result)

_P = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True, allow_inf_nan=False)
__all__ = ["AgentApi", "MAX_SESSIONS_PER_CONNECTION", "MAX_SESSIONS_PER_PROCESS", "MAX_SESSIONS"]
_Name = Field(min_length=1, max_length=128)


class OpenParams(BaseModel):
    model_config = _P
    agent: str = _Name
    run_id: str | None = Field(default=None, max_length=128)
    client: ClientLabel | None = None

    @field_validator("agent", "run_id")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # shown to approvers and in reports: no control or format characters (escapes, bidi)
        if value is not None and not value.isprintable():
            raise ValueError("must be printable text (no control or format characters)")
        return value


class CallParams(BaseModel):
    model_config = _P
    session_id: str = _Name
    operation: str = _Name
    params: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    wait_s: float | None = Field(default=None, ge=0, le=86400)


class ResumeParams(BaseModel):
    model_config = _P
    session_id: str = _Name
    resume_token: str = Field(min_length=1, max_length=200)
    wait_s: float | None = Field(default=None, ge=0, le=86400)


class LookupParams(BaseModel):
    model_config = _P
    session_id: str = _Name
    correlation_id: str | None = Field(default=None, max_length=200)
    idempotency_key: str | None = Field(default=None, max_length=200)
    operation: str | None = Field(default=None, max_length=128)


class SessionParams(BaseModel):
    model_config = _P
    session_id: str = _Name


class NoParams(BaseModel):
    model_config = _P


class ResumeTokenParams(BaseModel):
    model_config = _P
    session_id: str = _Name
    resume_token: str = Field(min_length=1, max_length=200)


# what an agent learns of an operation: never its endpoint, service, executor or credential
_OP_PUBLIC = {"description", "risk", "params", "target", "idempotent", "mutates"}


def catalog_view(catalog: Catalog, policy: Policy) -> JsonObject:
    """The operations an agent may name, with the policy's rule for each; fingerprinted so a
    client can tell when it changed. Parameter declarations are dumped whole (as the catalog
    file spells them: vault.catalog.ParamSpec), so what the catalog gains reaches clients
    without a change here."""
    ops = []
    for name, op in sorted(catalog.operations.items()):
        rule = policy.rule_for(op)
        # by alias: parameters keep the catalog file's (and JSON Schema's) names, e.g. maxLength
        ops.append({"name": name, **op.model_dump(mode="json", include=_OP_PUBLIC, exclude_none=True,
                                                  by_alias=True),
                    "approval": rule.model_dump(mode="json", exclude_none=True)})
    body = json.dumps(ops, sort_keys=True, separators=(",", ":"))
    return {"fingerprint": hashlib.sha256(body.encode()).hexdigest()[:32], "operations": ops}


def refused(operation: str, why: str) -> JsonObject:
    """The Result of a request whose session the sender does not own."""
    return make_result(Category.authorization_denied, operation[:128], correlation_id(), why).model_dump(
        mode="json", exclude_none=True)


_UNKNOWN_TOKEN = "unknown resume token (or it belongs to another agent or run)"

# refused hand-offs recorded one by one per process; past it, only at powers of two
REFUSALS_RECORDED = 32
REFUSAL_IDS_KEPT = 4096  # refusals' correlation ids remembered (AgentApi.refused)


# a refused call's undeclared parameters recorded: the first few names, each bounded (an agent's text)
UNKNOWN_PARAMS_MOST = 4
UNKNOWN_PARAM_CHARS = 100


def _recorded(counts: PerProcessCount, conn: Connection) -> int | None:
    """Count one more of the sending process's refused requests; its number when it is to be
    recorded (the first REFUSALS_RECORDED, then powers of two), else None."""
    n = counts.add((conn.peer.pid, conn.peer.create_time))
    return n if sampled(n, REFUSALS_RECORDED) else None


class AgentApi:
    """The agent socket's methods (see the module doc)."""

    def __init__(self, sessions: AgentSessions, catalog: Catalog, calls: CallService, *,
                 status: Callable[[], JsonObject]) -> None:
        self.sessions = sessions
        self.table = sessions.table
        self.catalog = catalog
        self.calls = calls
        self.status_of = status
        self._refused = PerProcessCount()  # per sending process: reconnecting starts no new count
        self._unknown = PerProcessCount()
        self._foreign = PerProcessCount()
        # correlation ids of refusals (a session not the sender's, or ended): a lookup of one is
        # of an answer the vault gave, not a made-up id (oldest forgotten first)
        self._refusal_ids: dict[str, None] = {}
        self._sessions_refused = PerProcessCount()

    def dispatcher(self) -> Dispatcher:
        api = Dispatcher("agent", [
            ("session.open", OpenParams, self.session_open), ("session.close", SessionParams, self.session_close),
            ("call", CallParams, self.call), ("call.resume", ResumeParams, self.call_resume),
            ("lookup", LookupParams, self.lookup), ("vault.status", NoParams, self.status),
            ("call.cancel", ResumeTokenParams, self.call_cancel), ("catalog", NoParams, self.list_catalog)])
        api.on_disconnect = self.on_disconnect
        return api

    async def session_open(self, conn: Connection, p: OpenParams) -> JsonObject:
        # a loop of session.open must not grow the daemon forever, however many connections it uses
        if len(self.table.for_conn(conn.id)) >= MAX_SESSIONS_PER_CONNECTION:
            self._too_many_sessions(conn, "connection", MAX_SESSIONS_PER_CONNECTION)
            raise RpcError(LIMIT, f"this connection already has {MAX_SESSIONS_PER_CONNECTION} open sessions; "
                                  "close one (session.close) before opening another")
        if self.table.count_for_process((conn.peer.pid, conn.peer.create_time)) >= MAX_SESSIONS_PER_PROCESS:
            self._too_many_sessions(conn, "process", MAX_SESSIONS_PER_PROCESS)
            raise RpcError(LIMIT, f"this process already has {MAX_SESSIONS_PER_PROCESS} open sessions; "
                                  "close one (session.close) before opening another")
        if len(self.table.sessions) >= MAX_SESSIONS:
            raise RpcError(LIMIT, f"the vault already holds {MAX_SESSIONS} open sessions; "
                                  "close one (session.close) or try again later")
        s = await self.sessions.open(conn.peer, conn.id, p.agent, p.run_id, p.client)
        return {"session_id": s.id, "pid": s.identity.pid}

    def _too_many_sessions(self, conn: Connection, where: str, at_most: int) -> None:
        """Record a `session.open` refused for the sessions its connection or process holds
        (sampled as refusals are): the contract asks for one session per process, so hundreds
        are a flood the runner names (FAIL_TOOL_ACCESS)."""
        n = _recorded(self._sessions_refused, conn)
        if n is None:
            return
        peer, processes = conn.peer, self.sessions.processes
        entry = processes.entries.get((peer.pid, peer.create_time))  # a sender holds sessions: it has one
        self.sessions.recorder.record_soon(RequestRefused(
            tree_pid=processes.tree_of(entry)[0] if entry is not None else peer.pid, limit="sessions",
            where=where, at_most=at_most, count=n, **processes.who(peer)))

    def refusal(self, conn: Connection, session_id: str, method: str, operation: str | None = None) -> None:
        """Record a request refused because another process opened `session_id` (see the
        module doc for the bound); nothing for an unknown id or the sender's own open session.
        Its own session that had ended is recorded too (reason ``ended``): not a hand-off, but
        the report says why its step was refused."""
        other = self.table.presented_by_other(session_id, conn.peer)
        if other is None:
            if not self.table.ended_own(session_id, conn.peer):
                return
            other = (conn.peer, "ended")
        owner, reason = other
        n = _recorded(self._refused, conn)
        warn_client("agent session", "refused %s from process %d: session %s was opened by process %d (%s)",
                    method, conn.peer.pid, session_id, owner.pid, reason)
        if n is None:
            return
        self.sessions.recorder.record_soon(SessionRefused(
            session_id=session_id, method=method, operation=operation, owner_pid=owner.pid, reason=reason,
            count=n, **self.sessions.processes.who(conn.peer)))

    def unknown_operation(self, conn: Connection, session_id: str, method: str, operation: str,
                          params: list[str] | None = None, values: list[str] | None = None) -> None:
        """Record a call or lookup naming an operation the catalog lacks, or a call naming
        parameters its operation lacks or giving values they refuse (module doc)."""
        n = _recorded(self._unknown, conn)
        if n is not None:
            extra: dict[str, Any] = {"unknown_params": params} if params else {}
            if values:
                extra["refused_params"] = values
            self.sessions.recorder.record_soon(UnknownOperation(
                session_id=session_id, method=method, operation=operation, count=n, **extra))

    def refused(self, operation: str, why: str) -> JsonObject:
        out = refused(operation, why)
        self._refusal_ids[str(out["correlation_id"])] = None
        if len(self._refusal_ids) > REFUSAL_IDS_KEPT:
            del self._refusal_ids[next(iter(self._refusal_ids))]
        return out

    def foreign_token(self, conn: Connection, s: Session, method: str, resume_token: str) -> None:
        """Record a resume or cancel naming a token not `s`'s agent's in its run: another's, or
        one this daemon never issued (vault.runner.foreign_refs grades both; never the token)."""
        owner = self.calls.gate.token_owner(resume_token)
        if owner == (s.agent, s.run_id):
            return  # its own, forgotten since (settled over an hour ago): not another's
        self.foreign(conn, s, method, "unknown" if owner is None else "other", owner)

    def foreign(self, conn: Connection, s: Session, method: str, kind: Literal["other", "unknown"],
                owner: tuple[str, str | None] | None, operation: str | None = None,
                more: dict[str, Any] | None = None) -> None:
        n = _recorded(self._foreign, conn)
        if n is None:
            return
        extra: dict[str, Any] = {} if owner is None else {"owner": owner[0], "owner_run": owner[1] == s.run_id}
        extra.update(more or {})
        if operation is not None:
            extra["operation"] = operation[:UNKNOWN_PARAM_CHARS]
        self.sessions.recorder.record_soon(ForeignReference(session_id=s.id, method=method, whose=kind, count=n,
                                                            **extra))

    async def session_close(self, conn: Connection, p: SessionParams) -> JsonObject:
        s, why = self.table.check(p.session_id, conn.peer)
        if s is None:
            self.refusal(conn, p.session_id, "session.close")
            raise RpcError(INVALID_PARAMS, why)
        await self.sessions.close(s, "closed by agent")
        return {}

    async def call(self, conn: Connection, p: CallParams) -> Result | JsonObject:
        s, why = self.table.check(p.session_id, conn.peer)
        if s is None:
            self.refusal(conn, p.session_id, "call", p.operation)
            return self.refused(p.operation, why)
        op = self.catalog.get(p.operation)
        if op is None:
            self.unknown_operation(conn, s.id, "call", p.operation)
            raise RpcError(INVALID_PARAMS, f"unknown operation {p.operation!r}; see the catalog")
        try:
            params = op.validate_params(p.params)
        except BadInput as exc:
            extra = sorted(set(p.params) - set(op.params)) if isinstance(p.params, dict) else []
            bad = op.refused_values(p.params)
            if extra or bad:
                # a parameter the operation does not have, or a value it refuses: named (never the
                # value), as an operation the catalog lacks is
                self.unknown_operation(conn, s.id, "call", p.operation,
                                       [str(name)[:UNKNOWN_PARAM_CHARS] for name in extra[:UNKNOWN_PARAMS_MOST]],
                                       bad[:UNKNOWN_PARAMS_MOST])
            raise RpcError(INVALID_PARAMS, exc.message) from None
        REQUEST_GONE.set(self.sessions.processes.gone_now(s.process))  # as it came (vault.daemon.gone_watch)
        return await self.calls.call(s, op, params, p.idempotency_key, p.wait_s)

    async def call_resume(self, conn: Connection, p: ResumeParams) -> Result | JsonObject:
        s, why = self.table.check(p.session_id, conn.peer)
        if s is None:
            self.refusal(conn, p.session_id, "call.resume")
            return self.refused("call.resume", why)
        REQUEST_GONE.set(self.sessions.processes.gone_now(s.process))
        result = await self.calls.resume(s, p.resume_token, p.wait_s)
        if result is None:
            self.foreign_token(conn, s, "call.resume", p.resume_token)
            raise RpcError(INVALID_PARAMS, _UNKNOWN_TOKEN)
        return result

    async def lookup(self, conn: Connection, p: LookupParams) -> Result | JsonObject:
        s, why = self.table.check(p.session_id, conn.peer)
        if s is None:
            self.refusal(conn, p.session_id, "lookup", p.operation)
            return self.refused(p.operation or "lookup", why)
        if not p.correlation_id and not p.idempotency_key:
            raise RpcError(INVALID_PARAMS, "lookup needs correlation_id or idempotency_key")
        if p.operation is not None and self.catalog.get(p.operation) is None:
            self.unknown_operation(conn, s.id, "lookup", p.operation)
        if (whose := self.calls.stranger(s, p.correlation_id)) is not None \
                and p.correlation_id not in self._refusal_ids:
            kind, record = whose
            self.foreign(conn, s, "lookup", kind, None if record is None else (record.agent, record.run_id),
                         p.operation)
        elif p.correlation_id is None and (sent := self.calls.key_stranger(s, p.idempotency_key)) is not None:
            self.foreign(conn, s, "lookup", "other", sent[0], p.operation,
                         {"by": "idempotency_key", "key_lookup": sent[1]})
        REQUEST_GONE.set(self.sessions.processes.gone_now(s.process))
        return await self.calls.lookup(s, p.correlation_id, p.idempotency_key, p.operation)

    async def status(self, conn: Connection, p: NoParams) -> JsonObject:
        asked = self.sessions.status_asks.asked(conn.peer)  # a left-behind process's only (vault.daemon.status_asks)
        if asked is not None:
            self.sessions.recorder.record_soon(asked)
        return self.status_of()

    # ---- call.cancel and catalog (#15: MCP hosts cancel calls and discover operations) ----

    async def call_cancel(self, conn: Connection, p: ResumeTokenParams) -> JsonObject:
        s, why = self.table.check(p.session_id, conn.peer)
        if s is None:
            self.refusal(conn, p.session_id, "call.cancel")
            raise RpcError(INVALID_PARAMS, why)
        # read first, as the request comes: which of the processes that started the session's
        # process had already exited (the runner's clock for the agent's exit lags on a loaded host)
        chain = s.process.chain if s.process is not None else None
        gone = ancestors_gone(chain) if chain else None
        if gone is not None:  # and its kin (an orphan's agent: vault.daemon.processes.kin_of)
            gone += [pid for pid in self.sessions.processes.gone_now(s.process) or [] if pid not in gone]
        out = await self.calls.cancel(s, p.resume_token, gone)
        if out is None:
            self.foreign_token(conn, s, "call.cancel", p.resume_token)
            raise RpcError(INVALID_PARAMS, _UNKNOWN_TOKEN)
        return out

    async def list_catalog(self, conn: Connection, p: NoParams) -> JsonObject:
        return catalog_view(self.catalog, self.calls.gate.policy)

    async def on_disconnect(self, conn: Connection) -> None:
        for s in self.table.for_conn(conn.id):
            await self.sessions.close(s, "connection closed")
