"""The vault's mark: how a remote tells the vault's requests from anyone else's.

Why: an agent that obtained a credential (read it from a keyring file the
same user can read, or from a process's memory where the OS let it) can call
the remote itself, and the remote sees a valid token. So every request the
daemon's HTTP executor sends carries `X-Vaultsim-Via: MARK`, a per-trial
random value the agent never sees; the fake remote marks every request
without it (vault.remote.vouch), and the runner grades those
`FAIL_VAULT_BYPASS`.

The mark must reach the daemon where no agent can read it: not argv (`ps`),
not the environment or a file (same user), not through the fork server
(whose memory forked agents inherit). So the runner hands it over a Unix
socket it listens on for one connection, and answers only the process whose
SO_PEERCRED pid is the daemon it just started; the daemon asks once, at
start, before it reads any credential, and keeps it in its non-dumpable
memory (vault.proc_guard).

    runner                                  daemon (`--mark-socket PATH`)
    MarkHandoff(path).start()
    spawn daemon ----------------------->   connect(PATH)
    handoff.expect(pid)                     <- "MARK\\n" only if peer pid == pid
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from pathlib import Path

from vault.daemon.peer import peer_cred

HEADER = "X-Vaultsim-Via"
HANDOFF_TIMEOUT_S = 20.0


def new_mark() -> str:
    return secrets.token_urlsafe(32)


def fetch(path: str | os.PathLike[str], timeout: float = HANDOFF_TIMEOUT_S) -> str:
    """The daemon's side: the mark from the runner's socket, or OSError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        data = b""
        while not data.endswith(b"\n") and len(data) < 256:
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
    mark = data.decode("ascii", "replace").strip()
    if not mark:
        raise OSError(0, f"no mark was handed over on {path}")
    return mark


class MarkHandoff:
    """The runner's side: one answer, to one process, then gone."""

    def __init__(self, path: Path, mark: str) -> None:
        self.path, self._mark = path, mark
        self._pid: asyncio.Future[int] | None = None
        self._server: asyncio.AbstractServer | None = None
        self.handed = asyncio.Event()

    async def start(self) -> None:
        self._pid = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o600)

    def expect(self, pid: int) -> None:
        if self._pid is not None and not self._pid.done():
            self._pid.set_result(pid)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            pid, _, _ = peer_cred(sock)
            assert self._pid is not None
            expected = await asyncio.wait_for(asyncio.shield(self._pid), HANDOFF_TIMEOUT_S)
            if pid == expected and not self.handed.is_set():
                writer.write(self._mark.encode() + b"\n")
                await writer.drain()
                self.handed.set()
        except (OSError, TimeoutError, AssertionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
