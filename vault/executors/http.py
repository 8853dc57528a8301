"""HTTP executor: performs a catalog operation against a remote API for the agent.

The credential leaves its `Secret` wrapper only here, as the Authorization
header of one request. Every call carries `X-Correlation-Id` (the vault's
request id) and, when given, `Idempotency-Key`. Path parameters are URL-quoted
into the catalog's path template; the rest go as a JSON body (POST/PUT/PATCH)
or the query string (GET/DELETE).

Timeouts are per phase, so a diagnostic says whether the peer never accepted
or accepted and went quiet: connect, write, read (first byte, and each later
read) and a total; each is a service option (`connect_timeout_s`,
`write_timeout_s`, `read_timeout_s`, `total_timeout_s`) and none is ever
longer than what is left of the call's deadline.

The agent gets a Result whose category follows from evidence
(vault/executors/http_evidence.py) and, on success, a small projection of the
validated answer; never the raw body or headers. Those go to
`ExecOutcome.diagnostic` (Authorization and cookies redacted, the credential
scrubbed from everything, body cut at 64 KiB) for protected diagnostics.
"""

from __future__ import annotations

import asyncio
import json
import math
import string
import time
from typing import Any
from urllib.parse import quote

import httpx

from ..catalog import Operation
from ..models import Category, make_result
from ..secret import Secret
from .base import CallContext, ExecOutcome, Executor, ServiceConfig
from .http_evidence import Attempt, Verdict, classify

DEFAULT_TIMEOUTS = {"connect_timeout_s": 3.0, "write_timeout_s": 5.0,
                    "read_timeout_s": 10.0, "total_timeout_s": 30.0}
MAX_BODY = 1 << 20
DIAG_BODY = 64 * 1024
REDACTED = "[redacted]"
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_WIRE_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, TimeoutError)

_RECONCILED = {"committed": "found", "in_progress": "unknown", "not_committed": "not_found", "not_seen": "not_found"}


class HttpExecutor(Executor):
    kind = "http"

    def __init__(self, *, transport: httpx.AsyncBaseTransport | None = None, max_connections: int = 50) -> None:
        self._transport = transport
        self._max = max_connections
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        # one pooled client for every service: connections are reused per origin
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport, trust_env=False, follow_redirects=False, timeout=None,
                limits=httpx.Limits(max_connections=self._max, keepalive_expiry=5.0),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def execute(self, op: Operation, params: dict[str, Any], credential: Secret,
                      service: ServiceConfig, ctx: CallContext) -> ExecOutcome:
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
        query = {"idempotency_key": idempotency_key} if idempotency_key else {"request_id": correlation_id}
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
            attempt.error = httpx.UnsupportedProtocol("no URL is configured for this service")
        elif total <= 0:
            attempt.error = TimeoutError("the call's deadline had passed before sending")
        else:
            await self._send(attempt, method, service.url.rstrip("/") + path, body, query,
                             credential, ctx, timeout, total)
        verdict = classify(attempt, mutates=mutates, contract=contract, params=params)
        diag.update(_evidence(attempt, verdict, credential, started))
        return verdict, diag, attempt.bytes_left

    async def _send(self, attempt: Attempt, method: str, url: str, body: dict[str, Any] | None,
                    query: dict[str, Any] | None, credential: Secret, ctx: CallContext,
                    timeout: httpx.Timeout, total: float) -> None:
        headers = {"Authorization": f"Bearer {credential.reveal()}", "Accept": "application/json",
                   "X-Correlation-Id": ctx.correlation_id}
        if ctx.idempotency_key:
            headers["Idempotency-Key"] = ctx.idempotency_key
        data = bytearray()
        try:
            request = self._http().build_request(
                method, url, headers=headers, json=body, params=query, timeout=timeout,
                extensions={"trace": attempt.trace},
            )
            async with asyncio.timeout(total):
                response = await self._http().send(request, stream=True)
                attempt.status = response.status_code
                attempt.headers = list(response.headers.multi_items())
                try:
                    async for chunk in response.aiter_bytes():
                        data += chunk
                        if len(data) > MAX_BODY:
                            attempt.oversize = True
                            break
                finally:
                    await response.aclose()
            attempt.complete = not attempt.oversize
        except Exception as exc:  # every failure is evidence; none may escape with the header in it
            attempt.error = exc
        finally:
            attempt.body = bytes(data)

    @staticmethod
    def _before_send(op: Operation, ctx: CallContext, why: str) -> ExecOutcome:
        result = make_result(Category.local_failure, op.name, ctx.correlation_id,
                             f"The call failed before any request reached the remote ({why}); nothing was "
                             "changed.")
        return ExecOutcome(result, {"operation": op.name, "correlation_id": ctx.correlation_id,
                                    "error": why}, False)


def request_parts(op: Operation, params: dict[str, Any]) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """(path, JSON body, query) from the catalog template and the call's params."""
    template = op.path or ""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    path = template.format(**{n: quote(str(params[n]), safe="") for n in names})
    rest = {k: v for k, v in params.items() if k not in names}
    if (op.method or "GET") in _BODY_METHODS:
        return path, rest, None
    return path, None, rest or None


def _timeouts(service: ServiceConfig, ctx: CallContext) -> tuple[httpx.Timeout, float, dict[str, float]]:
    chosen = dict(DEFAULT_TIMEOUTS)
    for key in DEFAULT_TIMEOUTS:
        value = service.options.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            chosen[key] = float(value)
    left = math.inf if ctx.deadline is None else ctx.deadline - time.monotonic()
    capped = {k: max(0.0, min(v, left)) for k, v in chosen.items()}
    timeout = httpx.Timeout(connect=capped["connect_timeout_s"], write=capped["write_timeout_s"],
                            read=capped["read_timeout_s"], pool=capped["connect_timeout_s"])
    return timeout, capped["total_timeout_s"], {k: round(v, 3) for k, v in capped.items()}


def _evidence(attempt: Attempt, verdict: Verdict, credential: Secret, started: float) -> dict[str, Any]:
    """The raw evidence for protected diagnostics, with the credential scrubbed."""
    secret = credential.reveal()
    # the secret as it appears raw, in a str/bytes repr and in JSON (exception texts use reprs)
    forms = sorted({secret, repr(secret)[1:-1], repr(secret.encode("utf-8", "replace"))[2:-1],
                    json.dumps(secret)[1:-1]} - {""}, key=len, reverse=True) if secret else []

    def scrub(text: str) -> str:
        for form in forms:
            text = text.replace(form, REDACTED)
        return text

    out: dict[str, Any] = {
        "category": verdict.category.value, "reason": verdict.reason,
        "remote_touched": attempt.bytes_left, "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
        "trace": [list(step) for step in attempt.trace.steps],
        "request_headers": {"Authorization": REDACTED},
    }
    if attempt.status is not None:
        out["status"] = attempt.status
        out["headers"] = [[k, REDACTED if k.lower() in SENSITIVE_HEADERS else scrub(v)]
                          for k, v in attempt.headers]
        out["body"] = scrub(attempt.body[:DIAG_BODY].decode("utf-8", "replace"))
        out["body_bytes"] = len(attempt.body)
        out["body_truncated"] = len(attempt.body) > DIAG_BODY or not attempt.complete
    if verdict.violations:
        out["contract_violations"] = [{k: scrub(v) for k, v in v_.items()} for v_ in verdict.violations]
    if attempt.error is not None:
        out["error"] = {"type": type(attempt.error).__name__}
        # only transport errors carry text worth keeping (OS / parser messages about the wire);
        # anything raised while building the request may quote the headers, so it keeps its type only
        if isinstance(attempt.error, _WIRE_ERRORS):
            out["error"]["message"] = scrub(str(attempt.error))[:500]
    return out
