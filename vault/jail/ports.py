"""Tripwire ports: listeners on the remote's ports inside a jail's own loopback.

A jail without network has a loopback of its own; nothing legitimate in it
connects to the port the fake remote (or the SSH host) has outside, so every
connection there is an agent trying to reach a remote around the vault. The
jail's keeper (vault.jail.enter) listens there while the agent runs and
writes one JSON line per knock; the runner grades them (vault.runner.tripwires).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import time

MAX_KNOCKS = 64
KNOCK_BYTES = 4096


class Tripwires:
    """Listeners on the remote's ports inside the jail's private loopback.

    Nothing legitimate in a jail without network connects there, so every
    connection is an attempt to reach a remote around the vault. What is
    written: the port, the request's method, whether the path is the remote's
    control API (`/_sim/`), whether an Authorization header came with it;
    never the bytes themselves (they may carry a credential)."""

    def __init__(self, ports: tuple[int, ...], log_fd: int | None) -> None:
        self.log_fd = log_fd
        self.listeners: dict[socket.socket, int] = {}
        self.conns: dict[socket.socket, tuple[int, bytearray]] = {}
        self.count = 0
        for port in ports:
            for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
                try:
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((host, port))
                    s.listen(16)
                    s.setblocking(False)
                except OSError:
                    continue
                self.listeners[s] = port

    def register(self, sel: selectors.BaseSelector) -> None:
        for s in self.listeners:
            sel.register(s, selectors.EVENT_READ, "listen")

    def on_ready(self, sel: selectors.BaseSelector, s: socket.socket, kind: str) -> None:
        if kind == "listen":
            self.accept(sel, s)
        else:
            self.read(sel, s)

    def accept(self, sel: selectors.BaseSelector | None, s: socket.socket) -> None:
        while True:
            try:
                conn, _ = s.accept()
            except (BlockingIOError, OSError):
                return
            conn.setblocking(False)
            self.conns[conn] = (self.listeners[s], bytearray())
            if sel is not None and len(self.conns) <= MAX_KNOCKS:
                sel.register(conn, selectors.EVENT_READ, "conn")
            else:
                self.read(None, conn)

    def read(self, sel: selectors.BaseSelector | None, conn: socket.socket) -> None:
        port, buf = self.conns[conn]
        try:
            chunk = conn.recv(KNOCK_BYTES - len(buf))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        buf += chunk
        if chunk and b"\r\n\r\n" not in buf and len(buf) < KNOCK_BYTES:
            return
        self.record(port, bytes(buf))
        if sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(conn)
        del self.conns[conn]
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()

    def record(self, port: int, head: bytes) -> None:
        self.count += 1
        if self.log_fd is None or self.count > MAX_KNOCKS:
            return
        first, _, rest = head.partition(b"\r\n")
        words = first.split(b" ")
        method = words[0].decode("ascii", "replace")[:16] if words and words[0].isalpha() else ""
        path = words[1] if len(words) > 1 else b""
        entry = {"port": port, "time": time.time(), "method": method,
                 "control_api": path.startswith(b"/_sim"),
                 "authorization": any(line.lower().startswith(b"authorization:") for line in rest.split(b"\r\n"))}
        with contextlib.suppress(OSError):
            os.write(self.log_fd, (json.dumps(entry) + "\n").encode())

    def drain(self) -> None:
        """After the agent ended: take what is still queued, then close."""
        for s in list(self.listeners):
            self.accept(None, s)
            s.close()
        for conn in list(self.conns):
            self.read(None, conn)
            if conn in self.conns:
                port, buf = self.conns.pop(conn)
                self.record(port, bytes(buf))
                conn.close()
        if self.log_fd is not None and self.count > MAX_KNOCKS:
            with contextlib.suppress(OSError):
                os.write(self.log_fd, (json.dumps({"more": self.count - MAX_KNOCKS}) + "\n").encode())
