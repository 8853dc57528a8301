"""The fake remote's HTTP/1.1 server: asyncio streams + h11, bytes under our control.

A framework would hide exactly what the faults need: answering half a body,
holding a response after the commit, never reading a request body. h11 does
the HTTP parsing and serialising (we never hand-parse HTTP); this module
decides when each piece of bytes is read or written.

Every stall (a fault's `delay`) ends at the first of: the delay, the client
closing the connection (seen as EOF on the socket we keep reading), the
`release()` call (`POST /_sim/release`) or `stop()`. After a faulted exchange
the connection is closed.

`/_sim/` needs the server's `sim_token` (header `X-Sim-Token`); a request
without it is refused and recorded (`sim_refused`). With `vouch` set (the
runner sets it), every request is checked for the vault's mark and its
connection's owner (vault.remote.vouch) and `received` says `via`. With
`capture` on, every request's bytes but the vault's own Authorization and
mark are kept in memory (`captured()`), for the runner's leak scan.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import secrets
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11

from vault.remote import sim
from vault.remote.client_side import ClientSideTarget
from vault.remote.faults import FaultSpec
from vault.remote.ledger import EffectLedger, EventLog
from vault.remote.service import Exchange, RemoteService, Reply
from vault.remote.state import Store
from vault.remote.vouch import SPAWN_WAIT_S, Accepted, Vouch
from vault.text import printable

MAX_BODY = 1 << 20
MAX_CAPTURE = 16 << 20  # bytes of requests kept for the leak scan, per server
_READ = 65536
SIM_TOKEN_HEADER = b"x-sim-token"
_NOT_CAPTURED = frozenset({b"authorization", b"x-vaultsim-via"})


class RemoteServer:
    def __init__(self, credentials: dict[str, str], fault: FaultSpec | None = None,
                 events_path: Path | None = None, sim_token: str | None = None) -> None:
        self.sim_token = sim_token or secrets.token_urlsafe(24)
        self.vouch: Vouch | None = None
        self.capture = False
        self._captured: list[bytes] = []
        self._captured_bytes = 0
        self._capture_lock = threading.Lock()
        self.events = EventLog(events_path)
        self.service = RemoteService(credentials, fault, self.events)
        self.fault = fault
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._release: asyncio.Event | None = None
        self._conns: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._target: ClientSideTarget | None = None

    # --- public ------------------------------------------------------------

    @property
    def ledger(self) -> EffectLedger:
        return self.service.ledger

    @property
    def store(self) -> Store:
        return self.service.store

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def service_url(self) -> str:
        """The URL the vault should use: a failing one under a client-side fault."""
        return self._target.url if self._target else self.url

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._release = asyncio.Event()
        self._server = await asyncio.start_server(self._on_connection, host, port)
        self.host = host
        self.port = self._server.sockets[0].getsockname()[1]
        self.set_fault(self.fault)
        return self.port

    def set_fault(self, spec: FaultSpec | None) -> None:
        if self._target is not None:
            self._target.close()
            self._target = None
        self.fault = spec
        self.service.set_fault(spec)
        if spec is not None and spec.client_side:
            self._target = ClientSideTarget(spec.name, self.host)

    def captured(self) -> list[bytes]:
        """Every request as it arrived, minus the vault's Authorization and mark (see `capture`)."""
        with self._capture_lock:
            return list(self._captured)

    def _capture(self, req: h11.Request, body: bytes | None, via: bool | None) -> None:
        if not self.capture:
            return
        # the vault's own Authorization is how it must present the credential; anyone else's is
        # evidence (and scanned)
        drop = _NOT_CAPTURED if via is not False else frozenset({b"x-vaultsim-via"})
        head = b"\n".join(k + b": " + v for k, v in req.headers if k.lower() not in drop)
        data = req.method + b" " + req.target + b"\n" + head + b"\n\n" + (body or b"")
        with self._capture_lock:
            if self._captured_bytes + len(data) <= MAX_CAPTURE:
                self._captured.append(data)
                self._captured_bytes += len(data)

    def release(self) -> None:
        """End every stall in progress; later stalls stall again."""
        if self._release is not None:
            self._release.set()
            self._release = asyncio.Event()

    async def stop(self) -> None:
        release = self._release
        self._release = None
        if release is not None:
            release.set()
        if self._server is not None:
            self._server.close()
        tasks = list(self._conns)
        if tasks:
            # released stalls finish on their own; idle keep-alive ones need EOF
            await asyncio.wait(tasks, timeout=0.5)
            for writer in list(self._conns.values()):
                writer.close()
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        self.set_fault(None)
        self.events.close()

    # --- connections -------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        conn = h11.Connection(h11.SERVER)
        owner: list[bool | None] = []  # who holds the client end: judged once per connection
        try:
            # read now, at the accept, before the first byte: a holder gone by its request is told all the same
            seen = self.vouch.accepted(writer.get_extra_info("peername"), self.port) if self.vouch is not None else None
            while True:
                event = await _next_event(conn, reader)
                if not isinstance(event, h11.Request):
                    break
                if self.vouch is not None and seen is not None and not owner:
                    owner.append(seen.owner)
                    stranger = await self._stranger(seen) if seen.owner is False else None
                    if stranger is not None:  # another run's or trial's process: not this trial's to grade
                        self.events.emit("foreign_refused", pid=stranger[0], command=printable(stranger[1])[:120],
                                         method=event.method.decode("ascii", "replace")[:8],
                                         whose="this run" if stranger[2] else "another run")
                        await self._write(conn, writer, None, Reply(
                            403, json.dumps({"error": "foreign", "message": "this remote serves one trial's vault; "
                                             "the calling process is not part of it"}).encode(),
                            [("Content-Type", "application/json")]))
                        break
                if not await self._exchange(conn, reader, writer, event, owner[0] if owner else None):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except h11.RemoteProtocolError:
            await _write_quietly(writer, _bad_request(conn))
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.pop(task, None)
            writer.close()

    async def _stranger(self, seen: Accepted) -> tuple[int, str, bool] | None:
        """vouch.judge once no agent of the trial is being started (its pid is not known until then:
        a request of its own would look foreign), waiting up to SPAWN_WAIT_S for that where a holder
        runs below this runner (vouch.unsettled)."""
        assert self.vouch is not None
        until = asyncio.get_running_loop().time() + SPAWN_WAIT_S
        while self.vouch.spawning and self.vouch.unsettled(seen) and asyncio.get_running_loop().time() < until:
            await asyncio.sleep(0.01)  # the runner's loop starts it; no event of this loop's says when
        return self.vouch.judge(seen)

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, req: h11.Request, owner: bool | None = None) -> bool:
        """One request/response; False when the connection must close."""
        method, target = req.method.decode("ascii", "replace"), req.target
        via = None
        if self.vouch is not None:
            via = self.vouch.check_mark(list(req.headers)) and owner is not False
        # the harness's control plane answers its literal prefix only; every other path is
        # resolved the way a real server would (api.resolve_path) and logged as routed, so a
        # request steered into /_sim/ by `..` shows up as an unrouted request, not a reset
        if target.startswith(b"/_sim/"):
            body = await _read_body(conn, reader)
            self._capture(req, body, via)
            parts = urlsplit(target.decode("latin-1"))
            if not self._sim_allowed(req):
                self.events.emit("sim_refused", method=method, path=parts.path[:100], via=via)
                status, payload = 401, {"error": "unauthenticated", "message": "the control API needs the "
                                        "runner's token (X-Sim-Token)", "done": False}
            else:
                status, payload = sim.handle(self, method, parts.path, dict(parse_qsl(parts.query)), body or b"")
            return await self._write(conn, writer, None, Reply(status, json.dumps(payload).encode(),
                                                               [("Content-Type", "application/json")]))
        ex = self.service.begin(method, target, list(req.headers), via)
        if ex.fault is not None and ex.fault.name == "timeout_after_headers":
            self._capture(req, None, via)
            self.events.emit("request_body_stalled", **ex.ids())
            how = await self._stall(reader, ex.fault.params["delay"])
            self.service.finish(ex, "connection_closed", reason=f"body never read; {how}")
            return False
        body = await _read_body(conn, reader)
        self._capture(req, body, via)
        if body is None:
            self.service.finish(ex, "connection_closed", reason="request incomplete or too large")
            return False
        return await self._write(conn, writer, ex, self.service.respond(ex, body), reader)

    def _sim_allowed(self, req: h11.Request) -> bool:
        presented = next((v for k, v in req.headers if k.lower() == SIM_TOKEN_HEADER), b"")
        return hmac.compare_digest(presented.strip(), self.sim_token.encode())

    async def _write(self, conn: h11.Connection, writer: asyncio.StreamWriter, ex: Exchange | None,
                     reply: Reply, reader: asyncio.StreamReader | None = None) -> bool:
        def finish(outcome: str, status: int | None = None, reason: str | None = None) -> None:
            if ex is not None:  # a /_sim reply belongs to no exchange
                self.service.finish(ex, outcome, status=status, reason=reason)

        if reply.mode in ("stall", "delay"):
            how = await self._stall(reader, reply.delay)  # type: ignore[arg-type]
            if reply.mode == "stall" or how == "client_gone":
                finish("connection_closed", reason=f"no response sent; {how}")
                return False
        headers = [*reply.headers, ("Content-Length", str(len(reply.body)))]
        if ex is not None and ex.correlation_id:
            # echoed, as real APIs do: a client tells its own answer from one left on the connection
            headers.append(("X-Correlation-Id", ex.correlation_id))
        if reply.mode != "normal":
            headers.append(("Connection", "close"))
        try:
            data = conn.send(h11.Response(status_code=reply.status, headers=headers))
            if reply.mode == "partial":
                writer.write(data + conn.send(h11.Data(data=reply.body[: len(reply.body) // 2])))
                await writer.drain()
                how = await self._stall(reader, reply.delay)  # type: ignore[arg-type]
                finish("connection_closed", status=reply.status, reason=f"half the body sent; {how}")
                return False
            writer.write(data + conn.send(h11.Data(data=reply.body)) + conn.send(h11.EndOfMessage()))
            await writer.drain()
        except (ConnectionError, OSError):
            finish("connection_closed", status=reply.status, reason="client gone while writing")
            return False
        finish("response_sent", status=reply.status)
        return reply.mode == "normal"

    async def _stall(self, reader: asyncio.StreamReader, delay: float) -> str:
        """Wait out a fault: "timed_out", "client_gone" or "released"."""
        release = self._release
        if release is None:
            return "released"
        waiters = {asyncio.ensure_future(release.wait()): "released",
                   asyncio.ensure_future(_until_eof(reader)): "client_gone"}
        try:
            done, _ = await asyncio.wait(waiters, timeout=None if math.isinf(delay) else delay,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if not done:
            return "timed_out"
        return "client_gone" if any(waiters[w] == "client_gone" for w in done) else "released"


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(_READ))


async def _read_body(conn: h11.Connection, reader: asyncio.StreamReader) -> bytes | None:
    """The request body, or None if the client left or it exceeds MAX_BODY."""
    body = bytearray()
    while True:
        event = await _next_event(conn, reader)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                return None
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        else:
            return None


async def _until_eof(reader: asyncio.StreamReader) -> None:
    # discards what arrives: a stalled server is not processing it
    try:
        while await reader.read(_READ):
            pass
    except (ConnectionError, OSError):
        pass


def _bad_request(conn: h11.Connection) -> bytes:
    body = json.dumps({"error": "bad_request", "message": "malformed HTTP", "done": False}).encode()
    try:
        return (conn.send(h11.Response(status_code=400, headers=[
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
            ("Connection", "close")])) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
    except h11.LocalProtocolError:
        return b""


async def _write_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not data:
        return
    try:
        writer.write(data)
        await writer.drain()
    except (ConnectionError, OSError):
        pass
