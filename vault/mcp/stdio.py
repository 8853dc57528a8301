"""The bridge's stdio transport: the SDK's, plus an answer for every line it cannot read.

The SDK's stdio transport hands a line its parser (jiter) rejects to the server
as an exception, and the server only logs it at debug level: the host's request
is never answered and its tool call waits forever. A host can send such lines:
a lone UTF-16 surrogate escape (JavaScript's JSON.stringify writes `"\\ud800"` for
a broken string a model produced), arrays nested past the parser's limit (about
250 levels), an integer of thousands of digits, bytes that are not JSON. Each is
answered here, through the SDK's own writer (so frames never interleave):

    the line                               answer
    a request whose id can be read         that id; -32602 naming where a lone surrogate is,
                                           -32600 for JSON that is no valid request (params
                                           not an object, a method not a string), else
                                           -32700 with the parser's reason
    a notification (no id)                 none (JSON-RPC answers no notification); logged
    a request whose id is null, a          id null, -32600 (the SDK reads it as a notification
    fraction, true or an object            and drops it; see vault.mcp.stdio_lines)
    a JSON-RPC batch (an array: MCP        each message served as if sent on its own line, each
    2025-03-26 lets a client send one)     request answered on its own line with its id (an
                                           unreadable one as above, but -32600 where the line
                                           said -32700: the batch was JSON; an element that is
                                           no object: id null, -32600); an empty array: id null,
                                           -32600
    anything else                          id null, -32700 with the parser's reason
    a line past 4 MiB characters           id null, -32600 (read and dropped a piece at a
                                           time: never held whole; vault.mcp.stdio_lines)

A batch was answered once, with id null: its requests' ids never came back and
the host waited on each until its own timeout.

At the end of input (the host closed stdin) the reader first awaits `at_eof`, which answers
what is in flight (`Outstanding`: every request read and not yet answered, whether or not its
handler has started), then ends: the SDK cancels whatever is still running when its reader
ends, answering each such request only "Connection closed" (a read or a create that had run
lost its Result).

The reason never quotes the line (it may hold what the host wanted kept).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from vault.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, not_unicode
from vault.mcp.stdio_lines import TOO_LONG, bad_id_answer, line_verdict, too_long_answer

log = logging.getLogger("vaultsim.mcp")


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        if errors:
            return str(errors[0]["msg"])[:200]
    return type(exc).__name__


def _line(exc: Exception) -> str | None:
    """The raw line, when the parser rejected it as JSON (its error holds the whole input)."""
    if isinstance(exc, ValidationError):
        for error in exc.errors(include_url=False):
            if error["type"] == "json_invalid" and isinstance(error.get("input"), str):
                return str(error["input"])
    return None


def _envelope(exc: Exception) -> dict[str, Any] | None:
    """The message as read, when it was JSON but not a JSON-RPC message the SDK accepts (params
    not an object, a method that is not a string, another jsonrpc version): the union's "missing
    result" error carries the whole object, and with it the request's id."""
    if isinstance(exc, ValidationError):
        for error in exc.errors(include_url=False):
            found = error.get("input")
            if error["type"] == "missing" and isinstance(found, dict) and "method" in found:
                return found
    return None


def _batch(exc: Exception) -> list[Any] | None:
    """The messages of a JSON-RPC batch (a JSON array), which the SDK's reader refuses whole."""
    if isinstance(exc, ValidationError):
        for error in exc.errors(include_url=False):
            found = error.get("input")
            # the whole message, not a part of it (`params` that is a list is no batch)
            if isinstance(found, list) and len(error["loc"]) <= 1:
                return found
    return None


def _int(digits: str) -> int | float:
    return int(digits) if len(digits) <= 4000 else float("inf")


def answer_unreadable(exc: Exception) -> types.JSONRPCError | None:
    """The error answer to a line the SDK could not read (see the module doc); None for a notification."""
    why = f"parse error: the MCP bridge cannot read this message ({_reason(exc)})"
    line = _line(exc)
    obj: Any = _envelope(exc)
    code = PARSE_ERROR
    if obj is not None:  # JSON, but not a valid request: answered with its id, never left waiting
        code, why = INVALID_REQUEST, f"invalid request: the MCP bridge cannot read this message ({_reason(exc)})"
    elif line is not None:
        try:
            # Python's reader takes lone surrogates and deeper nesting; an integer past its
            # digit limit is kept as a stand-in (only the id and the surrogates matter here)
            obj = json.loads(line, parse_int=_int)
        except (ValueError, RecursionError):
            obj = None
    if isinstance(obj, dict):
        rid = obj.get("id")
        if "id" not in obj and isinstance(obj.get("method"), str):
            _dropped_notification(why)
            return None
        if (isinstance(rid, int) and not isinstance(rid, bool)) or (isinstance(rid, str) and not not_unicode(rid)):
            where = not_unicode(obj)
            if where:
                return _error(rid, INVALID_PARAMS, f"invalid params: {where} holds a lone UTF-16 surrogate (such "
                                                   "as \\ud800), which is not Unicode text; send valid text")
            return _error(rid, code, why)
    return _error(None, PARSE_ERROR, why)


_DROPPED = [0]  # unreadable notifications so far: a host sending thousands must not flood stderr
WARN_FIRST = 10


def _dropped_notification(why: str) -> None:
    _DROPPED[0] += 1
    n = _DROPPED[0]
    if n <= WARN_FIRST:
        log.warning("dropped a notification the MCP SDK cannot read: %s", why)
    elif n & (n - 1) == 0:  # then at powers of two only
        log.warning("dropped %d notifications the MCP SDK cannot read so far (latest: %s)", n, why)


def _error(rid: int | str | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=rid, error=types.ErrorData(code=code, message=message))


def _key(rid: Any) -> str:
    return json.dumps(rid)  # 1 and "1" are two requests


class Outstanding:
    """The requests read and not yet answered (the read side adds, the write side removes)."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._none = anyio.Event()
        self._none.set()

    def read(self, message: Any) -> None:
        if isinstance(message, types.JSONRPCRequest):
            self._ids.add(_key(message.id))
            self._none = anyio.Event() if self._none.is_set() else self._none
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            # a cancelled request is never answered (the spec forbids it): nothing to wait for
            rid = (message.params or {}).get("requestId")
            self.answered(rid)

    def answered(self, rid: Any) -> None:
        self._ids.discard(_key(rid))
        if not self._ids:
            self._none.set()

    async def settled(self, within_s: float) -> None:
        with anyio.move_on_after(within_s):
            await self._none.wait()

    def watching(self, write: Any) -> "AnsweredWriter":
        return AnsweredWriter(write, self)


class AnsweredWriter:
    """The SDK's write stream, noting each answer sent (for `Outstanding`)."""

    def __init__(self, inner: Any, outstanding: Outstanding) -> None:
        self._inner, self._outstanding = inner, outstanding

    async def send(self, item: Any) -> None:
        await self._inner.send(item)
        message = getattr(item, "message", None)
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self._outstanding.answered(message.id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "AnsweredWriter":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _cancelled_id(item: Any) -> Any:
    """The request id a notifications/cancelled names (None for anything else)."""
    message = getattr(item, "message", None)
    if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
        return (message.params or {}).get("requestId")
    return None


class AnsweringReader:
    """The SDK's read stream, with every unreadable line answered on `write` instead of passed on."""

    def __init__(self, inner: Any, write: Any, at_eof: Any = None, outstanding: Outstanding | None = None,
                 cannot_cancel: Callable[[Any], Awaitable[bool]] | None = None,
                 lines: deque[str] | None = None) -> None:
        self._inner = inner
        # each line the SDK read, in order (vault.mcp.stdio_lines): one a request with a bad id,
        # which the SDK took for a notification, is answered instead of handed on
        self._lines = lines
        # asked for each notifications/cancelled: True drops it (the call runs and is answered)
        self._cannot_cancel = cannot_cancel
        self._write = write
        self._at_eof = at_eof  # awaited once when the input ends, before the SDK hears of it
        self._outstanding = outstanding
        self._queued: deque[SessionMessage] = deque()  # a batch's messages not yet handed on

    @property
    def last_context(self) -> Any:  # the SDK restores the sender's context from it
        return getattr(self._inner, "last_context", None)

    def __aiter__(self) -> "AnsweringReader":
        return self

    async def __anext__(self) -> Any:
        item = await self._next()
        while self._cannot_cancel is not None and _cancelled_id(item) is not None \
                and await self._cannot_cancel(_cancelled_id(item)):
            item = await self._next()
        if self._outstanding is not None and isinstance(item, SessionMessage):
            self._outstanding.read(item.message)
        return item

    async def _next(self) -> Any:
        while True:
            if self._queued:
                return self._queued.popleft()
            try:
                item = await self._inner.__anext__()
            except StopAsyncIteration:
                at_eof, self._at_eof = self._at_eof, None
                if at_eof is not None:
                    await at_eof()
                raise
            line = self._lines.popleft() if self._lines else None
            if line is TOO_LONG:  # the SDK read its stand-in; nothing of it reached the SDK
                await self._write.send(SessionMessage(too_long_answer()))
                continue
            notified = isinstance(getattr(item, "message", None), types.JSONRPCNotification)
            verdict = line_verdict(line) if notified and line is not None else None
            if verdict is not None:
                await self._write.send(SessionMessage(verdict))
                continue
            if not isinstance(item, Exception):
                return item
            batch = _batch(item)
            if batch is not None:
                await self._unbatch(batch)
                continue
            answer = answer_unreadable(item)
            if answer is not None:
                await self._write.send(SessionMessage(answer))

    async def _unbatch(self, batch: list[Any]) -> None:
        if not batch:
            await self._write.send(SessionMessage(_error(None, INVALID_REQUEST, "invalid request: an empty batch")))
            return
        for element in batch:
            refused = bad_id_answer(element) if isinstance(element, dict) else _error(
                None, INVALID_REQUEST, "invalid request: a batch's element must be a JSON object")
            if refused is not None:  # JSON-RPC answers each such element with id null, -32600
                await self._write.send(SessionMessage(refused))
                continue
            try:
                self._queued.append(SessionMessage(types.jsonrpc_message_adapter.validate_python(
                    element, by_name=False)))
            except ValidationError as exc:
                answer = answer_unreadable(exc)
                rid = element.get("id") if isinstance(element, dict) else None
                if answer is not None and answer.id is None and (
                        (isinstance(rid, int) and not isinstance(rid, bool)) or isinstance(rid, str)):
                    answer = _error(rid, INVALID_REQUEST, f"invalid request: {_reason(exc)}")
                elif answer is not None and answer.error.code == PARSE_ERROR:  # the batch was JSON
                    answer = _error(None, INVALID_REQUEST, answer.error.message.replace("parse error", "invalid request", 1))
                if answer is not None:
                    await self._write.send(SessionMessage(answer))

    async def receive(self) -> Any:
        import anyio
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise anyio.EndOfStream from None

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "AnsweringReader":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
