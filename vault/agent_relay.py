"""`python -m vault.agent_relay LISTEN AGENT_SOCK`: an agent process that speaks for its caller.

Why: a test that calls the agent socket itself would make the test process an
agent, and the vault refuses an agent (or anything in its process tree) as an
approver, so the pytest plugin's in-process approver could no longer answer.
The relay is a fresh process of its own session: it accepts one connection on
LISTEN, opens one connection to the agent socket, and copies lines both ways
until either side closes. The vault sees the relay as the agent (SCM_CREDENTIALS
names its pid on every line), a real process like any agent under test.

It prints `ready` once LISTEN accepts connections. Standard library only, so
it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys


def pump(a: socket.socket, b: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    while True:
        for key, _ in sel.select():
            src: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = src.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            try:
                key.data.sendall(data)
            except OSError:
                return


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m vault.agent_relay LISTEN AGENT_SOCK", file=sys.stderr)
        return 2
    listen, target = args
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the listening socket is its owner's only
    try:
        server.bind(listen)
    finally:
        os.umask(old)
    server.listen(1)
    print("ready", flush=True)
    conn, _ = server.accept()
    server.close()
    os.unlink(listen)
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(target)
    except OSError as exc:
        print(f"vault.agent_relay: cannot reach {target}: {exc.strerror}", file=sys.stderr)
        conn.close()
        return 1
    try:
        pump(conn, upstream)
    finally:
        conn.close()
        upstream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
