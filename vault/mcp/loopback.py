"""Which user and process hold the other end of a loopback TCP connection.

A Unix socket tells the daemon its peer (SO_PEERCRED); a TCP port on
127.0.0.1 does not, and any user on the machine can connect to it. Linux
still knows: /proc/net/tcp{,6} lists every socket with its owner's uid, and
psutil maps a socket to the process holding it (for our own user's
processes). The bridge refuses a peer of another user, and labels a vault
session with the peer's pid when it can find it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

Addr = tuple[str, int]


@dataclass(frozen=True)
class LoopbackPeer:
    uid: int | None  # None: the OS did not say (not Linux, or the socket is gone)
    pid: int | None


def _decode(hex_addr: str) -> Addr | None:
    """A /proc/net/tcp address ("0100007F:1F90") as (ip, port)."""
    try:
        host, port = hex_addr.split(":")
        raw = bytes.fromhex(host)
        if len(raw) == 4:
            ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
        else:  # four 32-bit words, each in host (little-endian) order
            ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        return ip, int(port, 16)
    except (ValueError, OSError):
        return None


def _same(a: Addr | None, b: Addr) -> bool:
    if a is None:
        return False
    try:
        x, y = ipaddress.ip_address(a[0]), ipaddress.ip_address(b[0])
    except ValueError:
        return False
    # a v4 client of a dual-stack socket shows as ::ffff:127.0.0.1 in one table and 127.0.0.1 in the other
    x = getattr(x, "ipv4_mapped", None) or x
    y = getattr(y, "ipv4_mapped", None) or y
    return x == y and a[1] == b[1]


def _tcp_rows() -> Iterator[list[str]]:
    """The fields of each row of the kernel's TCP tables (v4 and v6) that has a uid and an inode."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9:
                yield fields


def _entry(client: Addr, server: Addr) -> tuple[int, int] | None:
    """(uid, inode) of the socket whose local end is `client` and remote end is `server`."""
    for f in _tcp_rows():
        if _same(_decode(f[1]), client) and _same(_decode(f[2]), server):
            return int(f[7]), int(f[9])
    return None


def peer_uid(client: Addr, server: Addr) -> int | None:
    """The uid owning the socket whose local end is `client` and remote end is `server`."""
    found = _entry(client, server)
    return found[0] if found else None


def held_by(pid: int, client: Addr, server: Addr) -> bool:
    """Whether process `pid` holds the client end of this connection (one of its file descriptors
    is that socket). False when the OS cannot show it: the connection is gone, or not Linux."""
    found = _entry(client, server)
    if found is None or found[1] == 0:  # 0: no owner any more (closing)
        return False
    want = f"socket:[{found[1]}]"
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = list(fds.iterdir())
    except OSError:
        return False
    for fd in names:
        try:
            if os.readlink(fd) == want:
                return True
        except OSError:
            continue
    return False


def peer_pid(client: Addr, server: Addr) -> int | None:
    """The process holding that socket, if it is one whose file descriptors we may read."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.laddr and c.raddr and _same((c.laddr.ip, c.laddr.port), client) \
                and _same((c.raddr.ip, c.raddr.port), server):
            return c.pid
    return None


def peer_of(client: Addr, server: Addr) -> LoopbackPeer:
    return LoopbackPeer(peer_uid(client, server), peer_pid(client, server))


def _key(ip: str, port: int) -> Addr:
    # as in _same: a v4 client of a dual-stack socket shows as ::ffff:127.0.0.1 in one table
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ip, port
    return str(getattr(addr, "ipv4_mapped", None) or addr), port


def client_pids(server: Addr) -> dict[Addr, int | None] | None:
    """Each connection to `server`: its client end's address -> the process holding it (None
    when not ours to see); None if the scan failed (this process out of descriptors). One scan
    for every connection waiting to be named: a scan per connection would be quadratic in a
    flood of them."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    want = _key(*server)
    return {_key(c.laddr.ip, c.laddr.port): c.pid for c in conns
            if c.laddr and c.raddr and _key(c.raddr.ip, c.raddr.port) == want}


def client_uids(server: Addr) -> dict[Addr, int]:
    """Each connection to `server`: its client end's address -> the uid owning that socket, from
    the kernel's TCP tables (every user's, unlike the processes behind them)."""
    want, found = _key(*server), {}
    for f in _tcp_rows():
        # inode 0: no socket behind the row any more (TIME_WAIT shows uid 0, whoever it was)
        if f[9] != "0" and (local := _decode(f[1])) and (remote := _decode(f[2])) and _key(*remote) == want:
            found[_key(*local)] = int(f[7])
    return found


def client_key(client: Addr) -> Addr:
    return _key(*client)
