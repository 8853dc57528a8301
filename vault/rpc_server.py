"""Serve JSON-RPC over a Unix socket: framing, dispatch and per-connection state.

Each request runs in its own task, so a call waiting for an approval never
blocks another request on the same connection; writes are serialised per
connection. Handlers raise `RpcError` for protocol answers; anything else is
logged by type only (never the message, which could carry input) and answered
-32603 with a reference.
"""

from __future__ import annotations

import asyncio
import logging
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ValidationError

from . import jsonrpc as rpc
from .catalog import format_validation_error
from .errors import RpcError
from .ids import new_id
from .peer import ProcessIdentity, peer_cred

log = logging.getLogger("vaultsim.rpc")

Handler = Callable[["Connection", Any], Awaitable[Any]]

# Requests one connection may have in progress at once (e.g. calls waiting on
# approvals). Past it each further request is answered at once with LIMIT: the
# daemon holds one line at a time for that client, so a client cannot grow its
# memory without bound, and still sees when that client goes away.
MAX_IN_FLIGHT = 64


@dataclass(eq=False)
class Connection:
    id: str
    channel: str
    peer: ProcessIdentity
    writer: asyncio.StreamWriter
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    state: dict[str, Any] = field(default_factory=dict)
    in_flight: int = 0

    async def send(self, frame: bytes) -> bool:
        if self.closed.is_set():
            return False
        async with self.lock:
            try:
                self.writer.write(frame)
                await self.writer.drain()
                return True
            except (ConnectionError, RuntimeError, OSError):
                self.closed.set()
                return False

    async def notify(self, method: str, params: dict[str, Any]) -> bool:
        return await self.send(rpc.encode_notification(method, params))


class Dispatcher:
    """Method table for one socket: name -> (params model, handler)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.methods: dict[str, tuple[type[BaseModel], Handler]] = {}
        self.on_connect: Callable[[Connection], Awaitable[None]] | None = None
        self.on_disconnect: Callable[[Connection], Awaitable[None]] | None = None

    def method(self, name: str, params: type[BaseModel]) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.methods[name] = (params, fn)
            return fn
        return register

    async def dispatch(self, conn: Connection, req: rpc.Request) -> bytes | None:
        entry = self.methods.get(req.method)
        if entry is None:
            frame = rpc.encode_error(req.id, rpc.METHOD_NOT_FOUND, f"method not found: {req.method[:64]!r}")
            return None if req.is_notification else frame
        model, handler = entry
        try:
            params = model.model_validate(req.params)
        except ValidationError as exc:
            return None if req.is_notification else rpc.encode_error(
                req.id, rpc.INVALID_PARAMS, f"invalid params: {format_validation_error(exc)}")
        try:
            result = await handler(conn, params)
        except RpcError as exc:
            frame = rpc.encode_error(req.id, exc.rpc_code, exc.message, exc.data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not kill the daemon; the message may hold input
            ref = new_id("e")
            log.error("internal error %s in %s: %s\n%s", ref, req.method, type(exc).__name__,
                      "".join(traceback.format_tb(exc.__traceback__)))
            frame = rpc.encode_error(req.id, rpc.INTERNAL_ERROR, f"internal error (reference {ref})")
        else:
            if isinstance(result, BaseModel):
                result = result.model_dump(mode="json", exclude_none=True)
            frame = rpc.encode_result(req.id, result)
        return None if req.is_notification else frame


class RpcServer:
    """One listening Unix socket with its dispatcher and live connections."""

    def __init__(self, path: str, dispatcher: Dispatcher) -> None:
        self.path = path
        self.dispatcher = dispatcher
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        old = os.umask(0o177)  # socket file created 0600
        try:
            self.server = await asyncio.start_unix_server(
                self._serve, path=self.path, limit=rpc.MAX_FRAME + 1)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self, grace: float = 10.0) -> None:
        if self.server is not None:
            self.server.close()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=grace)
        for conn in list(self.connections):
            conn.closed.set()
            conn.writer.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            pid, uid, _ = peer_cred(sock)
        except OSError:
            writer.close()
            return
        if uid != os.getuid():
            # another user: refuse before reading anything
            writer.write(rpc.encode_error(None, rpc.NOT_AUTHORIZED,
                                          "refused: peer runs as another user"))
            await _close(writer)
            return
        ident = ProcessIdentity.of(pid, uid) or ProcessIdentity(pid, uid, -1.0, "")
        conn = Connection(new_id("k"), self.dispatcher.channel, ident, writer)
        self.connections.add(conn)
        try:
            if self.dispatcher.on_connect:
                await self.dispatcher.on_connect(conn)
            await self._read_loop(conn, reader)
        finally:
            conn.closed.set()
            self.connections.discard(conn)
            if self.dispatcher.on_disconnect:
                try:
                    await self.dispatcher.on_disconnect(conn)
                except Exception as exc:
                    log.error("disconnect handler failed: %s", type(exc).__name__)
            await _close(writer)

    async def _read_loop(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        while not conn.closed.is_set():
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                return  # EOF, possibly mid-line: the client left; nothing to answer
            except asyncio.LimitOverrunError:
                await conn.send(rpc.encode_error(None, rpc.INVALID_REQUEST,
                                                 "invalid request: frame larger than 1 MiB"))
                return  # cannot resynchronise cheaply: close this connection only
            except (ConnectionError, OSError):
                return
            if len(line) > rpc.MAX_FRAME + 1:
                await conn.send(rpc.encode_error(None, rpc.INVALID_REQUEST,
                                                 "invalid request: frame larger than 1 MiB"))
                return
            if not line.strip():
                continue
            parsed = rpc.parse_frame(line)
            if isinstance(parsed, rpc.FrameError):
                await conn.send(rpc.encode_error(parsed.id, parsed.code, parsed.message))
                continue
            if conn.in_flight >= MAX_IN_FLIGHT:
                if not parsed.is_notification:  # a notification gets no answer, busy or not
                    await conn.send(rpc.encode_error(
                        parsed.id, rpc.LIMIT, f"too many requests in progress on this connection "
                        f"(at most {MAX_IN_FLIGHT}); wait for an answer, then send again. Nothing was done"))
                continue
            conn.in_flight += 1
            task = asyncio.create_task(self._handle(conn, parsed))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _handle(self, conn: Connection, req: rpc.Request) -> None:
        try:
            frame = await self.dispatcher.dispatch(conn, req)
            if frame is not None:
                await conn.send(frame)
        finally:
            conn.in_flight -= 1


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
        await writer.wait_closed()
    except (ConnectionError, OSError, RuntimeError):
        pass
