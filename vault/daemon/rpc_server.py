"""Serve JSON-RPC over a Unix socket: framing, dispatch and per-connection state.

Each request runs in its own task, so a call waiting for an approval never
blocks another request on the same connection. Sending never waits for the
client (vault.daemon.line_socket): a client that stops reading is dropped, never
waited for. Handlers raise `RpcError` for protocol answers, or a domain error
(vault.errors.Refused: the gate knows no wire) that is mapped here, the one
place, to its code; anything else is logged by type only (never the message,
which could carry input) and answered -32603 with a reference.

Who is asking is decided per line, not per connection: the kernel names the
process that wrote each line (SCM_CREDENTIALS), and a handler's `conn.peer`
is that process. A child that inherited its parent's connection is itself,
not its parent.

A notification (a request without an id) is refused -32600 with a null id and
nothing done: every method on both sockets answers, and one that acts with no
answer would open a session nobody can name or run a call nobody hears of.

Limits (vault.daemon.limits) are enforced here for what a connection holds before a
request exists: connections per process and per process tree (reported to `on_flood`,
which the daemon audits, sampled) and in all, bytes of unfinished
lines per process and in all, requests in progress per connection (reported to `on_busy`, as
are those past `ProcessTable.begin_request`'s bounds).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from pydantic import BaseModel, ValidationError

from vault import jsonrpc as rpc
from vault.catalog import format_validation_error
from vault.errors import AuditError, Conflict, NotAuthorized, Refused, RpcError
from vault.ids import new_id
from vault.sparing import Sparing
from vault.daemon.limits import (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PROCESS, MAX_CONNECTIONS_PER_TREE,
                                 MAX_IN_FLIGHT, MAX_PARTIAL_BYTES, MAX_PARTIAL_BYTES_PER_PROCESS, MiB)
from vault.daemon.line_socket import FOREIGN, MIXED, UNKNOWN, LineSocket
from vault.daemon.peer import ProcessIdentity, peer_cred
from vault.daemon.processes import Busy, ProcessEntry, ProcessTable

log = logging.getLogger("vaultsim.rpc")

Handler = Callable[["Connection", Any], Awaitable[Any]]
# (connection as seen by the sender, method, why, params or None): a frame naming a
# method that was refused before its handler ran
RefusedHook = Callable[["Connection", str, str, "dict[str, Any] | None"], None]
# (the refused process, the root (pid, start) of its tree, connections the tree holds, or the
# process does with "process" last; None: the tree's share)
FloodHook = Callable[[ProcessIdentity, "tuple[int, float]", int, "str | None"], None]
# (the process whose requests were counted, the root of its tree, the bound it met): a request
# refused for the requests already in progress
BusyHook = Callable[[ProcessIdentity, "tuple[int, float]", Busy], None]

_ACCEPT_BATCH = 64
_ACCEPT_RETRY_S = 0.1  # out of file descriptors: accept again after this


@dataclass(eq=False)
class Connection:
    """One client connection. Handlers get a view of it whose `peer` is the process that
    sent the frame being handled; the view shares the id, state and socket."""

    id: str
    channel: str
    peer: ProcessIdentity  # the sender of the frame in hand (on the base object: the opener)
    io: LineSocket | None
    opener: ProcessIdentity
    state: dict[str, Any] = field(default_factory=dict)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    entry: ProcessEntry | None = None  # the opener's, where its requests in progress are counted

    def as_sent_by(self, identity: ProcessIdentity) -> "Connection":
        return self if identity is self.peer else dataclasses.replace(self, peer=identity)

    def send(self, frame: bytes) -> bool:
        """Send or queue `frame`; never waits. False if the connection is closed."""
        if self.io is None or self.closed.is_set():
            return False
        return self.io.write(frame)

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        return self.send(rpc.encode_notification(method, params))

    def backlog(self) -> int:
        return self.io.backlog() if self.io is not None else 0

    def stalled_for(self) -> float:
        return self.io.stalled_for() if self.io is not None else 0.0

    def drop(self, reason: str) -> None:
        """Close this connection now (e.g. a subscriber that stopped reading)."""
        if self.io is not None:
            self.io.close(reason)


class Dispatcher:
    """Method table for one socket: name -> (params model, handler)."""

    def __init__(self, channel: str, methods: Iterable[tuple[str, type[BaseModel], Handler]] = ()) -> None:
        self.channel = channel
        self.methods: dict[str, tuple[type[BaseModel], Handler]] = {name: (params, fn) for name, params, fn in methods}
        self.on_connect: Callable[[Connection], Awaitable[None]] | None = None
        self.on_disconnect: Callable[[Connection], Awaitable[None]] | None = None
        self.on_refused: RefusedHook | None = None

    def method(self, name: str, params: type[BaseModel]) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.methods[name] = (params, fn)
            return fn
        return register

    def refused(self, conn: Connection, method: str | None, why: str, params: dict[str, Any] | None) -> None:
        if self.on_refused is not None and method is not None:
            try:
                self.on_refused(conn, method, why, params)
            except Exception as exc:
                log.error("refusal handler failed: %s", type(exc).__name__)

    async def dispatch(self, conn: Connection, req: rpc.Request) -> bytes:
        """The answer's frame (a request without an id never gets here: RpcServer refuses it)."""
        entry = self.methods.get(req.method)
        if entry is None:
            return rpc.encode_error(req.id, rpc.METHOD_NOT_FOUND, f"method not found: {req.method[:64]!r}")
        model, handler = entry
        try:
            params = model.model_validate(req.params)
        except ValidationError as exc:
            why = f"invalid params: {format_validation_error(exc)}"
            self.refused(conn, req.method, why, req.params)
            return rpc.encode_error(req.id, rpc.INVALID_PARAMS, why)
        try:
            result = await handler(conn, params)
        except RpcError as exc:
            frame = rpc.encode_error(req.id, exc.rpc_code, exc.message, exc.data)
        except Refused as exc:
            frame = rpc.encode_error(req.id, rpc_code(exc), exc.message)
        except AuditError as exc:  # the log failed (a full disk): said as such, not as a bug
            frame = rpc.encode_error(req.id, rpc.SERVER_UNAVAILABLE,
                                     f"the audit log cannot record this: {exc.message}; the daemon serves "
                                     "no calls until it is restarted with room on its disk")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not kill the daemon; the message may hold input
            ref = new_id("e")
            log.error("internal error %s in %s: %s\n%s", ref, req.method, type(exc).__name__,
                      "".join(traceback.format_tb(exc.__traceback__)))
            frame = rpc.encode_error(req.id, rpc.INTERNAL_ERROR, f"internal error (reference {ref})")
        else:
            frame = _result_frame(req.id, result)
        return frame


def _result_frame(rid: Any, result: Any) -> bytes:
    if isinstance(result, BaseModel):
        try:
            # pydantic writes the JSON itself: no dict made only to be encoded again
            return rpc.encode_result_json(rid, result.__pydantic_serializer__.to_json(result, exclude_none=True))
        except ValueError:  # text that is not Unicode: the escaping encoder below keeps it answered
            result = result.model_dump(mode="json", exclude_none=True)
    return rpc.encode_result(rid, result)


def rpc_code(exc: Refused) -> int:
    """The JSON-RPC error code a domain refusal is answered with."""
    if isinstance(exc, Conflict):
        return rpc.CONFLICT
    if isinstance(exc, NotAuthorized):
        return rpc.NOT_AUTHORIZED
    return rpc.INVALID_PARAMS


class _PartialBudget:
    """Bytes of unfinished lines, charged to the connection's process and to the total."""

    def __init__(self, table: ProcessTable, entry: ProcessEntry) -> None:
        self.table = table
        self.entry = entry

    def charge(self, n: int) -> str | None:
        if self.entry.partial_bytes + n > MAX_PARTIAL_BYTES_PER_PROCESS:
            return (f"limit reached: this process already holds "
                    f"{MAX_PARTIAL_BYTES_PER_PROCESS // MiB} MiB of unfinished lines on its connections; "
                    "finish a line (newline) before starting more")
        if self.table.partial_bytes + n > MAX_PARTIAL_BYTES:
            return (f"limit reached: the daemon holds {MAX_PARTIAL_BYTES // MiB} MiB of unfinished lines "
                    "from all clients; send whole lines, and try again")
        self.entry.partial_bytes += n
        self.table.partial_bytes += n
        return None

    def refund(self, n: int) -> None:
        self.entry.partial_bytes -= n
        self.table.partial_bytes -= n


class RpcServer:
    """One listening Unix socket with its dispatcher and live connections."""

    def __init__(self, path: str, dispatcher: Dispatcher, processes: ProcessTable | None = None,
                 leave_free: int = 0, on_flood: FloodHook | None = None,
                 on_busy: BusyHook | None = None) -> None:
        self.path = path
        self.on_flood = on_flood
        self.on_busy = on_busy
        self.leave_free = leave_free  # connections in all this socket leaves to the others
        self.dispatcher = dispatcher
        self.processes = processes if processes is not None else ProcessTable()
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self._accept_failures = Sparing()  # retried every _ACCEPT_RETRY_S: said once a minute
        self._uid = os.getuid()
        self._bound: tuple[int, int] | None = None  # (device, inode) of the socket file it made

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # set on the listening socket, so every accepted socket has it before its first byte
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        old = os.umask(0o177)  # socket file created 0600
        try:
            sock.bind(self.path)
        except OSError as exc:  # a home out of inodes: "cannot start: No space left on device" named no file
            sock.close()
            if exc.filename is None:
                exc.filename = self.path
            raise
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        st = os.stat(self.path)
        self._bound = (st.st_dev, st.st_ino)
        sock.listen(512)
        sock.setblocking(False)
        self.sock = sock
        self._resume_accepting()

    async def close(self, grace: float = 3.0) -> None:
        # bounded: the daemon signs its audit log only after this, and whoever stops it
        # (the runner, a service manager) gives up and kills it after a few seconds more
        self._pause_accepting()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=grace)
        for conn in list(self.connections):
            conn.drop("the daemon stopped")
        if not self.owns_path():
            # another process's socket is there now (or the home left its path): not ours to remove
            log.warning("%s is no longer this daemon's socket; left as it is", self.path)
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # a home the kernel remounted read-only: the stop goes on (executors, signing the
            # log); the next start clears the file once nobody answers on it
            log.warning("cannot remove %s: %s", self.path, exc.strerror)

    def owns_path(self) -> bool:
        """Whether the socket file at `path` is still the one this server bound (not removed,
        replaced by another listener, or hidden by the home's file system leaving the path)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return self._bound == (st.st_dev, st.st_ino)

    # ---- accepting ------------------------------------------------------------------

    def _resume_accepting(self) -> None:
        if self.sock is not None and not self._accepting and self._loop is not None:
            self._loop.add_reader(self.sock.fileno(), self._accept)
            self._accepting = True

    def _pause_accepting(self) -> None:
        if self._accepting and self._loop is not None and self.sock is not None:
            self._loop.remove_reader(self.sock.fileno())
        self._accepting = False

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            if self.sock is None:
                return
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE/ENFILE: wait for a descriptor instead of spinning
                self._out_of_files(exc)
                return
            self._admit(sock)
            if not self._accepting:
                return

    def _out_of_files(self, exc: OSError) -> None:
        self._accept_failed(exc)
        self._pause_accepting()
        assert self._loop is not None
        self._loop.call_later(_ACCEPT_RETRY_S, self._resume_accepting)

    def _accept_failed(self, exc: OSError) -> None:
        # retried every _ACCEPT_RETRY_S while descriptors are out: logged each time, that was
        # ten lines a second for as long as a flood lasted. Said once, then once a minute.
        if (count := self._accept_failures.due()) is not None:
            log.warning("cannot accept connections on %s: %s (%d failed tries since last said); connections "
                        "already open are still served, and accepting resumes once descriptors free up",
                        self.dispatcher.channel, os.strerror(exc.errno or 0), count)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            pid, uid, _ = peer_cred(sock)
        except OSError:
            sock.close()
            return
        if uid != self._uid:
            # another user: refuse before reading anything
            _refuse(sock, rpc.NOT_AUTHORIZED, "refused: peer runs as another user")
            return
        try:
            ident = ProcessIdentity.of(pid, uid) or ProcessIdentity(pid, uid, -1.0, "")
        except OSError as exc:
            # the accept took the last descriptor, and naming the process reads /proc: this raised
            # out of the accept callback (a traceback, the client left with no answer)
            _refuse(sock, rpc.LIMIT, "limit reached: the vault has no file descriptor left to serve "
                                     "this connection; try again later")
            self._out_of_files(exc)
            return
        entry = self.processes.get(ident)
        table = self.processes
        if entry.connections >= MAX_CONNECTIONS_PER_PROCESS:
            _refuse(sock, rpc.LIMIT, f"limit reached: this process already has {MAX_CONNECTIONS_PER_PROCESS} "
                                     "connections to the vault; close one first")
            self._report_flood(ident, table.tree_of(entry), entry.connections, "process")
            self.processes.release(entry)
            return
        cap = min(MAX_CONNECTIONS, table.max_connections)
        tree = table.tree_of(entry)
        held = table.trees.get(tree, 0)
        if held >= min(MAX_CONNECTIONS_PER_TREE, max(16, cap // 4)):
            # one client forking many processes must not take every slot from the others
            _refuse(sock, rpc.LIMIT, f"limit reached: this process and the others of its process tree "
                                     f"(process {tree[0]} and what it started) already hold {held} connections "
                                     "to the vault, the most one client may; close some first")
            warn_client("tree connections", "refused a connection on %s from process %d: its process tree "
                        "(process %d) holds %d connections", self.dispatcher.channel, pid, tree[0], held)
            self._report_flood(ident, tree, held, None)
            self.processes.release(entry)
            return
        if table.connections >= cap - min(self.leave_free, cap // 4):
            _refuse(sock, rpc.LIMIT, "limit reached: the vault serves as many connections as it can; "
                                     "try again later")
            warn_client("connections", "refused a connection on %s: %d connections open", self.dispatcher.channel,
                  table.connections)
            self.processes.release(entry)
            return
        table.connected(entry, 1)
        conn = Connection(new_id("k"), self.dispatcher.channel, ident, None, ident, entry=entry)
        conn.io = LineSocket(sock, self._uid, _PartialBudget(table, entry),
                             on_line=lambda line, writer: self._on_line(conn, line, writer),
                             on_close=lambda reason: self._closed(conn, entry, reason),
                             on_refused=_refusal, on_eof=lambda: self._finish_if_idle(conn))
        self.connections.add(conn)
        if self.dispatcher.on_connect:
            self._spawn(self.dispatcher.on_connect(conn))
        conn.io.start()

    def _closed(self, conn: Connection, entry: ProcessEntry, reason: str) -> None:
        conn.closed.set()
        self.connections.discard(conn)
        self.processes.connected(entry, -1)
        self.processes.release(entry)
        if reason.startswith(("it stopped reading", "limit")):
            who = f", approver {conn.state['approver']!r}" if conn.state.get("approver") else ""
            warn_client(reason[:24], "closed %s connection %s (process %d%s): %s", self.dispatcher.channel, conn.id,
                  conn.opener.pid, who, reason)
        if self.dispatcher.on_disconnect:
            self._spawn(self._disconnected(conn))

    async def _disconnected(self, conn: Connection) -> None:
        assert self.dispatcher.on_disconnect is not None
        try:
            await self.dispatcher.on_disconnect(conn)
        except Exception as exc:
            log.error("disconnect handler failed: %s", type(exc).__name__)

    # ---- frames ---------------------------------------------------------------------

    def _on_line(self, conn: Connection, line: bytes, writer: int) -> None:
        if not line.strip():
            return
        parsed = rpc.parse_frame(line)
        if isinstance(parsed, rpc.FrameError):
            conn.send(rpc.encode_error(parsed.id, parsed.code, parsed.message))
            if parsed.method is not None:
                caller = self._caller(conn, writer)
                view = conn.as_sent_by(caller) if isinstance(caller, ProcessIdentity) else conn
                self.dispatcher.refused(view, parsed.method, parsed.message, None)
            return
        caller = self._caller(conn, writer)
        if parsed.is_notification:
            # every method on both sockets answers: sent without an id, it would act unseen (a
            # session nobody can name, a call whose Result nobody reads)
            why = (f"invalid request: {parsed.method[:64]!r} was sent without an id (a notification), "
                   "but every method here answers; nothing was done: send it with an id")
            conn.send(rpc.encode_error(None, rpc.INVALID_REQUEST, why))
            self.dispatcher.refused(conn.as_sent_by(caller) if isinstance(caller, ProcessIdentity) else conn,
                                    parsed.method, why, parsed.params)
            return
        if isinstance(caller, str):
            self.dispatcher.refused(conn, parsed.method, caller, None)
            conn.send(rpc.encode_error(parsed.id, rpc.INVALID_REQUEST if writer == MIXED
                                       else rpc.NOT_AUTHORIZED, caller))
            return
        if conn.in_flight >= MAX_IN_FLIGHT:
            self._busy(conn, Busy("connection", MAX_IN_FLIGHT, f"too many requests in progress on this "
                                  f"connection (at most {MAX_IN_FLIGHT}); wait for an answer, then send again. "
                                  "Nothing was done"), parsed.id)
            return
        if conn.entry is not None:
            # the socket that leaves connections free for the other holds its requests to the total
            busy = self.processes.begin_request(conn.entry, in_all=self.leave_free > 0)
            if busy is not None:
                self._busy(conn, busy, parsed.id)
                return
        conn.in_flight += 1
        self._spawn(self._handle(conn, conn.as_sent_by(caller), parsed))

    def _report_flood(self, ident: ProcessIdentity, tree: tuple[int, float], held: int, where: str | None) -> None:
        if self.on_flood is not None:
            try:
                self.on_flood(ident, tree, held, where)
            except Exception as exc:
                log.error("flood handler failed: %s", type(exc).__name__)

    def _busy(self, conn: Connection, busy: Busy, rid: Any) -> None:
        """Refuse a request for the requests already in progress, and report it (sampled by the
        daemon's audit): a request flood holds the vault's capacity from every other client."""
        conn.send(rpc.encode_error(rid, rpc.LIMIT, busy.reason))
        if self.on_busy is None or conn.entry is None:
            return
        try:
            self.on_busy(conn.opener, self.processes.tree_of(conn.entry), busy)
        except Exception as exc:
            log.error("busy handler failed: %s", type(exc).__name__)

    def _caller(self, conn: Connection, writer: int) -> ProcessIdentity | str:
        """The process that wrote a line, or why it cannot act."""
        if writer == conn.opener.pid:
            return conn.opener
        if writer == MIXED:
            return ("invalid request: this line holds bytes written by more than one process; "
                    "each process must write whole lines")
        if writer == FOREIGN:
            return "refused: this line was written by a process of another user"
        if writer == UNKNOWN or writer < 0:
            return "refused: the kernel could not name the process that wrote this line"
        # another process writes on this connection (a child that inherited it): it is itself
        return ProcessIdentity.of(writer, self._uid) or ProcessIdentity(writer, self._uid, -1.0, "")

    async def _handle(self, conn: Connection, view: Connection, req: rpc.Request) -> None:
        try:
            conn.send(await self.dispatcher.dispatch(view, req))
        finally:
            conn.in_flight -= 1
            if conn.entry is not None:
                self.processes.end_request(conn.entry)
                if conn.closed.is_set():
                    self.processes.release(conn.entry)  # kept while its requests were in progress
            self._finish_if_idle(conn)

    @staticmethod
    def _finish_if_idle(conn: Connection) -> None:
        # a client that half-closed gets the answers to what it sent, then the connection ends
        if conn.in_flight == 0 and conn.io is not None and conn.io.eof:
            conn.io.close_when_drained("the client closed the connection")

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


_WARN_EVERY_S = 1.0
_warned: dict[str, tuple[float, int]] = {}  # kind -> (when last logged, how many not logged since)


def warn_client(kind: str, fmt: str, *args: Any) -> None:
    """A warning about a client, at most once a second per kind: a flood of refusals must not
    become a flood of log lines."""
    now = time.monotonic()
    last, quiet = _warned.get(kind, (0.0, 0))
    if now - last < _WARN_EVERY_S:
        _warned[kind] = (last, quiet + 1)
        return
    _warned[kind] = (now, 0)
    if quiet:
        fmt += f" (and {quiet} more like it in the last second)"
    log.warning(fmt, *args)


def _refusal(why: str) -> bytes:
    if why.startswith("limit"):
        return rpc.encode_error(None, rpc.LIMIT, why)
    return rpc.encode_error(None, rpc.INVALID_REQUEST, f"invalid request: {why}")


def _refuse(sock: socket.socket, code: int, message: str) -> None:
    with contextlib.suppress(OSError):
        sock.send(rpc.encode_error(None, code, message))
    sock.close()


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit toward `wanted` (at most the hard limit);
    return the soft limit now in force."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft
