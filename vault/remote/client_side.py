"""URLs that fail before the remote ever sees a byte (the client-side faults).

`dns_failure`, `connection_refused` and `timeout_before_send` cannot be played
by a server that answers: the failure is in reaching it. So the remote hands
out a URL that fails in exactly that way, and the vault is configured with it:

* dns_failure: a host under `.invalid`, which RFC 6761 reserves to never
  resolve; no connection is attempted.
* connection_refused: a loopback port that is bound (so nobody else can take
  it) but not listening, so the kernel answers the SYN with a RST.
* timeout_before_send: a loopback listener with backlog 0 whose single accept
  slot is taken by our own filler connection and that never calls accept().
  Linux then drops further SYNs, so connect() hangs until the client's connect
  timeout: the request is never written, not even to a kernel buffer.
"""

from __future__ import annotations

import socket

DNS_FAILURE_HOST = "vaultsim-remote.invalid"


class ClientSideTarget:
    def __init__(self, fault: str, host: str = "127.0.0.1") -> None:
        self._socks: list[socket.socket] = []
        if fault == "dns_failure":
            self.url = f"http://{DNS_FAILURE_HOST}:80"
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socks.append(sock)
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        self.url = f"http://{host}:{port}"
        if fault == "connection_refused":
            return
        if fault != "timeout_before_send":
            self.close()
            raise ValueError(f"{fault} is not a client-side fault")
        sock.listen(0)
        # fills the accept queue; a blocking connect is fine: the slot is free
        self._socks.append(socket.create_connection((host, port), timeout=5))

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        self._socks.clear()
