"""stdin's lines for the SDK's stdio transport, each first checked for a request id JSON-RPC cannot carry.

MCP ids are strings or integers. The SDK's parser reads a request whose id is null, a
fraction, true or an object as a notification (its model ignores the id), and a
notification is never answered: a host that sent `{"id": null, "method": "ping"}` waited
for its answer until its own timeout. Such a line is answered instead with id null and
-32600, as JSON-RPC answers a request whose id cannot be read (vault.mcp.stdio takes each
line kept here, in order, with its item: the SDK's reader hands on one item a line).

Passing the SDK our own stdin skips its claim of fd 0, so the claim is made here as the SDK
makes it: fd 0 then reads the null device, so nothing the bridge starts can take the host's
input.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types

from vault.jsonrpc import INVALID_REQUEST


def valid_id(rid: Any) -> bool:
    return (isinstance(rid, int) and not isinstance(rid, bool)) or isinstance(rid, str)


def _kind(rid: Any) -> str:
    if rid is None:
        return "null"
    if isinstance(rid, bool):
        return "a boolean"
    if isinstance(rid, float):
        return "a fraction"
    return "an array" if isinstance(rid, list) else "an object"


def bad_id_answer(obj: Any) -> types.JSONRPCError | None:
    """The answer to a request (it names a method) whose id is no string or integer; else None."""
    if isinstance(obj, dict) and "id" in obj and isinstance(obj.get("method"), str) and not valid_id(obj["id"]):
        return types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
            code=INVALID_REQUEST, message=f"invalid request: a request's id must be a string or an integer, "
                                          f"not {_kind(obj['id'])}"))
    return None


def line_verdict(line: str) -> types.JSONRPCError | None:
    """The answer to a line the SDK read as a notification, when it was a request with a bad id."""
    if not line.lstrip().startswith("{"):
        return None
    try:
        obj = json.loads(line, parse_int=lambda digits: 0)  # only the id's type matters
    except (ValueError, RecursionError):
        return None  # the SDK's parser refuses it too, and vault.mcp.stdio answers that
    return bad_id_answer(obj)


LINE_MOST = 4 << 20  # characters in one line: the SDK's own cap on an HTTP request's body
# stands in `raw` for a line past LINE_MOST, read and dropped a piece at a time; the SDK is
# handed a short line it cannot parse, which vault.mcp.stdio answers as too long
TOO_LONG = "\u0000 a line past the MCP bridge's limit\n"


def too_long_answer() -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
        code=INVALID_REQUEST, message=f"invalid request: a line longer than {LINE_MOST} characters, which "
                                      "the MCP bridge does not read; nothing was done"))


class CheckedLines:
    """The lines of a text stream, each kept in `raw` (in order) as it is read on: the reader
    looks again at the few the SDK took for notifications (requests are never parsed twice).
    No line is held past LINE_MOST characters: one line of 60 MB took the bridge to 335 MB."""

    def __init__(self, text: io.TextIOBase) -> None:
        self._text = text
        self.raw: deque[str] = deque()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._read()

    async def _readline(self) -> str:
        # a thread as anyio's AsyncFile reads (its readline takes no size)
        return await anyio.to_thread.run_sync(self._text.readline, LINE_MOST)

    async def _read(self) -> AsyncIterator[str]:
        while line := await self._readline():
            if len(line) >= LINE_MOST and not line.endswith("\n"):
                while (rest := await self._readline()) and not rest.endswith("\n"):
                    pass
                line = TOO_LONG
            elif not line.strip():
                continue  # a blank line (a host's "\r\n\r\n") holds no message: answering each -32700 was noise
            self.raw.append(line)
            yield line


def claim_stdin() -> CheckedLines | None:
    """The process's stdin as checked lines (UTF-8, bad bytes replaced, as the SDK reads it);
    fd 0 itself then reads the null device. None when fd 0 cannot be duplicated (the SDK's
    own reader serves then, unchecked)."""
    try:
        private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return None
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    text = open(private, "r", encoding="utf-8", errors="replace", closefd=True)  # noqa: SIM115 (lives as long as the bridge)
    return CheckedLines(text)
