"""Did this request come through the vault? The remote's side of vault.vouch.

Two kinds of evidence, both required when available:

* the mark: `X-Vaultsim-Via` equals the trial's mark (constant-time
  compare; the value is never stored, logged or echoed);
* the connection's owner: which process holds the client end of the TCP
  connection, from /proc/net/tcp (the socket's inode) and /proc/PID/fd of
  the processes allowed to call (the daemon; the runner's own set-up
  requests). Readable where the OS lets the remote look: always as root
  (where a process that read the daemon's memory could also know the mark),
  and for a daemon that is still dumpable. When it cannot be read, the mark
  alone decides.

Without a configured mark (a standalone `vaultsim remote`, most tests) there
is nothing to check: `via` is None, neither true nor false.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field

from vault.vouch import HEADER

_HEADER = HEADER.lower().encode()


@dataclass
class Vouch:
    mark: str
    pids: set[int] = field(default_factory=set)  # processes allowed to call the remote

    def check_mark(self, headers: list[tuple[bytes, bytes]]) -> bool:
        presented = next((v for k, v in headers if k.lower() == _HEADER), b"")
        return hmac.compare_digest(presented.strip(), self.mark.encode())

    def owner_allowed(self, client: tuple[str, int] | None, server_port: int) -> bool | None:
        """True / False when the client socket's owner could be told, None when it could not."""
        if client is None or not self.pids:
            return None
        inode = _client_inode(client[1], server_port)
        if inode is None:
            return None
        held = self._held(f"socket:[{inode}]")
        if held is not False:
            return held
        # no allowed process holds it now: the verdict only if the socket is still there (held by
        # someone). An allowed client that closed it between the two reads (its timeout, under
        # load) leaves no row or inode 0 (an orphan): who held it cannot be told, the mark decides
        return False if _client_inode(client[1], server_port) == inode else None

    def _held(self, target: str) -> bool | None:
        """True: an allowed process holds `target`; None: one could not be looked at."""
        unknown = False
        for pid in self.pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except PermissionError:
                unknown = True  # non-dumpable and we are not root: the mark decides
                continue
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return True
                except OSError:
                    continue
        return None if unknown else False


def _client_inode(client_port: int, server_port: int) -> int | None:
    """The inode of the loopback socket whose local port is `client_port` and peer `server_port`."""
    local, remote = f":{client_port:04X}", f":{server_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    # inode 0: a TIME_WAIT leftover of an earlier connection on the same ports
                    if len(cols) > 9 and cols[1].endswith(local) and cols[2].endswith(remote) and cols[9] != "0":
                        return int(cols[9])
        except OSError:
            continue
    return None
