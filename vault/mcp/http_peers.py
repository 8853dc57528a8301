"""Connections to `vaultsim mcp --http`, capped per peer process when they are accepted.

The header deadline (vault.mcp.http_deadline) closes an idle connection after 10 s, but one
process that keeps reconnecting still held as many of the bridge's descriptors as it liked
(about 20,000), and a host connecting then waited in the kernel's backlog. Here each new
connection is not read until the process holding its other end is known (one scan of the
system's sockets names every connection waiting then); a process already holding its share
is answered 429 and the connection closed, so the rest stay for other processes. A peer
whose process cannot be seen is not counted; if the kernel's TCP table says another user owns
its socket, it is answered 403 and closed at once (the guard refuses every request of another
user anyway; left open, such connections took every descriptor of a bridge not run as root,
which cannot see other users' processes). Otherwise (not Linux) the guard answers each of its
requests as before.

While a batch that large waits to be named, nothing more is accepted (the kernel's queue
holds the rest): a process reconnecting faster than a scan made them pile up, each holding a
descriptor, to the open-file limit; every accept then failed, and asyncio stopped accepting
for a second each time (a well-behaved host's request took 7 s).
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401  (run_in_executor imports it lazily: not once out of files)
import contextlib
import json
import os
import socket
from typing import Any

from vault.mcp.http_deadline import DeadlinedH11
from vault.mcp.loopback import Addr, client_key, client_pids, client_uids

# A host holding its whole share of MCP sessions (63) keeps a GET stream and a request or two
# open on each: four connections a session. Lowered to a quarter of the open-file limit.
MAX_HTTP_CONNECTIONS_PER_PROCESS = 256
# descriptors kept free for naming peers once a flood has taken every other one
RESERVE_FDS = 8


def refusal(pid: int, cap: int) -> bytes:
    return _response(b"429 Too Many Requests", -32004,
                     f"refused: process {pid} already holds {cap} connections to this bridge, its share "
                     "(the rest are kept for other processes); close one before opening another")


# the answer to another user, at accept here and per request in the guard (vault.mcp.http)
OTHER_USER = ("refused: the caller runs as another user; this bridge serves only its "
                               "own user's processes")


def _response(status: bytes, code: int, message: str) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


class PeerConnections:
    """Open connections per peer process, and the connections waiting to be named."""

    def __init__(self, cap: int) -> None:
        self.cap, self.uid = cap, os.getuid()
        self.open: dict[int, int] = {}  # pid -> connections it holds
        self.waiting: list[CappedH11] = []
        self._scanning = False
        self._reserve = self._hold(RESERVE_FDS)
        self.listener: socket.socket | None = None  # set by the bridge: accepting pauses on it
        self._paused: tuple[Any, tuple[Any, ...]] | None = None  # the listener's accept, while paused

    @staticmethod
    def _hold(n: int) -> list[int]:
        held = []
        with contextlib.suppress(OSError):
            for _ in range(n):
                held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        return held

    async def _scan_in_reserve(self, server: Addr) -> dict[Addr, int | None]:
        """The scan again, on descriptors kept for it: a flood that uses up the open-file limit
        made it fail (or miss the flood's own process), and every connection went uncounted.
        Nothing is accepted meanwhile, so no accept takes the freed descriptors; in a thread,
        so the loop serves on (it ran in the loop's thread, which stalled every host for the
        scan). A peer it still cannot name is not ours to see."""
        self._pause()
        for fd in self._reserve:
            os.close(fd)
        try:
            return await asyncio.get_running_loop().run_in_executor(None, client_pids, server) or {}
        except OSError:
            return {}
        finally:
            self._reserve = self._hold(RESERVE_FDS)

    def enter(self, proto: "CappedH11") -> None:
        self.waiting.append(proto)
        if len(self.waiting) >= self.cap:
            self._pause()
        self._scan()

    def _pause(self) -> None:
        """Stop accepting (the listener's reader is taken off the loop and kept to put back).
        asyncio has no public pause for a server; where its internals differ, nothing pauses."""
        if self._paused is not None or self.listener is None or self.listener.fileno() < 0:
            return
        loop = asyncio.get_running_loop()
        with contextlib.suppress(AttributeError, KeyError, ValueError):
            handle = getattr(loop, "_selector").get_key(self.listener.fileno()).data[0]
            callback, args = getattr(handle, "_callback", None), getattr(handle, "_args", None)
            if callable(callback) and isinstance(args, tuple):
                self._paused = callback, args  # kept first: removing the reader empties its handle
                loop.remove_reader(self.listener.fileno())

    def _resume(self) -> None:
        accept, self._paused = self._paused, None
        if accept is None or self.listener is None or self.listener.fileno() < 0:
            return  # closed meanwhile: the bridge is shutting down
        asyncio.get_running_loop().add_reader(self.listener.fileno(), accept[0], *accept[1])

    def _scan(self) -> None:
        if not self._scanning and self.waiting:
            self._scanning = True
            asyncio.ensure_future(self._name_waiting())

    def leave(self, pid: int) -> None:
        left = self.open.get(pid, 0) - 1
        if left > 0:
            self.open[pid] = left
        else:
            self.open.pop(pid, None)

    async def _name_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                # all of a batch's connections face one listening address
                server: Addr = batch[0].server_addr
                try:
                    pids = await loop.run_in_executor(None, client_pids, server)
                except OSError:  # no descriptor even to start the executor's thread
                    pids = None
                if pids is None or (any(pids.get(client_key(p.client_addr)) is None for p in batch)
                                    and _out_of_files()):
                    pids = await self._scan_in_reserve(server)
                uids: dict[Addr, int] = {}
                if any(pids.get(client_key(p.client_addr)) is None for p in batch):
                    with contextlib.suppress(OSError):
                        uids = await loop.run_in_executor(None, client_uids, server)
                for proto in batch:  # in the order they were accepted
                    if proto.gone:
                        continue
                    pid = pids.get(client_key(proto.client_addr))
                    uid = uids.get(client_key(proto.client_addr)) if pid is None else None
                    if uid is not None and uid != self.uid:
                        proto.refuse(_response(b"403 Forbidden", -32001, OTHER_USER))
                        continue
                    if pid is not None and self.open.get(pid, 0) >= self.cap:
                        proto.refuse(refusal(pid, self.cap))
                        continue
                    if pid is not None:
                        self.open[pid] = self.open.get(pid, 0) + 1
                    proto.admit(pid)
                if len(self.waiting) < self.cap:
                    self._resume()
        finally:
            self._scanning = False
            self._resume()
            self._scan()  # after an error, those waiting are still named, never left paused


def _out_of_files() -> bool:
    # a peer left unnamed is another user's (not ours to see), unless the scan ran out of files
    try:
        os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        return True
    return False


class CappedH11(DeadlinedH11):
    """DeadlinedH11 reading nothing until its peer process is known to be within its share."""

    peers: PeerConnections  # set on the subclass `capped_protocol` makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.gone = False
        self.counted: int | None = None  # the pid this connection is counted to
        self.client_addr: Addr = tuple(transport.get_extra_info("peername") or ("", 0))[:2]
        self.server_addr: Addr = tuple(transport.get_extra_info("sockname") or ("", 0))[:2]
        transport.pause_reading()
        self.peers.enter(self)

    def admit(self, pid: int | None) -> None:
        self.counted = pid
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def refuse(self, answer: bytes) -> None:
        # what it sent already is read and dropped: closed unread, it would be reset and the
        # answer lost. Closed now, not later: the descriptor is what this refusal keeps free
        sock = self.transport.get_extra_info("socket")
        with contextlib.suppress(OSError):
            for _ in range(16):  # bounded: a peer writing without pause is not read for ever
                if sock is None or not os.read(sock.fileno(), 65536):
                    break
        self.transport.write(answer)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        if self.counted is not None:
            self.peers.leave(self.counted)
            self.counted = None
        super().connection_lost(exc)


def capped_protocol(cap: int) -> type[CappedH11]:
    """A CappedH11 class sharing one count (uvicorn makes one protocol per connection from a class)."""
    return type("CappedH11", (CappedH11,), {"peers": PeerConnections(cap)})
