"""Fifteenth hostile pass: a start whose first audit record fails, reports on a full disk, HTTP MCP
sessions held by one peer, a dropped HTTP call's approval, `status` of a stopping daemon.

Real processes, sockets and files only; no fixed sleeps (events, or polls with a deadline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tmpfs(where: Path, size: str) -> None:
    where.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")


def _fill(where: Path, leave_pages: int) -> Path:
    fill = where / "fill"
    fd = os.open(fill, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(fill, max(0, fill.stat().st_size - leave_pages * 4096))
    return fill


class TestAStartWhoseFirstRecordCannotBeWritten:
    def test_is_stopped_again_and_exits_2_so_a_later_start_can_serve(self, tmp_path: Path) -> None:
        """With room for its files but not for its first audit record the daemon came up refusing
        every call for good: `vaultsim daemon` exited 0 (printing NOT SERVING CALLS), so
        `vaultsim daemon && agent` went on, and once the disk had room a second start was refused
        ("already serves the home"). Now that start stops it again and exits 2 like any start
        with no room, `--json` saying `running: false` and `halted` why; the next start serves."""
        from vault.runner import world_procs

        root = tmp_path / "r"
        root.mkdir(mode=0o700)
        home = root / "h"
        _tmpfs(home, "200k")
        env = {**world_procs.home_env(root), "PYTHONPATH": str(ROOT)}

        def vaultsim(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "vault.cli.main", *args], env=env,
                                  capture_output=True, text=True, timeout=60)
        halted_seen = False
        try:
            for pages in range(1, 16):  # the first start that comes up, as the room grows a page at a time
                for p in home.iterdir():
                    p.unlink()
                fill = _fill(home, pages)
                out = vaultsim("daemon", "--unlocked", "--json")
                assert "Traceback" not in out.stderr, out.stderr
                if out.returncode == 0:
                    assert json.loads(out.stdout)["halted"] is None
                    assert "cannot serve" not in out.stderr
                    assert vaultsim("stop").returncode == 0
                    continue
                assert out.returncode == 2, out
                if "cannot serve calls" not in out.stderr:
                    continue  # no room for its files: refused before it came up
                halted_seen = True
                doc = json.loads(out.stdout)
                assert doc["running"] is False and doc["halted"], doc
                assert doc["halted"] in out.stderr
                status = vaultsim("status", "--json")
                assert status.returncode == 1, status  # nothing left holding the home
                assert "held_by_pid" not in json.loads(status.stdout), status.stdout
                fill.unlink()
                again = vaultsim("daemon", "--unlocked")
                assert again.returncode == 0, again
                assert vaultsim("stop").returncode == 0
                break
            assert halted_seen, "no start came up with a failed first record"
        finally:
            vaultsim("stop")
            subprocess.run(["umount", "-l", str(home)], capture_output=True)


class TestReportsOnAFullDiskExitLikeStdoutOnOne:
    def _merge(self, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        from vault.runner.merge import summarize
        from vault.runner.report_schema import document

        shard = tmp_path / "shard.json"
        shard.write_text(json.dumps(document(
            {"shard": {"index": 1, "count": 1, "selection": "x", "selected_trials": 0}, "not_run": 0,
             "agent": "stub", "jobs": 1, "paths": []}, summarize([], 0.0), [], [])))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, "-m", "vault.cli.main", "report", "merge", str(shard), *extra],
                              capture_output=True, text=True, timeout=60, env=env)

    def test_a_report_with_no_room_is_exit_3_as_stdout_with_none_is(self, tmp_path: Path) -> None:
        """README: 2 is bad input, 3 an infrastructure error; stdout on a full disk is 3. A --json
        or --junit report on a full disk was 2, as if the user had named a bad path. Now 3."""
        with open("/dev/full", "w") as full:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            stdout = subprocess.run([sys.executable, "-m", "vault.cli.main", "schema", "report"], stdout=full,
                                    stderr=subprocess.PIPE, text=True, timeout=60, env=env)
        assert stdout.returncode == 3, stdout.stderr
        for option in ("--json", "--junit"):
            out = self._merge(tmp_path, option, "/dev/full")
            assert out.returncode == 3, out
            assert f"{option}: cannot write /dev/full: No space left on device" in out.stderr
            assert "Traceback" not in out.stderr


_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hog", "version": "1"}}}).encode()
_OPEN_PROBE = ("import sys, urllib.request, urllib.error\n"
               "req = urllib.request.Request(sys.argv[1], method='POST', data=sys.argv[2].encode(), headers={"
               "'Content-Type': 'application/json', 'Accept': 'application/json, text/event-stream'})\n"
               "try:\n    r = urllib.request.urlopen(req, timeout=30); print(r.status, r.headers['mcp-session-id'])\n"
               "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())\n")


def _http(url: str, method: str, body: bytes | None = None, sid: str | None = None) -> tuple[int, str, str | None]:
    import urllib.error
    import urllib.request
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if sid:
        headers |= {"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
    req = urllib.request.Request(url, method=method, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(errors="replace"), r.headers.get("mcp-session-id")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), None


class TestOneProcessCannotHoldEveryHttpMcpSession:
    def test_a_process_past_its_share_is_refused_429_and_others_still_open(self) -> None:
        """README: at most 255 HTTP MCP sessions at once, each until DELETE or 30 minutes idle.
        One process opening sessions it never ends held all 255 for half an hour: every other
        host got 503. Now a process holds a quarter at most (63); its next initialize is 429
        naming its share, while another process still opens one, and a DELETE frees a slot."""
        import shutil

        from helpers import new_sandbox
        from mcp_world import start_world
        from test_mcp_http import start_http_bridge
        from vault.mcp.http import MAX_HTTP_SESSIONS_PER_PROCESS

        box = new_sandbox()
        try:
            start_world(box)
            _, url = start_http_bridge(box)
            mine = []
            for _ in range(MAX_HTTP_SESSIONS_PER_PROCESS):
                status, text, sid = _http(url, "POST", _INIT)
                assert status == 200 and sid, (status, text)
                mine.append(sid)
            status, text, sid = _http(url, "POST", _INIT)
            assert status == 429 and sid is None, (status, text)
            assert f"process {os.getpid()} already holds {MAX_HTTP_SESSIONS_PER_PROCESS}" in text
            other = subprocess.run([sys.executable, "-c", _OPEN_PROBE, url, _INIT.decode()],
                                   capture_output=True, text=True, timeout=60)
            assert other.stdout.startswith("200 "), other.stdout + other.stderr
            assert _http(url, "DELETE", sid=mine.pop())[0] == 200
            status, text, sid = _http(url, "POST", _INIT)
            assert status == 200 and sid, (status, text)
        finally:
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestStatusTellsStoppingFromStarting:
    def test_a_daemon_on_its_way_out_is_said_to_be_stopping(self) -> None:
        """A stopping daemon (its calls settling, its log being signed) listens on no socket,
        as one still starting does: `status` said "still starting (... or no more: stopping)".
        The daemon now names itself stopping when it begins to stop, so `status` says which.
        The window is held open by a call in flight to a remote that accepts and never answers
        (the daemon gives in-flight calls a grace before it closes)."""
        import shutil
        import signal
        import socket

        from audit_daemon_helpers import daemon_args, setup_remote, spawn_agent
        from helpers import new_sandbox, wait_for
        from vault.cli.daemon_probe import held_by
        from vault.home import VaultHome

        box = new_sandbox()
        mute = socket.create_server(("127.0.0.1", 0))
        try:
            setup_remote(box)  # the credential and the all-auto policy; the remote is `mute`
            url = f"http://127.0.0.1:{mute.getsockname()[1]}"
            daemon = box.start_daemon(*daemon_args(box, url))
            agent = spawn_agent(box, "a", 1, "r", box.root / "a.out")
            mute.settimeout(30)
            conn, _ = mute.accept()  # the call is at the remote, never to be answered
            conn.settimeout(30)
            assert conn.recv(4096)
            daemon.send_signal(signal.SIGTERM)
            home = VaultHome(box.home)
            held = wait_for(lambda: (lambda h: h if h is None or h.state != "cut off" else None)(
                held_by(home, wait_s=0)) or daemon.poll() is not None, interval=0.005,
                what="the daemon to close its sockets")
            assert held is not True, "the daemon was gone before its stopping was seen"
            assert held.state == "stopping", held
            assert "is stopping" in held.why()
            daemon.wait(timeout=30)
            agent.wait(timeout=30)
            conn.close()
        finally:
            mute.close()
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestAFileFieldNameIsShownSafely:
    """A bad scenario, catalog, policy or config file is refused with the file and the field,
    exit 2 (README). The field's name comes from the file, and was printed as it was: a key
    holding terminal escapes rewrote the terminal showing the error, a 1 MiB key made a 1 MiB
    error line, 5,000 bad keys 5,000 errors in one line. Now each name is escaped and cut,
    and the first 20 errors are listed."""

    def _run(self, tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
        f = tmp_path / "s.yaml"
        f.write_text(body)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VAULTSIM_HOME": str(tmp_path / "home")}
        return subprocess.run([sys.executable, "-m", "vault.cli.main", "run", str(f), "--list"],
                              capture_output=True, text=True, timeout=120, env=env)

    def test_a_key_with_terminal_escapes_is_shown_escaped(self, tmp_path: Path) -> None:
        out = self._run(tmp_path, 'agents: []\n"\\e]0;pwned\\a\\e[2J": 1\n')
        assert out.returncode == 2, out
        assert "\x1b" not in out.stderr and "\x07" not in out.stderr, repr(out.stderr)
        assert "field \\x1b]0;pwned\\x07\\x1b[2J: Extra inputs are not permitted" in out.stderr

    def test_a_huge_key_and_many_bad_keys_make_a_short_error(self, tmp_path: Path) -> None:
        out = self._run(tmp_path, f"agents: []\n? {'k' * (1 << 20)}\n: 1\n")  # (a plain key stops at 1,024)
        assert out.returncode == 2, out
        assert len(out.stderr) < 1000 and "kkk..." in out.stderr, out.stderr[:300]
        many = "agents: []\n" + "".join(f"bad{i}: 1\n" for i in range(5000))
        out = self._run(tmp_path, many)
        assert out.returncode == 2, out
        assert len(out.stderr) < 4000 and "and 4981 more" in out.stderr, out.stderr[-300:]


# holds N connections (the kernel's backlog takes them even once the bridge cannot) until stdin closes
_HOLDER = r"""
import socket, sys
held = []
for _ in range(int(sys.argv[2])):
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5))
    except OSError:
        break
sys.stdin.read()
"""


class TestAConnectionFloodPastTheOpenFileLimit:
    def test_the_bridge_says_so_once_not_thousands_of_times_a_second_and_recovers(self) -> None:
        """Connections that use up `vaultsim mcp --http`'s open-file limit made every accept fail
        (EMFILE), and each failure was logged with its traceback, about 6,000 a second (2.5 MB/s
        into the host's log of this server, until its disk filled). Now it is said once (then at
        most once a minute, with a count); once the flood lets go, a host opens a session again."""
        import shutil
        import socket

        from helpers import new_sandbox, wait_for
        from mcp_world import start_world
        from test_mcp_http import start_http_bridge

        box = new_sandbox()
        flood: list[socket.socket] = []
        try:
            start_world(box)
            proc, url = start_http_bridge(box, nofile=128)
            errlog = box.root / "mcp-http.stderr"
            try:
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                # six processes, each within its share (32 of 128): one process alone is refused
                # past its share (test_hostile17) and no longer runs the bridge out
                holders = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(port), "32"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                           for _ in range(6)]
                try:
                    wait_for(lambda: "cannot accept connections" in errlog.read_text()
                             or "out of system resource" in errlog.read_text(), what="the bridge to run out")
                finally:
                    for h in holders:
                        h.communicate("", timeout=60)
                status, text, sid = _http(url, "POST", _INIT)
                assert status == 200 and sid, (status, text)
                said = errlog.read_text()
                assert "Traceback" not in said and len(said) < 2000, (len(said), said[:600])
                assert said.count("cannot accept connections: Too many open files") == 1, said
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        finally:
            for s in flood:
                s.close()
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestAHomeOutOfInodes:
    def test_every_start_is_0_or_2_naming_the_file(self, tmp_path: Path) -> None:
        """README: `vaultsim daemon` exits 2 when it cannot start for lack of room. On a home whose
        file system runs out of inodes (not bytes) at each step of a start in turn, two steps
        exited 1 ("failed after starting": the lock file's and the audit log's errors hid their
        OSError), and a socket that could not be made said "No space left on device" naming no
        file. Now each is 2 naming the file, or the start serves."""
        from vault.runner import world_procs

        root = tmp_path / "r"
        root.mkdir(mode=0o700)
        home = root / "h"
        home.mkdir(mode=0o700)
        env = {**world_procs.home_env(root), "PYTHONPATH": str(ROOT)}

        def vaultsim(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "vault.cli.main", *args], env=env,
                                  capture_output=True, text=True, timeout=60)
        served = refused = 0
        for inodes in range(3, 14):
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=20m,nr_inodes={inodes},mode=0700",
                                   "tmpfs", str(home)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
            try:
                out = vaultsim("daemon", "--unlocked")
                assert "Traceback" not in out.stderr, out.stderr
                if out.returncode == 0:
                    served += 1
                    assert vaultsim("stop").returncode == 0
                    continue
                refused += 1
                assert out.returncode == 2, (inodes, out.stderr)
                assert "No space left on device" in out.stderr, (inodes, out.stderr)
                assert f"{home}/" in out.stderr, (inodes, out.stderr)  # the file it could not make
            finally:
                vaultsim("stop")
                subprocess.run(["umount", "-l", str(home)], capture_output=True)
        assert served and refused >= 5, (served, refused)


class TestSlowHeadersOnTheHttpBridge:
    def test_a_connection_that_never_completes_its_headers_is_closed(self) -> None:
        """uvicorn times out only a kept-alive connection after a response: one that sends
        nothing, or trickles its headers (or, after whole headers, its body: red team 24) a
        byte at a time, held a descriptor of the bridge
        forever (enough of them keep every host out). Now each is closed once HEADER_S has
        passed without a complete request; a host's ordinary request is served as before."""
        import shutil
        import socket

        from helpers import new_sandbox, wait_for
        from mcp_world import start_world
        from test_mcp_http import start_http_bridge
        from vault.mcp.http_deadline import HEADER_S

        box = new_sandbox()
        try:
            start_world(box)
            _, url = start_http_bridge(box)
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            silent = socket.create_connection(("127.0.0.1", port))
            trickle = socket.create_connection(("127.0.0.1", port))
            trickle.sendall(b"POST /mcp HTTP/1.1\r\nHo")
            body = socket.create_connection(("127.0.0.1", port))  # whole headers, then a body a byte at a time
            body.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Accept: application/json, text/event-stream\r\nContent-Length: 4096\r\n\r\n{")
            closed: dict[str, bool] = {}

            def ended(name: str, s: socket.socket) -> bool:
                if name not in closed:
                    s.setblocking(False)
                    try:
                        closed[name] = s.recv(1) == b""
                    except BlockingIOError:
                        if name in ("trickle", "body"):
                            try:  # one more byte now and then: never a whole header, or body
                                s.send(b"s" if name == "trickle" else b" ")
                            except OSError:
                                closed[name] = True
                    except OSError:
                        closed[name] = True
                return closed.get(name, False)
            wait_for(lambda: ended("silent", silent) and ended("trickle", trickle) and ended("body", body),
                     timeout=HEADER_S + 30, interval=0.5, what="the bridge to close slow connections")
            silent.close()
            trickle.close()
            body.close()
            status, text, sid = _http(url, "POST", _INIT)
            assert status == 200 and sid, (status, text)
        finally:
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)
