"""JSON-RPC 2.0 framing: one JSON object per line, at most 1 MiB a line.

Parsing never raises on client input: every bad frame becomes an error frame
(-32700 unreadable bytes, -32600 readable but not a request), so one client's
garbage can never take the daemon or another client down. Batches are not
supported and are answered -32600.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_FRAME = 1 << 20

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# implementation-defined server errors (-32000..-32099)
NOT_AUTHORIZED = -32001
SERVER_UNAVAILABLE = -32002
CONFLICT = -32003
LIMIT = -32004  # a per-connection limit is reached; nothing was done


@dataclass(frozen=True)
class Request:
    id: int | str | None
    method: str
    params: dict[str, Any]
    is_notification: bool


@dataclass(frozen=True)
class FrameError:
    id: int | str | None
    code: int
    message: str


def parse_frame(line: bytes) -> Request | FrameError:
    try:
        text = line.decode("utf-8")
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        # ValueError beyond JSONDecodeError: e.g. an integer longer than Python converts
        return FrameError(None, PARSE_ERROR, "parse error: not a JSON text in UTF-8")
    if not isinstance(obj, dict):
        kind = "batch requests are not supported" if isinstance(obj, list) else "a request must be a JSON object"
        return FrameError(None, INVALID_REQUEST, f"invalid request: {kind}")
    rid = obj.get("id")
    has_id = "id" in obj
    if has_id and not (rid is None or isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))):
        return FrameError(None, INVALID_REQUEST, "invalid request: id must be a string, an integer or null")
    if obj.get("jsonrpc") != "2.0":
        return FrameError(rid, INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        return FrameError(rid, INVALID_REQUEST, "invalid request: method must be a non-empty string")
    extra = set(obj) - {"jsonrpc", "method", "params", "id"}
    if extra:
        return FrameError(rid, INVALID_REQUEST, "invalid request: unexpected members")
    params = obj.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return FrameError(rid, INVALID_PARAMS, "invalid params: params must be an object (named parameters)")
    return Request(rid, method, params, not has_id)


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def encode_result(rid: Any, result: Any) -> bytes:
    return _dump({"jsonrpc": "2.0", "id": rid, "result": result})


def encode_error(rid: Any, code: int, message: str, data: Any = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return _dump({"jsonrpc": "2.0", "id": rid, "error": err})


def encode_request(rid: Any, method: str, params: dict[str, Any]) -> bytes:
    return _dump({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


def encode_notification(method: str, params: dict[str, Any]) -> bytes:
    return _dump({"jsonrpc": "2.0", "method": method, "params": params})
