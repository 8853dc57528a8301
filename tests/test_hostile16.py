"""Sixteenth hostile pass: one process's connections to the HTTP bridge, a daemon out of file
descriptors, uptime across a wall-clock jump.

Real processes, sockets and files only; no fixed sleeps (events, or polls with a deadline).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest


class TestTheDaemonOutOfDescriptors:
    def test_says_so_once_serves_open_connections_and_accepts_again(self) -> None:
        """A daemon with no file descriptor left retried accept every 0.1 s and logged each
        failure: ten lines a second for as long as the flood lasted. Now it is said once (then
        at most once a minute with a count); a connection already open is served all along,
        and once descriptors free up the connection that waited is accepted and answered."""
        import resource
        import shutil

        from helpers import new_sandbox, wait_for
        from vault.client import RpcClient

        box = new_sandbox()
        try:
            box.start_daemon()
            errlog = box.root / "daemon.stderr"
            with RpcClient(box.agent_sock, timeout=10) as held:
                pid = held.request("vault.status")["pid"]
                limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
                in_use = len(os.listdir(f"/proc/{pid}/fd"))
                # not one descriptor more: the next accept fails (EMFILE) until the limit is raised
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use, limits[1]))
                waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    waiting.connect(str(box.agent_sock))  # the kernel's backlog takes it
                    waiting.sendall(b'{"jsonrpc":"2.0","id":1,"method":"vault.status"}\n')
                    wait_for(lambda: "Too many open files" in errlog.read_text(),
                             what="the daemon to run out of descriptors")
                    start, served = time.monotonic(), 0
                    while time.monotonic() - start < 1.5:  # ~15 retries of accept
                        assert held.request("vault.status")["pid"] == pid
                        served += 1
                    said = errlog.read_text()
                    assert said.count("Too many open files") == 1, said[-1000:]
                    assert "already open are still served" in said, said[-1000:]
                    resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
                    waiting.settimeout(15)
                    answer = b""
                    while not answer.endswith(b"\n"):
                        chunk = waiting.recv(65536)
                        assert chunk, answer
                        answer += chunk
                    assert b'"uptime_s"' in answer, answer
                finally:
                    waiting.close()
            assert box.status() is not None
        finally:
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestUptimeAcrossAWallClockJump:
    def test_is_never_negative(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """`uptime_s` was wall time since start: a clock set back an hour (NTP, a VM resumed)
        made it -3600. It is now monotonic time since start."""
        from vault.config import load_config
        from vault.daemon.daemon import VaultDaemon
        from vault.home import VaultHome

        tmp_path.chmod(0o700)
        home = VaultHome(tmp_path / "h").ensure()
        daemon = VaultDaemon(home, load_config(None, home_config=home.config_file), store=None)  # type: ignore[arg-type]
        wall = time.time()
        monkeypatch.setattr(time, "time", lambda: wall - 3600.0)
        assert 0 <= daemon.status()["uptime_s"] < 600
