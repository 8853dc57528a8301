"""Seventeenth hostile pass: a connection flood against the HTTP bridge while a host is served,
another user's flood, `vaultsim stop` on a daemon that never stops, and hostile clients of the
daemon's sockets.

Real processes, sockets and files only; no fixed sleeps (events, or polls with a deadline).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from helpers import PY, Sandbox, new_sandbox

pytest.importorskip("mcp.client.streamable_http", reason="the mcp SDK is not installed")

# holds its share of connections, then reconnects without pause (each refused 429) until its
# stdin closes; prints "held" once the share is taken
_FLOOD = r'''
import socket, sys, threading
port, hold = int(sys.argv[1]), int(sys.argv[2])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(hold)]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("held", flush=True)
n = 0
while not done.is_set():
    batch = []
    for _ in range(50):
        try:
            batch.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
    for s in batch:
        s.close()
    n += len(batch)
print("flooded", n, flush=True)
'''


def _initialize(port: int) -> tuple[float, int]:
    """One well-behaved host request (an MCP initialize on a new connection): its latency, status."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "h", "version": "1"}}})
        conn.request("POST", "/mcp", body=body, headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
        resp = conn.getresponse()
        resp.read()
        return time.monotonic() - start, resp.status
    finally:
        conn.close()


@pytest.fixture
def bridge() -> Iterator[tuple[Sandbox, subprocess.Popen[str], int]]:
    """A world and `vaultsim mcp --http` with an open-file limit of 512 (a share of 128)."""
    from mcp_world import start_world
    from test_mcp_http import start_http_bridge

    box = new_sandbox()
    try:
        start_world(box)
        proc, url = start_http_bridge(box, nofile=512)
        try:
            yield box, proc, int(url.rsplit(":", 1)[1].split("/")[0])
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


class TestAFloodOfRefusedConnections:
    def test_another_hosts_requests_stay_prompt_and_the_log_stays_small(
            self, bridge: tuple[Sandbox, subprocess.Popen[str], int]) -> None:
        """A process holding its share of connections and reconnecting without pause: each new
        connection waited, holding a descriptor, until a scan of every socket on the machine
        named it, so they piled up to the open-file limit; every accept then failed (EMFILE), and
        asyncio stopped accepting for a second at each, and queued a retry per connection it
        tried (thousands), each a traceback in the log at shutdown (40 MB). A well-behaved
        host's initialize took 7 s. Now the bridge stops accepting while a batch of connections
        waits to be named (the kernel's queue holds the rest), so it never runs out of
        descriptors: the host is answered within a few scans, and the log says nothing."""
        box, proc, port = bridge
        baseline = max(_initialize(port)[0] for _ in range(3))
        flood = subprocess.Popen([PY, "-c", _FLOOD, str(port), "128"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert flood.stdout is not None and flood.stdout.readline().strip() == "held"
            samples = [_initialize(port) for _ in range(12)]
        finally:
            out, _ = flood.communicate("", timeout=60)
        assert int(out.split()[-1]) >= 50, out  # it did flood while the host was served
        assert {200} == {status for _, status in samples}
        worst = max(latency for latency, _ in samples)
        assert worst < max(3.0, 10 * baseline), (worst, baseline, sorted(s for s, _ in samples))
        proc.terminate()
        proc.wait(timeout=30)
        said = (box.root / "mcp-http.stderr").read_text()
        assert "Traceback" not in said and len(said) < 10_000, (len(said), said[:3000])


class TestStopOnADaemonStuckStopping:
    def test_says_how_to_end_it_and_exits_non_zero(self) -> None:
        """`vaultsim stop` on a daemon already stopping waits for it (a TERM then would cut its
        log's signing short); past its deadline it said only "did not stop within Ns". It now
        also names the pid and how to end it (`kill -KILL PID`, and what that costs), exits
        non-zero, and prints no secret. The daemon is held stopping by a call in flight to a
        remote that accepts and never answers (the daemon gives such calls a grace of 3 s)."""
        import signal
        import socket

        from audit_daemon_helpers import TOKEN, daemon_args, setup_remote, spawn_agent
        from helpers import wait_for
        from vault.cli.daemon_probe import held_by
        from vault.home import VaultHome

        box = new_sandbox()
        mute = socket.create_server(("127.0.0.1", 0))
        try:
            setup_remote(box)
            daemon = box.start_daemon(*daemon_args(box, f"http://127.0.0.1:{mute.getsockname()[1]}"))
            agent = spawn_agent(box, "a", 1, "r", box.root / "a.out")
            mute.settimeout(30)
            conn, _ = mute.accept()  # the call is at the remote, never to be answered
            conn.settimeout(30)
            assert conn.recv(4096)
            daemon.send_signal(signal.SIGTERM)
            home = VaultHome(box.home)
            wait_for(lambda: (h := held_by(home, wait_s=0)) is not None and h.state == "stopping",
                     interval=0.005, what="the daemon to be stopping")
            out = box.vaultsim("stop", "--timeout", "0.3")
            said = out.stdout + out.stderr
            assert out.returncode == 1, said
            assert f"daemon (pid {daemon.pid}) did not stop within 0.3s" in said, said
            assert f"kill -KILL {daemon.pid}" in said, said
            assert TOKEN not in said and "Traceback" not in said, said
            daemon.wait(timeout=30)
            agent.wait(timeout=30)
            conn.close()
        finally:
            mute.close()
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)
