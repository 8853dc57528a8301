"""JSON-RPC 2.0 framing: one JSON object per line, at most 1 MiB a line.

Parsing never raises on client input: every bad frame becomes an error frame
(-32700 unreadable bytes, -32600 readable but not a request), so one client's
garbage can never take the daemon or another client down. Batches are not
supported and are answered -32600.

Text must be Unicode. JSON can spell a lone UTF-16 surrogate (`"\\ud800"`),
which Python decodes into a str that no UTF-8 encoder accepts: let in, it would
make an audit event, a broadcast or the answer itself unencodable. So the rule
is applied here, once, for every string on both sockets (keys included):

    where the surrogate is        answer
    the id                        -32600, id null (the id is not a valid id)
    the method                    -32600, with the id
    params (any depth, any key)   -32602, with the id and the path of the string

Encoding never raises either: should an unencodable string reach an answer
anyway, it is written with JSON escapes rather than lost.
"""

from __future__ import annotations

import json
import re
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
LIMIT = -32004  # a limit (per connection, per process or in all) is reached; nothing was done


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
    # the method named by the frame, when it is readable text (for records of attempts)
    method: str | None = None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def not_unicode(value: Any, path: str = "") -> str | None:
    """The path of the first string (or key) in `value` holding a lone surrogate, else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(value)"
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{path}.{_shown_key(k)}" if path else _shown_key(k)
            found = not_unicode(k, where) or not_unicode(v, where)
            if found:
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = not_unicode(v, f"{path}[{i}]")
            if found:
                return found
    return None


def _shown_key(key: str) -> str:
    # a key is named in an error message: escaped, so the message itself stays encodable
    return key.encode("ascii", "backslashreplace").decode("ascii")[:64]


_NOT_UNICODE = ("holds a lone UTF-16 surrogate (such as \\ud800), which is not Unicode text; "
                "send valid UTF-8 text or escape pairs")


def parse_frame(line: bytes) -> Request | FrameError:
    try:
        text = line.decode("utf-8")
        obj = json.loads(text)
    except RecursionError:
        return FrameError(None, PARSE_ERROR, "parse error: the JSON text is nested too deeply "
                                             "(arrays and objects hundreds of levels deep)")
    except UnicodeDecodeError:
        return FrameError(None, PARSE_ERROR, "parse error: not a JSON text in UTF-8")
    except json.JSONDecodeError:
        return FrameError(None, PARSE_ERROR, "parse error: not a JSON text")
    except ValueError:
        # an integer longer than Python converts: it was called "not a JSON text in UTF-8",
        # which it is, so the sender was sent looking in the wrong place
        return FrameError(None, PARSE_ERROR, "parse error: a number has more digits than can be "
                                             "read (4300); send it as a string")
    if not isinstance(obj, dict):
        kind = "batch requests are not supported" if isinstance(obj, list) else "a request must be a JSON object"
        return FrameError(None, INVALID_REQUEST, f"invalid request: {kind}")
    rid = obj.get("id")
    has_id = "id" in obj
    if has_id and not (rid is None or isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))):
        return FrameError(None, INVALID_REQUEST, "invalid request: id must be a string, an integer or null")
    # only a \\uD800-\\uDFFF escape can carry a surrogate (raw ones fail UTF-8 decoding above)
    suspect = _SURROGATE_ESCAPE.search(line) is not None
    if suspect and not_unicode(rid):
        return FrameError(None, INVALID_REQUEST, f"invalid request: the id {_NOT_UNICODE}")
    if obj.get("jsonrpc") != "2.0":
        return FrameError(rid, INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        return FrameError(rid, INVALID_REQUEST, "invalid request: method must be a non-empty string")
    if suspect and not_unicode(method):
        return FrameError(rid, INVALID_REQUEST, f"invalid request: the method {_NOT_UNICODE}")
    extra = set(obj) - {"jsonrpc", "method", "params", "id"}
    if extra:
        return FrameError(rid, INVALID_REQUEST, "invalid request: unexpected members", method)
    params = obj.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return FrameError(rid, INVALID_PARAMS, "invalid params: params must be an object (named parameters)", method)
    where = not_unicode(params) if suspect else None
    if where:
        return FrameError(rid, INVALID_PARAMS, f"invalid params: {where} {_NOT_UNICODE}", method)
    return Request(rid, method, params, not has_id)


def _dump(obj: dict[str, Any]) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # a lone surrogate got this far: JSON escapes keep the frame valid and answered
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def encode_result(rid: Any, result: Any) -> bytes:
    return _dump({"jsonrpc": "2.0", "id": rid, "result": result})


def encode_result_json(rid: Any, body: bytes) -> bytes:
    """`encode_result` for a result already encoded as one JSON value (`body`, UTF-8): the
    same frame, without making the result a dict first only to encode it."""
    if isinstance(rid, int) and not isinstance(rid, bool):
        head = b'{"jsonrpc":"2.0","id":%d,"result":' % rid
    else:
        head = _dump({"jsonrpc": "2.0", "id": rid})[:-2] + b',"result":'
    return head + body + b"}\n"


def encode_error(rid: Any, code: int, message: str, data: Any = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return _dump({"jsonrpc": "2.0", "id": rid, "error": err})


def encode_request(rid: Any, method: str, params: dict[str, Any]) -> bytes:
    return _dump({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


def encode_notification(method: str, params: dict[str, Any]) -> bytes:
    return _dump({"jsonrpc": "2.0", "method": method, "params": params})
