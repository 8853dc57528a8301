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
from hostile_fixtures import served  # noqa: F401  (a fixture: one daemon for this module's raw clients)

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
        # a SYN the full queue dropped costs the host 1 s, two 3 s; the stall was 7 s
        assert worst < max(5.0, 10 * baseline), (worst, baseline, sorted(s for s, _ in samples))
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


# opens connections as another user and holds them, sending nothing; prints how many it holds,
# then what the last one was answered (empty: closed unanswered, or nothing within 5 s)
_OTHER_USER = r'''
import socket, sys
port = int(sys.argv[1])
held = []
for _ in range(int(sys.argv[2])):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=3))
    except OSError:
        break
print(len(held), flush=True)
last = held[-1]
last.settimeout(5)
got = b""
try:
    while chunk := last.recv(65536):
        got += chunk
except OSError:
    pass
print(repr(got[:400]), flush=True)
sys.stdin.read()
'''


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None
                    or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root, setpriv and a system python3 to act as another user")
class TestAnotherUsersFlood:
    def test_cannot_take_the_bridges_descriptors(self) -> None:
        """A bridge that cannot see another user's processes (not root: here root without
        capabilities) could not name such a peer's connections, so none was counted: the guard
        refused each request 403, but a process of another user holding connections open took
        every descriptor the bridge had, and a host of its own user waited (for the 10 s after
        which idle ones are closed). Now a connection whose socket another user owns (the
        kernel's TCP table says so) is answered 403 at accept and closed, so it holds nothing."""
        from mcp_world import bridge_argv, start_world
        from helpers import wait_for
        from vault.mcp.http_deadline import HEADER_S

        box = new_sandbox()
        errlog = box.root / "mcp-http.stderr"
        try:
            start_world(box)

            def limit() -> None:
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))

            proc = box.spawn(["setpriv", "--bounding-set=-all", "--inh-caps=-all", PY,
                              *bridge_argv("--http", "127.0.0.1:0")], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=open(errlog, "a"), preexec_fn=limit)
            line = wait_for(lambda: proc.poll() is not None or next(
                (ln for ln in errlog.read_text().splitlines() if "serving http://" in ln), None),
                what="bridge URL")
            assert proc.poll() is None, errlog.read_text()
            port = int(line.rsplit(":", 1)[1].split("/")[0])
            flood = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                      "/usr/bin/python3", "-c", _OTHER_USER, str(port), "700"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
            try:
                assert flood.stdout is not None
                held = int(flood.stdout.readline())
                last = flood.stdout.readline()
                latency, status = _initialize(port)
            finally:
                flood.communicate("", timeout=60)
            assert held == 700
            assert "403 Forbidden" in last and "runs as another user" in last, last
            assert 200 == status and latency < HEADER_S - 2, (status, latency)
            proc.terminate()
            proc.wait(timeout=30)
            assert "Traceback" not in errlog.read_text()
        finally:
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestAParseErrorSaysWhatIsWrong:
    @pytest.mark.parametrize(("line", "said"), [
        (b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"vault.status"}', "more digits than can be read"),
        (b'{"jsonrpc":"2.0","id":1,', "parse error: not a JSON text"),
        (b'{"jsonrpc":"2.0","id":1,"method":"vault.st\xc3atus"}', "not a JSON text in UTF-8"),
    ], ids=["huge-integer", "cut-short", "not-utf8"])
    def test_on_the_agent_socket(self, served: Sandbox, line: bytes, said: str) -> None:
        """An integer of 5,000 digits (valid JSON, valid UTF-8) was answered "not a JSON text
        in UTF-8", sending its sender to look for bad bytes; each parse error now says which
        it is, and the same connection is served on."""
        from hostile_fixtures import RawClient, frame

        with RawClient(served.agent_sock, timeout=20) as c:
            answer = c.ask(line + b"\n")
            assert -32700 == answer["error"]["code"]
            assert said in answer["error"]["message"], answer
            if said != "more digits than can be read":
                assert "digits" not in answer["error"]["message"]
            assert "pid" in c.ask(frame("vault.status", rid=2))["result"]


class TestAHostThatHalfClosesAfterItsRequest:
    def test_still_gets_its_answer(self, bridge: tuple[Sandbox, subprocess.Popen[str], int]) -> None:
        """A host that sends its whole request and then shuts its write side (`nc -N`, a script
        saying "no more requests") still reads. The bridge took that end of input for a hang-up:
        the request was dropped as disconnected, nothing was answered, and the log got a
        ClientDisconnect traceback. Now it is answered, then the connection is closed. A
        request cut short by the end of input is still closed unanswered (it cannot be served),
        and is not logged as the bridge's error with a traceback (one a connection)."""
        import socket

        box, proc, port = bridge
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "h", "version": "1"}}})
        head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n")
        for request, answered in ((head + body, True), (head + body[:10], False)):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(request.encode())
                s.shutdown(socket.SHUT_WR)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            if answered:
                assert got.startswith(b"HTTP/1.1 200 "), got
                assert b'"serverInfo"' in got, got
            else:
                assert not got.startswith(b"HTTP/1.1 200 "), got
        _initialize(port)  # served on
        said = (box.root / "mcp-http.stderr").read_text()
        assert "Traceback" not in said and "ClientDisconnect" not in said, said[-3000:]


# opens N MCP sessions, 8 at a time on kept-alive connections; prints each one's status
_OPENER = r'''
import json, sys
from concurrent.futures import ThreadPoolExecutor
import httpx
url, n = sys.argv[1], int(sys.argv[2])
h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
     "mcp-protocol-version": "2025-06-18"}
hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "many", "version": "1"}}}
def one(c):
    r = c.post(url, headers=h, json=hello, timeout=30)
    return r.status_code if "mcp-session-id" in r.headers else [r.status_code, r.text[:300]]
with httpx.Client() as c, ThreadPoolExecutor(8) as pool:
    print(json.dumps(list(pool.map(lambda _: one(c), range(n)))))
'''


class TestAProcessOpeningItsShareOfSessionsAtOnce:
    def test_gets_every_one_of_them(self, bridge: tuple[Sandbox, subprocess.Popen[str], int]) -> None:
        """A process may hold a quarter of the bridge's MCP sessions (63). One opening them 8 at a
        time was refused 429 at its 62nd or 63rd now and then (about one try in two): a session
        whose answer had started was counted twice, as opened and as still opening, until its
        request ended. It is now counted once, from when it is noted as opened. (A race: three
        processes below each open their whole share, which made a miss before the fix likely.)"""
        from test_mcp_http import start_http_bridge
        from vault.mcp.http import MAX_HTTP_SESSIONS_PER_PROCESS

        box = bridge[0]
        proc, url = start_http_bridge(box)  # the open-file limit it inherits, as a host starts it
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(3):
            out = subprocess.run([PY, "-c", _OPENER, f"http://127.0.0.1:{port}/mcp",
                                  str(MAX_HTTP_SESSIONS_PER_PROCESS)],
                                 capture_output=True, text=True, timeout=120, env=box.env)
            assert out.returncode == 0, out.stderr[-2000:]
            statuses = json.loads(out.stdout)
            assert [200] * MAX_HTTP_SESSIONS_PER_PROCESS == statuses, [s for s in statuses if s != 200]
        proc.terminate()
        proc.wait(timeout=30)
