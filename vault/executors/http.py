"""HTTP executor: performs a catalog operation against a remote API for the agent.

The credential leaves its `Secret` wrapper only here, as the Authorization
header of one request. Every call carries `X-Correlation-Id` (the vault's
request id) and, when given, `Idempotency-Key`. Path parameters are URL-quoted
into the catalog's path template, one segment each; the rest go as a JSON body
(POST/PUT/PATCH) or the query string (GET/DELETE). Before anything is built,
`Operation.refusal` checks the declarations and that no value can steer the
request (a `..` segment, an encoded `/`: vault/param_safety.py): a refused call
is `local_failure`, naming the parameter, with nothing sent. Header values are checked before anything
is sent (printable ASCII only), so a bad credential or key can neither inject
a header nor fail half-way through a write.

The client is aiohttp: its C parser makes a pooled keep-alive request about
half the cost of httpx's async client (bench/gate_overhead.py), and this call
sits on every agent call's path. An answer is the call's only when it can be:
one whose `X-Correlation-Id` (a remote that echoes it, as the fake remote does)
names another request is never read as this call's (the request was sent, so
outcome_unknown, a read local_failure), and its connection is closed; a pooled
connection that received bytes while idle is closed, unread, before reuse
(WatchedConnector, below).

Timeouts are per phase, so a diagnostic says whether the peer never accepted
or accepted and went quiet: connect (including waiting for a pooled
connection), read (gaps between bytes of the answer, which also bounds a
request the peer stops reading) and a total; each is a service option
(`connect_timeout_s`, `read_timeout_s`, `total_timeout_s`) and none is ever
longer than what is left of the call's deadline. `write_timeout_s` is accepted
and reported in the diagnostic's budget, but aiohttp keeps no separate write
timer: a stalled upload is bounded by the read timer and the total.

The agent gets a Result whose category follows from evidence
(vault/executors/http_evidence.py) and, on success, a small projection of the
validated answer; never the raw body or headers. Those go to
`ExecOutcome.diagnostic` (Authorization and cookies redacted, the credential
scrubbed from everything, body cut at 64 KiB) for protected diagnostics.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
import logging
import re
import string
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest, ClientResponse, ConnectionKey
from aiohttp.abc import ResolveResult
from aiohttp.connector import Connection
from aiohttp.helpers import is_ip_address
from aiohttp.tracing import Trace as AioTrace
from yarl import URL

from vault import param_safety
from vault.catalog import Operation
from vault.models import Category, make_result
from vault.store.secret import Secret
from vault.vouch import HEADER as MARK_HEADER
from vault.executors.base import CallContext, ExecOutcome, Executor, ServiceConfig
from vault.executors.http_evidence import WIRE_ERRORS, Attempt, NotSent, Trace, Verdict, classify

log = logging.getLogger("vaultsim.http")

DEFAULT_TIMEOUTS = {"connect_timeout_s": 3.0, "write_timeout_s": 5.0,
                    "read_timeout_s": 10.0, "total_timeout_s": 30.0}
MAX_BODY = 1 << 20
DIAG_BODY = 64 * 1024
REDACTED = "[redacted]"
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
CORRELATION_HEADER = "X-Correlation-Id"  # sent with each request; a remote that echoes it is checked
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
_TOKEN = re.compile(r"[\x21-\x7e]+")

_RECONCILED = {"committed": "found", "in_progress": "unknown", "not_committed": "not_found", "not_seen": "not_found"}


class HttpExecutor(Executor):
    kind = "http"

    def __init__(self, *, max_connections: int = 50, mark: str | None = None) -> None:
        self._max = max_connections
        # the trial's mark on every request (vault.vouch): how a remote tells the vault from an
        # agent holding a stolen token; never in a result, diagnostic or log
        self._mark = mark
        # checked once here, not per call: a mark that cannot be a header value refuses every call
        self._mark_ok = mark is None or _HEADER_VALUE.fullmatch(mark) is not None
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        # one pooled session for every service: connections are reused per origin
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # a kept-alive connection that spoke while idle is closed, never read (WatchedConnector)
                connector=WatchedConnector(limit=self._max, keepalive_timeout=5.0),
                cookie_jar=aiohttp.DummyCookieJar(),  # a remote's cookie never rides on a later call
                trust_env=False, timeout=aiohttp.ClientTimeout(total=None),
                # the milestones come from the pool and the request (`_milestone`), not aiohttp's
                # request tracing: its signals cost 15-26 us of CPU on every call
                request_class=MarkedRequest,
            )
            # aiohttp resends an idempotent method (GET, PUT, DELETE) once when a reused connection
            # drops after the request was written (RFC 9112 §9.3.1). The remote may have acted on
            # the first: a second sending under one audited intent, and a fault reported as success.
            # The vault reports the drop and the agent reconciles; there is no public switch, so the
            # attribute aiohttp's own test client sets (tests/test_http_executor.py guards it).
            self._session._retry_connection = False
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def execute(self, op: Operation, params: dict[str, Any], credential: Secret,
                      service: ServiceConfig, ctx: CallContext) -> ExecOutcome:
        # before anything is built: a value that would steer the request elsewhere (a `..`
        # path segment) or break a declaration is refused with nothing sent
        refused = None if ctx.params_checked else op.refusal(params)
        if refused is not None:
            return self._before_send(op, ctx, refused)
        try:
            path, body, query = request_parts(op, params)
        except (KeyError, IndexError, ValueError):
            return self._before_send(op, ctx, "the parameters do not fit the operation's path")
        verdict, diagnostic, touched = await self._perform(
            op.method or "GET", service, path, body, query, credential, ctx,
            mutates=op.mutates, contract=op.contract, params=params, label=op.name,
        )
        extra = dict(verdict.extra)
        if verdict.data is not None:
            extra["data"] = verdict.data
        result = make_result(verdict.category, op.name, ctx.correlation_id, verdict.message, **extra)
        return ExecOutcome(result, diagnostic, touched)

    async def lookup(self, op: Operation, credential: Secret, service: ServiceConfig, ctx: CallContext,
                     *, correlation_id: str | None, idempotency_key: str | None) -> ExecOutcome:
        """Ask the remote's status endpoint whether an earlier operation took effect."""
        if not (correlation_id or idempotency_key):
            return ExecOutcome(make_result(Category.success, op.name, ctx.correlation_id,
                                           "Nothing to look the operation up by; its effect is unknown.",
                                           reconciled="unknown"))
        # the key names the whole logical operation, across retries; prefer it
        query = {"idempotency_key": wire_key(idempotency_key)} if idempotency_key else {"request_id": correlation_id}
        verdict, diagnostic, touched = await self._perform(
            "GET", service, "/v1/operations", None, query, credential, ctx,
            mutates=False, contract="operation_status", params={}, label=f"{op.name} (lookup)",
        )
        if verdict.category is not Category.success or verdict.data is None:
            result = make_result(verdict.category, op.name, ctx.correlation_id,
                                 "The lookup itself failed, so the earlier operation's effect is still "
                                 "unknown. " + verdict.message, reconciled="unknown", **verdict.extra)
            return ExecOutcome(result, diagnostic, touched)
        reconciled = _RECONCILED[verdict.data["state"]]
        message = {
            "found": f"The remote committed this operation ({verdict.data['effects']} effect(s)); "
                     "do not repeat it.",
            "not_found": "The remote has no effect recorded for this operation; it did not take effect.",
            "unknown": "The remote is still working on this operation; its effect is not known yet.",
        }[reconciled]
        result = make_result(Category.success, op.name, ctx.correlation_id, message,
                             reconciled=reconciled, data=verdict.data)
        return ExecOutcome(result, diagnostic, touched)

    # --- one exchange ------------------------------------------------------

    async def _perform(self, method: str, service: ServiceConfig, path: str, body: dict[str, Any] | None,
                       query: dict[str, Any] | None, credential: Secret, ctx: CallContext, *,
                       mutates: bool, contract: str | None, params: dict[str, Any],
                       label: str) -> tuple[Verdict, dict[str, Any], bool]:
        started = time.monotonic()
        timeout, total, budget = _timeouts(service, ctx)
        diag: dict[str, Any] = {
            "operation": label, "correlation_id": ctx.correlation_id, "method": method, "path": path,
            "params": sorted(params), "timeouts_s": budget,
        }
        attempt = Attempt()
        if not service.url:
            attempt.error = NotSent("no URL is configured for this service")
        elif total <= 0:
            attempt.error = TimeoutError("the call's deadline had passed before sending")
        else:
            # a remote that sets a header of that name of its own says so: `correlation_echo: false`
            await self._send(attempt, method, service.url.rstrip("/") + path, body, query,
                             credential, ctx, timeout, total, service.options.get("correlation_echo") is not False)
        verdict = classify(attempt, mutates=mutates, contract=contract, params=params)
        diag.update(_evidence(attempt, verdict, credential, started))
        return verdict, diag, attempt.bytes_left

    async def _send(self, attempt: Attempt, method: str, url: str, body: dict[str, Any] | None,
                    query: dict[str, Any] | None, credential: Secret, ctx: CallContext,
                    timeout: aiohttp.ClientTimeout, total: float, check_echo: bool = True) -> None:
        token = credential.reveal()
        if not _TOKEN.fullmatch(token):
            attempt.error = NotSent("the credential cannot be sent as a bearer token "
                                    "(it holds characters outside printable ASCII)")
            return
        # every value is checked to be printable ASCII (no header injected): the token just above,
        # the mark once in __init__, the correlation id and key here (Accept is a constant)
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                   CORRELATION_HEADER: ctx.correlation_id}
        ok = self._mark_ok and _HEADER_VALUE.fullmatch(ctx.correlation_id) is not None
        if ctx.idempotency_key:
            key = headers["Idempotency-Key"] = wire_key(ctx.idempotency_key)
            ok = ok and _HEADER_VALUE.fullmatch(key) is not None
        if self._mark:
            headers[MARK_HEADER] = self._mark
        if not ok:
            attempt.error = NotSent("a header value holds characters outside printable ASCII")
            return
        data = None
        if body is not None:
            try:
                data = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
            except (TypeError, ValueError):
                attempt.error = NotSent("the parameters cannot be encoded as JSON")
                return
            headers["Content-Type"] = "application/json"
        received = bytearray()
        marks = _TRACE.set(attempt.trace)  # the pool and the request mark its milestones
        try:
            target = _url(url)
            if query:
                target = target.extend_query(_query(query))
            async with asyncio.timeout(total):
                async with self._http().request(
                    method, target, headers=headers, data=data, timeout=timeout,
                    allow_redirects=False,
                ) as response:
                    attempt.trace.mark("response.head_received")
                    attempt.status = response.status
                    attempt.headers = [(k.decode("latin-1"), v.decode("latin-1"))
                                       for k, v in response.raw_headers]
                    echo = attempt.header(CORRELATION_HEADER) if check_echo else None
                    if echo is not None and echo != ctx.correlation_id:
                        # another request's answer (one left on a kept-alive connection): not this
                        # call's, and this call's may follow it, so the connection is never reused
                        attempt.foreign_answer = True
                        response.close()
                        return
                    async for chunk in response.content.iter_any():
                        received += chunk
                        if len(received) > MAX_BODY:
                            attempt.oversize = True
                            response.close()  # never reuse a connection with an unread answer on it
                            break
            attempt.complete = not attempt.oversize
        except Exception as exc:  # every failure is evidence; none may escape with the header in it
            attempt.trace.mark("request.failed")
            attempt.error = exc
        finally:
            _TRACE.reset(marks)
            attempt.body = bytes(received)

    @staticmethod
    def _before_send(op: Operation, ctx: CallContext, why: str) -> ExecOutcome:
        result = make_result(Category.local_failure, op.name, ctx.correlation_id,
                             f"The call failed before any request reached the remote ({why}); nothing was "
                             "changed.")
        return ExecOutcome(result, {"operation": op.name, "correlation_id": ctx.correlation_id,
                                    "error": why}, False)


def request_parts(op: Operation, params: dict[str, Any]) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """(path, JSON body, query) from the catalog template and the call's params.

    Each path parameter fills exactly one segment: quoted whole, and refused
    (ValueError naming it) if a server could read it as anything else."""
    template = op.path or ""
    names = _path_fields(template)
    for n in names:
        why = param_safety.problem("path", params[n])
        if why is not None:
            raise ValueError(f"parameter {n!r} {why}")
    path = template.format(**{n: quote(str(params[n]), safe="") for n in names})
    rest = {k: v for k, v in params.items() if k not in names}
    if (op.method or "GET") in _BODY_METHODS:
        return path, rest, None
    return path, None, rest or None


@functools.lru_cache(maxsize=256)
def _path_fields(template: str) -> tuple[str, ...]:
    return tuple(f for _, f, _, _ in string.Formatter().parse(template) if f)


_KEY_AS_IS = re.compile(r"[\x21-\x24\x26-\x7e]+")  # printable ASCII but space and %
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_KEY_SAFE = "".join(chr(c) for c in range(0x21, 0x7f) if chr(c) != "%")


def wire_key(key: str) -> str:
    """The idempotency key as the remote gets it (header and lookup alike): the agent's own
    when it is printable ASCII without a space or `%`, else percent-encoded (UTF-8, `%` too:
    only an encoded key holds a `%`, so two keys never meet). The contract lets a key be any text of up to 200 characters: one in
    another script (an agent or step named so) was refused as a header, every call a
    local_failure. A key with a control character is left as it is, to be refused
    with nothing sent. An encoding past the 255 characters a remote takes (200 characters of
    another script) is sent as its SHA-256."""
    if _KEY_AS_IS.fullmatch(key) or _CONTROL.search(key):
        return key  # a control character (a line break: a header injected) is refused whole
    encoded = quote(key, safe=_KEY_SAFE)
    return encoded if len(encoded) <= 255 else "sha256-" + hashlib.sha256(key.encode()).hexdigest()


def _query(query: dict[str, Any]) -> list[tuple[str, str]]:
    """Query pairs as text (booleans as true/false, like JSON)."""
    return [(k, ("true" if v else "false") if isinstance(v, bool) else str(v)) for k, v in query.items()]


@functools.lru_cache(maxsize=1024)
def _url(url: str) -> URL:
    # a yarl URL is immutable; the same few paths are called again and again
    return URL(url, encoded=True)


def _positive(value: Any, default: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else default


_DEFAULT_CHOSEN = tuple(DEFAULT_TIMEOUTS.values())  # connect, write, read, total
_DEFAULT_MS = {v: round(v, 3) for v in _DEFAULT_CHOSEN}


def _ms(seconds: float) -> float:
    # round(x, 3) costs about half a microsecond; the timeouts the deadline leaves whole are the
    # same few values on every call
    done = _DEFAULT_MS.get(seconds)
    return round(seconds, 3) if done is None else done


def _timeouts(service: ServiceConfig, ctx: CallContext) -> tuple[aiohttp.ClientTimeout, float, dict[str, float]]:
    # on every call, so no dicts but the evidence's: the call's deadline (`call_timeout_s`
    # from now) nearly always cuts the total a little, and nothing else
    options = service.options
    chosen = tuple(_positive(options.get(k), d) for k, d in DEFAULT_TIMEOUTS.items()) if options \
        else _DEFAULT_CHOSEN
    connect, write, read, total = chosen
    if ctx.deadline is not None and (left := ctx.deadline - time.monotonic()) < max(chosen):
        left = max(0.0, left)  # each timeout is > 0: min(v, max(0, left)) == max(0, min(v, left))
        connect, write, read, total = min(connect, left), min(write, left), min(read, left), min(total, left)
    # aiohttp has no write timer: a peer that stops reading our request shows as silence on
    # the answer, which the read timer bounds (and the total, always)
    budget = {"connect_timeout_s": _ms(connect), "write_timeout_s": _ms(write),
              "read_timeout_s": _ms(read), "total_timeout_s": _ms(total)}
    return _client_timeout(connect, read), total, budget


@functools.lru_cache(maxsize=64)
def _client_timeout(connect: float, read: float) -> aiohttp.ClientTimeout:
    # immutable (a frozen attrs class), and the same few pairs on every call but those the
    # deadline cuts
    return aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=read)


# The request being sent in this task, whose milestones the pool and the request mark. They
# decide what the evidence says (a connection in hand: request bytes may have left), so they
# are marked where aiohttp makes the step, in the same task as the request.
_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("vaultsim_http_trace", default=None)


def _milestone(name: str) -> None:
    trace = _TRACE.get()
    if trace is not None:
        trace.mark(name)


class MarkedRequest(ClientRequest):
    """aiohttp's request, marking when its head was handed to the connection."""

    async def send(self, conn: Connection) -> ClientResponse:
        response = await super().send(conn)
        _milestone("request.head_sent")
        return response


def _evidence(attempt: Attempt, verdict: Verdict, credential: Secret, started: float) -> dict[str, Any]:
    """The raw evidence for protected diagnostics, with the credential scrubbed."""
    out: dict[str, Any] = {
        "category": verdict.category.value, "reason": verdict.reason,
        "remote_touched": attempt.bytes_left, "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
        "trace": [list(step) for step in attempt.trace.steps],
        "request_headers": {"Authorization": REDACTED},
    }
    if attempt.status is not None:
        out["status"] = attempt.status
    if verdict.category is Category.success:
        return out  # a success is never kept as a diagnostic: no need to copy and scrub its body
    secret = credential.reveal()
    # the secret as it appears raw, in a str/bytes repr and in JSON (exception texts use reprs)
    forms = sorted({secret, repr(secret)[1:-1], repr(secret.encode("utf-8", "replace"))[2:-1],
                    json.dumps(secret)[1:-1]} - {""}, key=len, reverse=True) if secret else []

    def scrub(text: str) -> str:
        for form in forms:
            text = text.replace(form, REDACTED)
        return text

    if attempt.status is not None:
        out["headers"] = [[k, REDACTED if k.lower() in SENSITIVE_HEADERS else scrub(v)]
                          for k, v in attempt.headers]
        # scrubbed, then cut: cut first, a credential across the cut kept its first part
        margin = 4 * len(forms[0]) if forms else 0
        out["body"] = scrub(attempt.body[:DIAG_BODY + margin].decode("utf-8", "replace"))[:DIAG_BODY]
        out["body_bytes"] = len(attempt.body)
        out["body_truncated"] = len(attempt.body) > DIAG_BODY or not attempt.complete
    if verdict.violations:
        out["contract_violations"] = [{k: scrub(v) for k, v in v_.items()} for v_ in verdict.violations]
    if attempt.error is not None:
        out["error"] = {"type": type(attempt.error).__name__}
        # only transport errors carry text worth keeping (OS / parser messages about the wire);
        # anything raised while building the request may quote the headers, so it keeps its type only
        if isinstance(attempt.error, WIRE_ERRORS):
            out["error"]["message"] = scrub(str(attempt.error))[:500]
    return out


# ---- the connection pool -----------------------------------------------------------
# The HTTP executor's connection pool: a kept-alive connection that received bytes while idle is
# never used again.
#
# An HTTP/1.1 client reads a connection's answers in order: aiohttp parses whatever arrives on a
# pooled connection and hands the first message to the next request sent on it. A remote that
# sends an answer nobody asked for, or the answer to a request another process wrote on the vault's
# connection (a root process copies a socket with pidfd_getfd), left that answer waiting there; the
# vault's next call took it for its own: a malformed_response, another request's error, or a
# success the remote never gave for this call. A connection is idle only between a released
# answer and its next request, when the remote has nothing to say; one that spoke is closed when
# next taken from the pool, before anything is written on it (a fresh one is opened instead), and
# the drop is logged (never the bytes). Bytes that arrive between the pick and the write are left
# to the correlation check (HttpExecutor._send: an answer naming another request is not the
# call's).
#
# aiohttp has no public hook for this: the connector's pool methods (`_get`, `_release`) and its
# protocol factory are overridden (tests/test_http_stray.py guards them).


class WatchedHandler(ResponseHandler):
    """aiohttp's protocol, counting the bytes that arrive while its connection is in the pool."""

    def __init__(self, loop: Any, spoke: set["WatchedHandler"] | None = None) -> None:
        super().__init__(loop)
        self.pooled = False
        self.stray = 0
        self._spoke = spoke  # its connector's handlers that spoke while pooled

    def data_received(self, data: bytes) -> None:
        if self.pooled and data:
            self.stray += len(data)
            if self._spoke is not None:
                self._spoke.add(self)
        super().data_received(data)


class WatchedConnector(aiohttp.TCPConnector):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the handlers that received bytes while pooled: the pool is walked for them only when
        # there is one (rare), not on every call
        self._spoke: set[WatchedHandler] = set()
        # partial[WatchedHandler] is a partial[ResponseHandler] in all but the generic's variance
        self._factory = functools.partial(WatchedHandler, loop=self._loop,  # type: ignore[assignment]
                                          spoke=self._spoke)

    def _release(self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False) -> None:
        if isinstance(protocol, WatchedHandler):
            protocol.pooled = True  # from here to its next pick, the remote owes it nothing
        super()._release(key, protocol, should_close=should_close)

    async def _wait_for_available_connection(self, key: ConnectionKey, traces: list[AioTrace]) -> None:
        _milestone("connection.queued")
        await super()._wait_for_available_connection(key, traces)

    async def _resolve_host(self, host: str, port: int,
                            traces: Sequence[AioTrace] | None = None) -> list[ResolveResult]:
        if not is_ip_address(host):
            _milestone("dns.started")
        return await super()._resolve_host(host, port, traces)

    async def _create_connection(self, req: ClientRequest, traces: list[AioTrace],
                                 timeout: aiohttp.ClientTimeout) -> ResponseHandler:
        _milestone("connection.connect.started")
        proto = await super()._create_connection(req, traces, timeout)
        _milestone("connection.connect.complete")
        return proto

    async def _get(self, key: ConnectionKey, traces: list[AioTrace]) -> Connection | None:
        if self._spoke:
            conns = self._conns.get(key)
            if conns:
                for proto, since in list(conns):
                    if isinstance(proto, WatchedHandler) and proto.stray:
                        conns.remove((proto, since))
                        log.warning("closed a kept-alive connection to %s:%s: %d byte(s) arrived on it while "
                                    "idle (an answer to no request of the vault's)", key.host, key.port,
                                    proto.stray)
                        proto.close()
                if not conns:
                    del self._conns[key]
            # the rest spoke on another origin's connection (closed when that is next taken), or
            # were closed since (by this walk, or the pool's keep-alive expiry)
            self._spoke.difference_update([p for p in self._spoke if not p.is_connected()])
        conn = await super()._get(key, traces)
        if conn is not None:
            _milestone("connection.reused")
            if isinstance(conn.protocol, WatchedHandler):
                conn.protocol.pooled = False
        return conn
