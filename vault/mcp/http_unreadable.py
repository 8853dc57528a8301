"""The answer to a POST body the SDK's Streamable HTTP transport cannot read as one JSON-RPC message.

The SDK answers HTTP 400 with id null and either -32700 (not JSON) or -32602 with pydantic's
whole validation report (JSON that is no message: a batch, `params` that is not an object).
-32602 is JSON-RPC's "invalid params" of a method, not "invalid request" (-32600), and the
report quotes the body (what the host sent, perhaps a credential it meant to keep). So a 400
the SDK gives before the MCP layer is answered here instead, as stdio answers the same line
(vault.mcp.stdio), never quoting it:

    the body                                 answer (HTTP 400)
    a JSON array (a batch; MCP 2025-06-18    id null, -32600: send each message in its own POST
    removed them, and this transport         (the SDK cannot serve one)
    serves none)
    a request whose id can be read           that id; -32602 naming where a lone surrogate is
                                             (Python's reader takes it, the SDK's does not),
                                             else -32600 naming the first problem
    anything else                            id null, -32700, the parser's reason (as the SDK
                                             said it: a position, never the text)

And a request whose id is null, a fraction, true or an object, which the SDK takes for a
notification (202, never answered; or, as an initialize, 400 "Missing session ID"), is
answered 400 with id null and -32600 instead.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from vault.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, not_unicode
from vault.mcp.stdio_lines import bad_id_answer

# what the SDK (mcp 2.3) writes for a body it cannot read; anything else passes as it is
_SDK_PREFIXES = ("Parse error:", "Validation error:")
_MAX_BODY = 4 * 1024 * 1024  # the SDK's own cap on a request body


def answer_body(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error for an unreadable body; None to keep the SDK's (not JSON at all)."""
    import mcp_types as types

    try:
        obj = json.loads(body.decode("utf-8"), parse_int=_int)
    except (ValueError, RecursionError):
        return None  # the SDK's -32700 stands: it names a position, not the text
    if isinstance(obj, list):
        why = "an empty batch" if not obj else (
            "a JSON-RPC batch is not served over HTTP; send each message in its own POST")
        return _error(None, INVALID_REQUEST, f"invalid request: {why}")
    rid = obj.get("id") if isinstance(obj, dict) else None
    if not ((isinstance(rid, int) and not isinstance(rid, bool)) or (isinstance(rid, str) and not not_unicode(rid))):
        rid = None
    if (where := not_unicode(obj)) and rid is not None:
        return _error(rid, INVALID_PARAMS, f"invalid params: {where} holds a lone UTF-16 surrogate (such as "
                                           "\\ud800), which is not Unicode text; send valid text")
    if where:
        return _error(None, PARSE_ERROR, "parse error: the message holds a lone UTF-16 surrogate (such as "
                                         "\\ud800), which is not Unicode text")
    why = "a message must be a JSON object"
    if isinstance(obj, dict):
        try:
            types.jsonrpc_message_adapter.validate_python(obj, by_name=False)
            return None
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            why = str(errors[0]["msg"])[:200] if errors else "not a JSON-RPC message"
    return _error(rid, INVALID_REQUEST, f"invalid request: the MCP bridge cannot read this message ({why})")


def _int(digits: str) -> int | float:
    return int(digits) if len(digits) <= 4000 else float("inf")


def _error(rid: int | str | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class UnreadableBodies:
    """ASGI middleware in front of the SDK's app: its 400s for unreadable bodies, answered as above."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        held: dict[str, Any] | None = None
        replace: bytes | None = None

        async def keep_body() -> Any:
            message = await receive()
            if message["type"] == "http.request" and len(body) < _MAX_BODY:
                body.extend(message.get("body", b"")[:_MAX_BODY - len(body)])
            return message

        async def answer(message: dict[str, Any]) -> None:
            nonlocal held, replace
            if message["type"] == "http.response.start" and message.get("status") == 202:
                replace = _bad_id(bytes(body))
                if replace is not None:  # a request the SDK took for a notification: answer it
                    headers = [(k, v) for k, v in message.get("headers", [])
                               if k.lower() not in (b"content-length", b"content-type")]
                    await send({**message, "status": 400, "headers": [
                        *headers, (b"content-type", b"application/json"),
                        (b"content-length", str(len(replace)).encode())]})
                    return
            if replace is not None and message["type"] == "http.response.body":
                await send({**message, "body": replace, "more_body": False})
                replace = None
                return
            if message["type"] == "http.response.start" and message.get("status") == 400:
                held = message  # decided at its body
                return
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                out = _rewritten(bytes(message.get("body", b"")), bytes(body))
                if out is not None:
                    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                    start = {**start, "headers": [*headers, (b"content-length", str(len(out)).encode())]}
                    message = {**message, "body": out, "more_body": False}
                await send(start)
            await send(message)

        await self.app(scope, keep_body, answer)


def _bad_id(request_body: bytes) -> bytes | None:
    """The 400 body for a request whose id is no string or integer (vault.mcp.stdio_lines)."""
    try:
        obj = json.loads(request_body.decode("utf-8"), parse_int=lambda digits: 0)
    except (ValueError, RecursionError):
        return None
    refused = bad_id_answer(obj)
    return None if refused is None else refused.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _rewritten(sdk_body: bytes, request_body: bytes) -> bytes | None:
    try:
        said = json.loads(sdk_body)
        message = said["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    if said.get("id") is None and (refused := _bad_id(request_body)) is not None:
        return refused  # an initialize with id null was "Missing session ID": it was no request
    if not (isinstance(message, str) and message.startswith(_SDK_PREFIXES) and said.get("id") is None):
        return None
    out = answer_body(request_body)
    return None if out is None else json.dumps(out).encode()
