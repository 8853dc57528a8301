"""Clients for the two sockets: the only way `tui`, `agent_stub` and the CLI talk to the daemon.

`RpcClient` is a small blocking client (agents, CLI). `AsyncRpcClient` keeps a
reader task that routes responses by id and hands notifications to a callback
(approvers: TUI, scripted approver). Both raise `RpcError` for error answers.

Answers that list things come in pages (`next` names the following one);
`ApproverClient.all_pages`, `fetch_all` and `connect_approver` read every
page, so their callers see one whole answer as before.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import socket
from typing import Any, Awaitable, Callable, Self

from vault import jsonrpc as rpc
from vault import regular
from vault.errors import BadInput, HomeError, RpcError
from vault.home import VaultHome
from vault.models import Result
# re-exported: the TUI reaches the core only through the client (tests/test_tui_boundary.py)
from vault.silence import SilenceWatch as SilenceWatch, answer_within
from vault.unix_connect import connect_unix
from vault.wire import ApprovalSettled, WireError, read


ASYNC_CONNECT_TIMEOUT_S = 30.0  # how long an approver waits for room in a stormed accept queue
_READ_CHUNK = 65536


class DaemonSilent(HomeError):
    """The daemon did not answer a request within its time: stopped, stuck, or mid-line. Whether it
    was done is unknown."""


def _frame(rid: int, method: str, params: dict[str, Any]) -> bytes:
    """The request's line, refused before a byte is sent when it is over the wire's limit: the
    daemon would drop the connection, and with it the session, its grants and its pending
    approvals, and the caller could not tell whether anything had been done."""
    data = rpc.encode_request(rid, method, params)
    if len(data) > rpc.MAX_FRAME:
        raise RpcError(rpc.INVALID_PARAMS, f"{method}: the request is {len(data)} bytes, over the wire's limit "
                                           f"of {rpc.MAX_FRAME} bytes a line")
    return data


def _raise_error(err: dict[str, Any]) -> None:
    raise RpcError(int(err.get("code", rpc.INTERNAL_ERROR)), str(err.get("message", "error")),
                   err.get("data"))


def _connection_error(msg: dict[str, Any]) -> dict[str, Any] | None:
    """An error with a null id: about the connection, not one request (e.g. a limit the daemon
    refused it for before closing it). Our frames are valid, so it is never about one of them."""
    err = msg.get("error")
    return err if msg.get("id") is None and isinstance(err, dict) else None


def _closed(refusal: dict[str, Any] | None) -> Exception:
    """What to raise when the daemon closed the connection: why it did, if it said so."""
    if refusal is not None:
        return RpcError(int(refusal.get("code", rpc.INTERNAL_ERROR)), str(refusal.get("message", "error")),
                        refusal.get("data"))
    return HomeError("the daemon closed the connection")


def _unreachable(path: str | os.PathLike[str], exc: OSError) -> HomeError:
    """No daemon at `path`: gone or never started, or a path that cannot hold a socket (a file in
    it, no permission, too long), said with its reason; never a traceback for a user's home."""
    if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
        return HomeError(f"no vaultsim daemon answers on {path}")
    return HomeError(f"no vaultsim daemon answers on {path} ({exc.strerror or exc})")


class RpcClient:
    def __init__(self, path: str | os.PathLike[str], timeout: float | None = None) -> None:
        self.path = str(path)
        try:
            self.sock = connect_unix(self.path, timeout)
        except OSError as exc:
            raise _unreachable(self.path, exc) from None
        # buffered reads: an unbuffered socket file reads a line one byte per recv()
        self.file = self.sock.makefile("rb")
        self._ids = itertools.count(1)

    def request(self, method: str, **params: Any) -> Any:
        return self.request_within(self.sock.gettimeout(), method, **params)

    def request_within(self, within_s: float | None, method: str, /, **params: Any) -> Any:
        """`request`, answered within `within_s` seconds (None: unbounded) or raising DaemonSilent for
        an agent's client (vault.silence), TimeoutError for the CLI's (ApproverClient says it). A
        blocking socket read that timed out leaves its buffered reader unusable, so the connection is
        closed then: the daemon stopped or stuck, a later request opens a new one."""
        rid = next(self._ids)
        refusal = None
        frame = _frame(rid, method, params)  # too long: refused here, the connection kept
        self.sock.settimeout(within_s)
        try:
            self.sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon closed the connection: what it said before closing is read below
        except TimeoutError:
            self._silent(method, within_s)
        while True:
            try:
                line = self.file.readline(rpc.MAX_FRAME + 1)
            except ConnectionResetError:
                line = b""
            except TimeoutError:
                self._silent(method, within_s)
            if not line:
                raise _closed(refusal)
            msg = json.loads(line)
            if msg.get("id") != rid:
                refusal = _connection_error(msg) or refusal
                continue  # a notification, or the daemon's word on the connection
            if "error" in msg:
                _raise_error(msg["error"])
            return msg.get("result")

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()

    def _silent(self, method: str, within_s: float | None) -> None:
        raise TimeoutError(f"{method} not answered within {within_s}s")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AgentClient(RpcClient):
    """What an agent uses: a session, calls, resume, lookup."""

    def __init__(self, path: str | os.PathLike[str], timeout: float | None = None, *,
                 until: float | None = None) -> None:
        super().__init__(path, timeout)
        self.session_id: str | None = None
        self.timeout = timeout  # the caller's own bound on every request (TimeoutError), if it gave one
        self.until = until  # the task's deadline (epoch seconds): no request waits much past it

    def request(self, method: str, **params: Any) -> Any:
        # a stopped or stuck daemon must not hang the agent for ever: without a bound of the
        # caller's, each request gets its own time and a margin (vault.silence), and never much
        # past the task's deadline
        within = self.timeout if self.timeout is not None else \
            answer_within(method, params.get("wait_s"), self.until)
        return self.request_within(within, method, **params)

    def _silent(self, method: str, within_s: float | None) -> None:
        self.close()
        if self.timeout is not None:
            raise TimeoutError(f"{method} not answered within {within_s}s")
        raise DaemonSilent(f"the vaultsim daemon did not answer {method} within {within_s or 0:.1f}s "
                           "(stopped, or stuck); whether it was done is unknown")

    def open_session(self, agent: str, run_id: str | None = None) -> str:
        params: dict[str, Any] = {"agent": agent}
        if run_id:
            params["run_id"] = run_id
        self.session_id = self.request("session.open", **params)["session_id"]
        return self.session_id

    def call(self, operation: str, params: dict[str, Any] | None = None, *,
             idempotency_key: str | None = None, wait_s: float | None = None) -> Result:
        args: dict[str, Any] = {"session_id": self.session_id, "operation": operation,
                                "params": params or {}}
        if idempotency_key:
            args["idempotency_key"] = idempotency_key
        if wait_s is not None:
            args["wait_s"] = wait_s
        return Result.model_validate(self.request("call", **args))

    def resume(self, resume_token: str, wait_s: float | None = None) -> Result:
        args: dict[str, Any] = {"session_id": self.session_id, "resume_token": resume_token}
        if wait_s is not None:
            args["wait_s"] = wait_s
        return Result.model_validate(self.request("call.resume", **args))

    def lookup(self, *, correlation_id: str | None = None, idempotency_key: str | None = None,
               operation: str | None = None) -> Result:
        args: dict[str, Any] = {"session_id": self.session_id}
        for k, v in (("correlation_id", correlation_id), ("idempotency_key", idempotency_key),
                     ("operation", operation)):
            if v:
                args[k] = v
        return Result.model_validate(self.request("lookup", **args))

    def close_session(self) -> None:
        if self.session_id:
            self.request("session.close", session_id=self.session_id)
            self.session_id = None


def read_approver_token(home: VaultHome) -> str:
    """The home's approver token, read as the daemon wrote it: a regular file (not a link to
    one), at most _TOKEN_READ bytes, holding one token. Anything else is bad input (BadInput,
    exit 2) said at once; a missing file means no daemon was set up there (HomeError, exit 1)."""
    path = home.approver_token_file
    remake = "remove it and restart the daemon (it makes a new one)"
    too_long = (f"{path} does not hold an approver token (over {TOKEN_MAX} characters, not what the daemon "
                f"writes); {remake}")
    try:
        # no link followed, no FIFO waited on: `vaultsim lock` waited forever on a FIFO put there
        data = regular.read_bytes(path, _TOKEN_READ, follow=False)
    except FileNotFoundError:
        raise HomeError(f"no approver token in {home.root}; is a daemon set up there?") from None
    except regular.NotRegular as exc:
        raise BadInput(f"{path} is not a regular file ({exc.kind}), so it holds no approver token; {remake}") from None
    except regular.TooLarge:
        raise BadInput(too_long) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{path} is a symbolic link, not the approver token the daemon wrote; {remake}") from None
        raise HomeError(f"cannot read the approver token {path}: {exc.strerror}") from None
    value = data.decode("utf-8", "replace").strip()
    if len(value) > TOKEN_MAX:
        # a short or wrong one goes to the daemon, whose refusal says "wrong approver token"
        raise BadInput(too_long)
    return value


_TOKEN_READ = 4096  # a token is 43 characters; more is not a token the daemon wrote
TOKEN_MAX = 512  # what approver.hello accepts


class ApproverClient(RpcClient):
    """Blocking approver client for one-shot commands (lock, unlock, stats, stop)."""

    @classmethod
    def for_home(cls, home: VaultHome, name: str = "cli", timeout: float | None = 30) -> "ApproverClient":
        client = cls(home.approver_sock, timeout)
        try:
            client.request("approver.hello", token=read_approver_token(home), name=name)
        except Exception:
            client.close()
            raise
        return client

    def request(self, method: str, **params: Any) -> Any:
        try:
            return super().request(method, **params)
        except TimeoutError:  # a daemon stopped (SIGSTOP) or stuck: said, not a bug's traceback
            raise HomeError(f"the vaultsim daemon on {self.path} did not answer {method} within "
                            f"{self.sock.gettimeout() or 0:g}s (stopped, or stuck); whether it was done is "
                            "unknown: see `vaultsim status`") from None

    def all_pages(self, method: str, **params: Any) -> dict[str, Any]:
        """`sessions`, `stats` or `pending` with every page merged into one answer."""
        answer: dict[str, Any] = self.request(method, **params)  # a paged method answers an object
        while isinstance(answer, dict) and answer.get("next"):
            merge_page(answer, self.request(method, **{**params, "after": answer["next"]}))
        if isinstance(answer, dict):
            answer.pop("next", None)
        return answer


def merge_page(into: dict[str, Any], page: dict[str, Any]) -> None:
    """Fold a following page into the first one: lists extend, tables update."""
    for key, value in page.items():
        if isinstance(value, list) and isinstance(into.get(key), list):
            into[key].extend(value)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key].update(value)
    into["next"] = page.get("next")


Notify = Callable[[str, dict[str, Any]], Awaitable[None] | None]


class AsyncRpcClient:
    """Async client with a reader task: responses by id, notifications to `on_notify`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_notify: Notify | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.on_notify = on_notify
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._refusal: dict[str, Any] | None = None  # why the daemon closed the connection, if it said
        self.closed = asyncio.Event()
        self.partial = False  # the daemon has begun a line and not ended it
        self._cut = False  # a request was given up while the daemon was half-way through a line
        # a person's client: told when a request waits unanswered, and when answers come again
        self.watch: SilenceWatch | None = None
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], on_notify: Notify | None = None) -> "AsyncRpcClient":
        try:
            # asyncio takes a full accept queue's EAGAIN for "connecting" and then for connected
            sock = await asyncio.to_thread(connect_unix, str(path), ASYNC_CONNECT_TIMEOUT_S)
            sock.setblocking(False)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=rpc.MAX_FRAME + 1)
        except OSError as exc:
            raise _unreachable(path, exc) from None
        return cls(reader, writer, on_notify)

    async def _read(self) -> None:
        # lines are split here rather than by readline, so that a line the daemon began and did not
        # end (stopped, or stuck, mid-answer) is known: `request_within` closes such a connection
        buf = bytearray()
        try:
            while True:
                chunk = await self.reader.read(_READ_CHUNK)
                if not chunk:
                    if buf:  # a last line without its newline: read as before, or refused
                        await self._line(bytes(buf))
                    break
                buf += chunk
                start = 0
                while (end := buf.find(b"\n", start)) >= 0:
                    await self._line(bytes(buf[start:end + 1]))
                    start = end + 1
                del buf[:start]
                if len(buf) > rpc.MAX_FRAME:
                    break  # over the wire's limit: the connection is unusable
                self.partial = bool(buf)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            self.closed.set()
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(_closed(self._refusal))
            self._waiting.clear()

    async def _line(self, line: bytes) -> None:
        msg = json.loads(line)
        if "method" in msg and "id" not in msg:
            if self.on_notify is not None:
                res = self.on_notify(msg["method"], msg.get("params") or {})
                if asyncio.iscoroutine(res):
                    await res
            return
        self._refusal = _connection_error(msg) or self._refusal
        fut = self._waiting.pop(msg.get("id"), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def request(self, method: str, **params: Any) -> Any:
        return await self.request_within(None, method, **params)

    async def request_within(self, within_s: float | None, method: str, /, **params: Any) -> Any:
        """`request`, answered within `within_s` seconds or raising DaemonSilent. A daemon that is
        stopped (SIGSTOP) or stuck answers nothing, and an unbounded wait hung the caller (an MCP
        host's tool call) for ever. The connection is kept, so a daemon that answers again serves
        its next request on the same session; also one that stopped half-way through a line and
        then ends it (`unusable`): a session ends with its connection, and with it its grants, while
        the process it was given to (an MCP bridge) lives on."""
        if self.unusable():
            if not self.closed.is_set():
                self.writer.close()
            raise _closed(self._refusal)
        rid = next(self._ids)
        line = _frame(rid, method, params)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            async with asyncio.timeout(within_s):
                self.writer.write(line)
                msg = await self._answer(method, fut)
        except TimeoutError:
            self._cut = self._cut or self.partial
            raise DaemonSilent(f"the vaultsim daemon did not answer {method} within {within_s:g}s "
                               "(stopped, or stuck)") from None
        finally:
            self._waiting.pop(rid, None)  # no future is left behind by a request given up
        if "error" in msg:
            _raise_error(msg["error"])
        return msg.get("result")

    def unusable(self) -> bool:
        """Closed, or cut: a request was given up while the daemon was half-way through a line and
        that line has still not ended, so nothing after it on the connection can be read. A daemon
        that resumed ends the line (its answer to the request given up, dropped), and the connection
        serves on."""
        if self._cut and not self.partial:
            self._cut = False
        return self.closed.is_set() or self._cut

    async def _drained_answer(self, fut: asyncio.Future[Any]) -> Any:
        await self.writer.drain()  # a stopped daemon stops reading too
        return await fut

    async def _answer(self, method: str, fut: asyncio.Future[Any]) -> Any:
        """The answer to the request just written. With a `watch` (an approver, the TUI) the daemon's
        silence is said once the request has waited `watch.after_s`, and its return when the answer
        comes; the request is still waited for (vault.silence)."""
        if self.watch is None:
            return await self._drained_answer(fut)
        work = asyncio.ensure_future(self._drained_answer(fut))
        try:
            done, _ = await asyncio.wait({work}, timeout=self.watch.after_s)
            if not done:
                self.watch.waited(method)
            msg = await work
        finally:
            work.cancel()  # given up by the caller: nothing left waiting (a no-op once it is done)
        self.watch.answered()
        return msg

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()


async def fetch_all(client: AsyncRpcClient, method: str, **params: Any) -> dict[str, Any]:
    """An async request whose answer comes in pages, every page merged."""
    answer: dict[str, Any] = await client.request(method, **params)  # a paged method answers an object
    while isinstance(answer, dict) and answer.get("next"):
        merge_page(answer, await client.request(method, **{**params, "after": answer["next"]}))
    if isinstance(answer, dict):
        answer.pop("next", None)
    return answer


async def connect_approver(home: VaultHome, name: str, on_notify: Notify | None = None,
                           subscribe: bool = True, watch: SilenceWatch | None = None
                           ) -> tuple[AsyncRpcClient, dict[str, Any]]:
    """Connect, say hello with the home's token, optionally subscribe. Returns (client, subscribe
    answer), the answer holding every pending prompt of the snapshot (all its pages). `watch`: told
    when the daemon keeps a request waiting, the hello's too (vault.silence)."""
    settled: set[str] = set()

    def watching(method: str, params: dict[str, Any]) -> Awaitable[None] | None:
        # a prompt settled while later pages were read must not come back from an earlier page
        if method == "approval.settled":
            try:
                settled.add(read(ApprovalSettled, params, "approval.settled").request_id)
            except WireError:
                pass  # which prompt it settled is unknown: the reader is told (on_notify) and decides
        return on_notify(method, params) if on_notify is not None else None

    client = await AsyncRpcClient.connect(home.approver_sock, watching if subscribe else on_notify)
    client.watch = watch
    try:
        await client.request("approver.hello", token=read_approver_token(home), name=name)
        answer = await client.request("subscribe") if subscribe else {}
        while answer.get("next"):
            more = await client.request("pending", after=answer["next"], until=answer.get("until"))
            merge_page(answer, more)
    except Exception:
        await client.close()
        raise
    if subscribe:
        client.on_notify = on_notify
        answer["pending"] = [p for p in answer.get("pending", [])
                             if str(p.get("request_id")) not in settled]
    return client, answer
