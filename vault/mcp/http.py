"""`vaultsim mcp --http 127.0.0.1:PORT`: Streamable HTTP on loopback, for hosts that connect by URL.

The same identity rules as stdio, per HTTP MCP session: each one (its
`Mcp-Session-Id`, from initialize to DELETE or idle expiry) is its own vault
session, so a grant made in one chat never serves another. Who is calling:

    another user's process     refused (403) before the MCP layer sees anything (at accept
                               when the TCP table names the user): a TCP port, unlike the
                               agent socket, is open to every user
    our user, process found    the session is labelled with the pid of the process that
                               opened it (its initialize request) ("via mcp-http"), and
                               is that process's alone: a request carrying its
                               Mcp-Session-Id from another process is refused (403), as
                               the agent socket refuses a session id from another process
    not known (not Linux)      labelled "via mcp-remote"; its grants still serve that
                               one MCP session only
    a session id not known     refused (404): one this bridge never opened, or whose opener
                               it no longer remembers (ended sessions are forgotten at their
                               DELETE, so only live ones fill the memory)
    a process holding a quarter refused (429) a new session: one process opening sessions it
    of the sessions            never ends would otherwise hold every one of them for the
                               SDK's 30-minute idle timeout, and no other host could connect
    a process holding its share    refused (429) a new connection, at accept, before anything is
    of connections                 read (vault.mcp.http_peers): one reconnecting without end would
                                   otherwise hold every descriptor the bridge may open

Browsers are kept out by the SDK's DNS-rebinding protection (Host and Origin
must be loopback). Only the handshake protocol era is served here: a 2026-07-28
request (no sessions, so no grant could outlive one request) is answered
-32022 naming the handshake versions, and clients fall back to `initialize`. A
request on a session whose MCP-Protocol-Version header names no version at all is a 400
(-32600) naming the versions served.

Stop signals are caught by the bridge, not by uvicorn (which caught SIGINT even
when it was ignored at start, left SIGHUP to kill it without closing a session,
and raised SIGTERM again once stopped): SIGTERM, SIGINT and SIGHUP each end
every session and return; SIGINT is said so (`vaultsim mcp` exits 130), and
one ignored at start stays ignored (vault.stop_signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from types import FrameType
from typing import Any

import anyio
import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import ClientDisconnect

from vault import stop_signals
from vault.daemon.limits import MAX_CONNECTIONS_PER_PROCESS
from vault.errors import BadInput
from vault.mcp.http_unreadable import UnreadableBodies
from vault.mcp.http_peers import MAX_HTTP_CONNECTIONS_PER_PROCESS, OTHER_USER, capped_protocol
from vault.mcp.loopback import Addr, LoopbackPeer, held_by, peer_of, peer_uid
from vault.mcp.server import Bridge, McpSession, Peer
from vault.sparing import Sparing

log = logging.getLogger("vaultsim.mcp")

PATH = "/mcp"
_SMALL_BODY = 64 * 1024  # a notifications/cancelled is far smaller; larger bodies are not looked into


def _error(status: int, code: int, message: str, data: Any = None) -> tuple[int, bytes]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return status, json.dumps({"jsonrpc": "2.0", "id": None, "error": err}).encode()


class LoopbackGuard:
    """ASGI middleware in front of the SDK's app: only this user's processes, handshake era only.

    It also notes which process opened each MCP session: the request that opens one (an initialize
    without a session id) is the moment its connection surely exists; later requests may come on
    connections that are gone by the time a handler runs. Each later request is checked here, on
    arrival, to come from a connection that process holds."""

    MAX_REMEMBERED = 10_000

    def __init__(self, app: Any, uid: int, live: Callable[[], Collection[str]] = frozenset,
                 per_process: int | None = None) -> None:
        self.app, self.uid = app, uid
        self.openers: dict[str, int | None] = {}  # MCP session id -> pid of the process that opened it
        self.live, self.per_process = live, per_process  # the SDK's open session ids; a process's share
        self.opening: dict[int, int] = {}  # pid -> its opening requests in flight (not yet in `live`)
        # for a DELETE while the session's calls wait for a person (`_answer_first`)
        self.sessions: dict[str, McpSession] = {}  # MCP session id -> its vault side (http_session_for)
        self.posts: dict[str, int] = {}  # MCP session id -> its POSTs being answered
        # asked for a notifications/cancelled: True when its call cannot be withdrawn (Bridge.cannot_cancel)
        self.cannot_cancel: Callable[[McpSession, Any], Awaitable[bool]] | None = None

    def held(self, pid: int) -> int:
        """The MCP sessions `pid` holds: open ones it opened (idle-expired ones are not in `live`)
        and its openings in flight, so concurrent initializes cannot pass the share together."""
        live = self.live()
        return self.opening.get(pid, 0) + sum(1 for sid, opener in self.openers.items()
                                              if opener == pid and sid in live)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        client, server = scope.get("client"), scope.get("server")
        opening = scope.get("method") == "POST" and b"mcp-session-id" not in headers
        peer = LoopbackPeer(None, None)
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        owner = None if opening else self.openers.get(sid)
        # a session id this guard never saw opened, or has forgotten (past MAX_REMEMBERED sessions
        # opened since: a process could churn sessions to push a victim's out), is nobody's to use
        forgotten = not opening and sid != "" and sid not in self.openers
        stranger = False
        if client and server:
            addrs = (tuple(client), tuple(server))
            peer = await anyio.to_thread.run_sync(peer_of if opening else _uid_only, *addrs)
            if owner is not None:
                stranger = not await anyio.to_thread.run_sync(held_by, owner, *addrs)
        refusal = None
        if peer.uid is not None and peer.uid != self.uid:
            refusal = _error(403, -32001, OTHER_USER)
        elif forgotten:
            refusal = _error(404, -32001, "refused: this bridge knows no such MCP session (ended, or opened "
                                          "too long ago to be vouched for); open a new one")
        elif stranger:
            # as on the agent socket, a session (and every grant it holds) is its process's alone
            refusal = _error(403, -32001, f"refused: this MCP session belongs to process {owner}, which "
                                          "opened it; another process may not use it (open your own)")
        elif opening and peer.pid is not None and self.per_process is not None \
                and self.held(peer.pid) >= self.per_process:
            refusal = _error(429, -32004, f"refused: process {peer.pid} already holds {self.per_process} "
                                          "MCP sessions of this bridge, its share (the rest are kept for "
                                          "other processes); end one (DELETE) or let one idle out "
                                          "(30 minutes) before opening another")
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
        if refusal is None and version in MODERN_PROTOCOL_VERSIONS:
            refusal = _error(400, -32022, "this bridge serves MCP sessions (the initialize handshake) over "
                                          "HTTP: each one is a vault session",
                             {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version})
        elif refusal is None and not opening and b"mcp-protocol-version" in headers \
                and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # MCP: an unsupported MCP-Protocol-Version is a 400. The SDK took any version it does not
            # know for the 2026-07-28 era and asked for that era's params._meta envelope (-32602),
            # which told a handshake host nothing about its header. The value is not quoted back.
            refusal = _error(400, -32600, "invalid request: unsupported MCP-Protocol-Version header; send the "
                                          "version initialize agreed on",
                             {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS)})
        if refusal is not None:
            status, body = refusal
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        if not opening:
            if scope.get("method") == "POST" and sid:
                receive, late = await self._late_cancel(sid, headers, receive)
                if late:  # ignored: the call runs and its POST is answered with its Result
                    await send({"type": "http.response.start", "status": 202,
                                "headers": [(b"content-length", b"0")]})
                    await send({"type": "http.response.body", "body": b""})
                    return
                self.posts[sid] = self.posts.get(sid, 0) + 1
                try:
                    await self.app(scope, receive, send)
                finally:
                    if (left := self.posts[sid] - 1) > 0:
                        self.posts[sid] = left
                    else:
                        del self.posts[sid]
                return
            if scope.get("method") == "GET":
                scope = _without_last_event_id(scope)
            if scope.get("method") != "DELETE":
                await self.app(scope, receive, send)
                return
            await self._answer_first(sid)

            async def forget_ended(message: dict[str, Any]) -> None:
                # an ended session leaves the memory: only live ones fill it, at most the SDK's cap
                if message["type"] == "http.response.start" and message.get("status", 500) < 300:
                    self.openers.pop(sid, None)
                await send(message)

            await self.app(scope, receive, forget_ended)
            return

        in_flight = peer.pid is not None  # counted in `opening` until its session is in `openers`

        def opened() -> None:
            # once only: the session it opened is counted through `live` from when it is noted
            # (the SDK lists it before it answers); counted in both until the request ended, a
            # process opening its share 8 at a time was refused 429 short of it
            nonlocal in_flight
            if in_flight and peer.pid is not None:
                in_flight = False
                left = self.opening[peer.pid] - 1
                if left:
                    self.opening[peer.pid] = left
                else:
                    del self.opening[peer.pid]

        async def note_session(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sid = dict(message.get("headers") or []).get(b"mcp-session-id")
                if sid:
                    while len(self.openers) >= self.MAX_REMEMBERED:
                        self.openers.pop(next(iter(self.openers)))
                    self.openers[sid.decode("latin-1")] = peer.pid
                    opened()
            await send(message)

        if peer.pid is None:
            await self.app(scope, receive, note_session)
            return
        self.opening[peer.pid] = self.opening.get(peer.pid, 0) + 1
        try:
            await self.app(scope, receive, note_session)
        finally:
            opened()


    async def _late_cancel(self, sid: str, headers: dict[bytes, bytes], receive: Any) -> tuple[Any, bool]:
        """Whether this POST is a notifications/cancelled that comes too late (its call was allowed
        and runs), and a `receive` that replays the body read to find out. The SDK would cancel the
        handler and answer the call's POST -32800 "Request cancelled" for a deployment that ran."""
        sess = self.sessions.get(sid)
        try:
            size = int(headers.get(b"content-length", b"-1"))
        except ValueError:
            size = -1
        if sess is None or self.cannot_cancel is None or not 0 < size <= _SMALL_BODY:
            return receive, False
        read: list[dict[str, Any]] = []
        body = b""
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body") or len(body) > _SMALL_BODY:
                break

        async def replay() -> Any:
            return read.pop(0) if read else await receive()

        try:
            said = json.loads(body)
        except ValueError:
            return replay, False
        if not (isinstance(said, dict) and said.get("method") == "notifications/cancelled" and "id" not in said
                and isinstance(said.get("params"), dict)):
            return replay, False
        return replay, await self.cannot_cancel(sess, said["params"].get("requestId"))

    async def _answer_first(self, sid: str, within_s: float = 1.5) -> None:
        """A host ending its session (DELETE) while its own calls wait for a person: the SDK tore
        the session down under them and each POST ended with no answer at all. As at stdio's EOF,
        each waiting call is withdrawn and answered with the vault's Result for it first."""
        sess = self.sessions.get(sid)
        if sess is None or not self.posts.get(sid):
            return
        sess.link.end_waits()
        with anyio.move_on_after(within_s):
            while self.posts.get(sid):
                await anyio.sleep(0.01)  # the POSTs' own ends, which nothing else signals


def _without_last_event_id(scope: dict[str, Any]) -> dict[str, Any]:
    """A GET that asks to resume after an event (Last-Event-ID) opens a fresh stream. The bridge
    keeps no event store (its events carry no ids, so there is nothing to replay), and the SDK
    answered such a GET with nothing at all: uvicorn's 500, and a host retrying its stream for ever."""
    headers = scope.get("headers") or []
    if not any(name.lower() == b"last-event-id" for name, _ in headers):
        return scope
    return {**scope, "headers": [(n, v) for n, v in headers if n.lower() != b"last-event-id"]}


def _uid_only(client: Addr, server: Addr) -> LoopbackPeer:
    return LoopbackPeer(peer_uid(client, server), None)


def _connection_of(ctx: Any) -> Any:
    # The SDK (mcp 2.3) gives a low-level handler its per-connection state (`state`, and the
    # `exit_stack` unwound when the MCP session ends) only through the request's ServerSession.
    conn = getattr(ctx.session, "_connection", None)
    if conn is None or not hasattr(conn, "exit_stack") or not hasattr(conn, "state"):
        raise RuntimeError("this mcp SDK version does not expose the MCP session's connection; "
                           "vaultsim mcp --http needs mcp>=2.3,<3")
    return conn


def http_session_for(bridge: Bridge, guard: LoopbackGuard, ctx: Any) -> McpSession:
    """One vault session per HTTP MCP session, ended with it (DELETE, idle expiry, shutdown)."""
    conn = _connection_of(ctx)
    sess: McpSession | None = conn.state.get("vaultsim")
    if sess is None:
        sid = ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None
        pid = guard.openers.get(sid) if sid else None
        sess = bridge.new_session(ctx, Peer(pid, "mcp-http" if pid else "mcp-remote"))
        conn.state["vaultsim"] = sess
        conn.exit_stack.push_async_callback(bridge.end_session, sess)
        if sid:
            guard.sessions[sid] = sess
            conn.exit_stack.callback(guard.sessions.pop, sid, None)
    return sess


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts (a taken port is bad input, exit 2)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise BadInput(f"--http: cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


# each MCP session holds one agent-socket connection of this process, one is the catalog watch's:
# past that the daemon would refuse its session, so the SDK refuses the MCP session at connect (503)
MAX_HTTP_SESSIONS = MAX_CONNECTIONS_PER_PROCESS - 1
# one process's share (as the daemon keeps a process tree to a quarter of its slots)
MAX_HTTP_SESSIONS_PER_PROCESS = MAX_HTTP_SESSIONS // 4


def _live_sessions(app_server: Any) -> Callable[[], Collection[str]]:
    # The SDK (mcp 2.3) keeps its open sessions (idle expiry and DELETE remove them) only in its
    # session manager's private table (cleared, never replaced).
    instances = getattr(app_server.session_manager, "_server_instances", None)
    if not isinstance(instances, dict):
        raise RuntimeError("this mcp SDK version does not expose its open sessions; "
                           "vaultsim mcp --http needs mcp>=2.3,<3")
    return lambda: instances.keys()


class _OutOfFiles:
    """The event loop's exception handler while serving: a connection flood that uses up the
    open-file limit makes every accept fail (EMFILE), and asyncio logged each, with its
    traceback, about 6,000 times a second (2.5 MB/s into the host's log of this server).
    Said once, then at most once a minute with how many since; anything else as before."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.sparing = Sparing(clock=clock)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, ValueError) and getattr(getattr(context.get("handle"), "_callback", None),
                                                   "__name__", "") == "_start_serving":
            # asyncio queues a retry of accept per failed one; at shutdown the listener is closed
            # and each retry raised here: a traceback apiece (40 MB of them after a flood)
            return
        if not (isinstance(exc, OSError) and exc.errno in _OUT_OF_FILES
                and str(context.get("message", "")).startswith("socket.accept()")):
            loop.default_exception_handler(context)
            return
        if (count := self.sparing.due()) is not None:
            log.error("cannot accept connections: %s (%d refused since last said); hosts already "
                      "connected are still served", exc.strerror, count)


_OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _not_a_hang_up(record: logging.LogRecord) -> bool:
    """The SDK logs a host that hangs up before its request's body is in as its own error, with
    a traceback: one a connection, for as many as a host cares to cut short. Not ours to say."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, ClientDisconnect)


class _Server(uvicorn.Server):
    """uvicorn's server, its stop signals caught by `serve_http` (see the module's doc)."""

    stopped_by: signal.Signals | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # serve_http has them, from before it says it serves

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(sig)
        super().handle_exit(sig, frame)


async def serve_http(bridge: Bridge, sock: socket.socket) -> signal.Signals | None:
    """Serve until SIGTERM, SIGINT or SIGHUP (uvicorn's shutdown ends every MCP session, and
    with each its vault session); return the signal that stopped it."""
    host, port = sock.getsockname()[:2]
    app = bridge.server.streamable_http_app(
        streamable_http_path=PATH, host=host, max_sessions=MAX_HTTP_SESSIONS,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]))
    shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
    guard = LoopbackGuard(UnreadableBodies(app), os.getuid(), _live_sessions(bridge.server),
                          MAX_HTTP_SESSIONS_PER_PROCESS)

    async def session_for(ctx: Any) -> McpSession:
        return http_session_for(bridge, guard, ctx)

    guard.cannot_cancel = bridge.cannot_cancel

    bridge.session_for = session_for  # type: ignore[method-assign]
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    share = MAX_HTTP_CONNECTIONS_PER_PROCESS if nofile == resource.RLIM_INFINITY \
        else max(16, min(MAX_HTTP_CONNECTIONS_PER_PROCESS, nofile // 4))
    protocol = capped_protocol(share)
    protocol.peers.listener = sock
    # the kernel's queue no longer than a share: while a batch is named it holds the next, and
    # asyncio accepts (and, out of descriptors, queues one retry for each) up to this many a turn
    server = _Server(uvicorn.Config(guard, log_level="warning", http=protocol, backlog=share,
                                    lifespan="on", access_log=False))
    asyncio.get_running_loop().set_exception_handler(_OutOfFiles())
    logging.getLogger("mcp.server.streamable_http").addFilter(_not_a_hang_up)
    # signal.signal, not the loop's handlers: what was there before is put back as it was
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in stop_signals.caught()}
    try:
        # said once a stop signal is a clean stop: a host that stops the bridge at once is served so
        print(f"vaultsim mcp: serving http://{shown}:{port}{PATH}", file=sys.stderr, flush=True)
        await server.serve(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return server.stopped_by
