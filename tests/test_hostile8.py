"""Eighth hostile pass: hostile hosts of the MCP bridge, and the daemon beside them.

Real processes only: a daemon with its fake remote, `vaultsim mcp` on real
pipes, raw lines written as a host (or an attacker) would write them.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox, audit_verified_intact, new_sandbox, remote_events, wait_for
from hostile_fixtures import TOKEN, RawClient, frame, hello, run_script, served, setup, spawn_script  # noqa: F401

pytest.importorskip("mcp.server.stdio", reason="the mcp SDK is not installed")


class StdioHost:
    """`vaultsim mcp` on pipes, spoken to line by line as an MCP host would."""

    def __init__(self, box: Sandbox) -> None:
        self.stderr = box.root / f"mcp-{time.monotonic_ns()}.stderr"
        self.proc = box.spawn([PY, "-m", "vault.cli.main", "mcp"], cwd=ROOT, text=False,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.stderr, "wb"))
        self.buf = b""
        init = self.ask({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "8"}}})
        assert "result" in init, init
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def answer(self, timeout: float = 20) -> dict[str, Any]:
        """The next message that is not a notification; fails after `timeout` s without one."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
                assert ready, f"no answer from the bridge within {timeout} s (the host would wait forever)"
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                assert chunk, f"the bridge exited: {self.stderr.read_text()[-2000:]}"
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if "method" not in msg:
                return msg

    def ask(self, msg: dict[str, Any] | bytes) -> dict[str, Any]:
        self.send(msg if isinstance(msg, bytes) else json.dumps(msg).encode() + b"\n")
        return self.answer()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def tool_call(rid: int, name: str, arguments: Any) -> bytes:
    # json.dumps writes a lone surrogate as the escape \ud800, as a JavaScript host's JSON.stringify does
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}}).encode() + b"\n"


def structured(answer: dict[str, Any]) -> dict[str, Any]:
    return answer["result"]["structuredContent"]


class TestMcpHostSendsWhatTheSdkCannotRead:
    """A line the MCP SDK cannot parse was dropped with a debug log: the host's call waited forever."""

    UNREADABLE = [
        ("lone surrogate in an argument", tool_call(11, "read_issue", {"issue_id": "ISS-\ud800"}), 11, -32602,
         "params.arguments.issue_id"),
        ("lone surrogate in the tool name", tool_call(12, "read\udfff", {"issue_id": "ISS-1"}), 12, -32602,
         "params.name"),
        ("lone surrogate in a resume token", tool_call(13, "vault_resume", {"resume_token": "\ud800"}), 13, -32602,
         "params.arguments.resume_token"),
        ("arguments nested 300 deep", b'{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"read_issue",'
         b'"arguments":{"issue_id":' + b"[" * 300 + b"]" * 300 + b"}}}\n", 14, -32700, "recursion limit"),
        ("an integer of 5,000 digits", b'{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"read_issue",'
         b'"arguments":{"issue_id":' + b"9" * 5000 + b"}}}\n", 15, -32700, "number out of range"),
        ("not JSON", b"\xff\xfe{not json\n", None, -32700, "Invalid JSON"),
    ]

    @pytest.mark.parametrize("line, rid, code, named", [c[1:] for c in UNREADABLE], ids=[c[0] for c in UNREADABLE])
    def test_the_host_gets_an_error_with_its_id_and_the_bridge_serves_on(
            self, served: Sandbox, line: bytes, rid: int | None, code: int, named: str) -> None:
        """Answered at once, with the request's id where one can be read (else null), a JSON-RPC code
        and the reason; the next call on the same bridge succeeds."""
        host = StdioHost(served)
        try:
            answer = host.ask(line)
            assert (rid, code) == (answer["id"], answer["error"]["code"]), answer
            assert named in answer["error"]["message"], answer
            ok = host.ask(tool_call(20, "read_issue", {"issue_id": "ISS-1"}))
            assert "success" == structured(ok)["category"], ok
        finally:
            host.close()


class TestMcpWaitArgument:
    def test_a_wait_past_a_float_s_range_is_the_longest_wait_not_a_crash(self, served: Sandbox) -> None:
        """wait_s of 4,000 digits raised OverflowError in the bridge: answered with JSON-RPC code 0
        and a traceback in its log. Now it is the longest wait, as 1e300 was (the budget caps it)."""
        host = StdioHost(served)
        try:
            answer = host.ask(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_issue",'
                              b'"arguments":{"issue_id":"ISS-1","wait_s":' + b"9" * 4000 + b"}}}\n")
            assert "success" == structured(answer)["category"], answer
        finally:
            host.close()
        assert "Traceback" not in host.stderr.read_text()


# -- a disk that stops taking writes ---------------------------------------------------


@pytest.fixture
def frozen_diagnostics() -> Iterator[tuple[Sandbox, Callable[[], None], Callable[[], None]]]:
    """A sandbox whose vault home's `diagnostics/` is a small ext4 file system of its own, with
    (freeze, thaw): a frozen file system takes no write until thawed (fsfreeze), as a disk
    in error recovery or a hung network mount. Root only; skipped with the reason elsewhere."""
    box = new_sandbox()
    where = box.root / "h" / "diagnostics"
    where.mkdir(parents=True, mode=0o700)
    os.chmod(box.root / "h", 0o700)
    image = box.root / "diag.ext4"
    made = subprocess.run(f"truncate -s 16M {image} && mkfs.ext4 -q -F {image} && mount -o loop {image} {where}",
                          shell=True, capture_output=True, text=True)
    if made.returncode != 0:
        box.close()
        pytest.skip(f"cannot mount a loop file system here (needs root): {made.stderr.strip()}")
    os.chmod(where, 0o700)
    frozen = False

    def freeze() -> None:
        nonlocal frozen
        subprocess.run(["fsfreeze", "-f", str(where)], check=True)
        frozen = True

    def thaw() -> None:
        nonlocal frozen
        if frozen:
            subprocess.run(["fsfreeze", "-u", str(where)], check=True)
            frozen = False

    try:
        yield box, freeze, thaw
    finally:
        thaw()  # first: a process writing there would never end
        box.close()
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        shutil.rmtree(box.root, ignore_errors=True)


def waits_on_disk(pid: int) -> bool:
    """Is a thread of `pid` in uninterruptible sleep (state D: here, a write to the frozen disk)?"""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] == "D":
            return True
    return False


FAILING_CALL = ("client.open_session('failing', 'run-1')\n"
                "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n")


class TestDiagnosticsOnAStalledDisk:
    def test_other_clients_are_served_while_a_failed_call_s_diagnostic_waits_for_the_disk(
            self, frozen_diagnostics: tuple[Sandbox, Callable[[], None], Callable[[], None]]) -> None:
        """A failed call's diagnostic was written (two fsyncs) in the event loop: on a disk that
        stalls, every client waited with it; an agent looping on failing calls made the whole
        vault as slow as the disk's fsync. Now it is written off the loop: while it waits, another
        client's status and the approver's lock answer at once; once the disk takes writes again,
        the failed call is answered with its diagnostic, and the audit log verifies."""
        box, freeze, thaw = frozen_diagnostics
        _, url = box.start_remote({"tracker_token": TOKEN}, fault="permission_denied")
        box.set_secret("tracker_token", TOKEN)
        box.start_daemon("--remote", url)
        first = run_script(box, FAILING_CALL)[0]
        assert ("authorization_denied", True) == (first["category"], first.get("diagnostic_id", "").startswith("d-"))
        seen, pid = len(remote_events(url)), box.status()["pid"]
        freeze()
        agent = spawn_script(box, FAILING_CALL)
        wait_for(lambda: len(remote_events(url)) > seen, what="the failing call to reach the remote")
        wait_for(lambda: waits_on_disk(pid), what="the daemon to wait on the frozen disk")
        with RawClient(box.agent_sock, timeout=5) as other:
            started = time.monotonic()
            assert other.ask(frame("vault.status"))["result"]["halted"] is None
            assert time.monotonic() - started < 2
        with RawClient(box.home / "approver.sock", timeout=5) as person:
            hello(box, person)
            assert "result" in person.ask(frame("lock"))
            assert "result" in person.ask(frame("unlock"))
        assert agent.poll() is None  # its answer waits for its diagnostic
        thaw()
        out, err = agent.communicate(timeout=60)
        assert 0 == agent.returncode, err
        late = json.loads(out.splitlines()[0])
        assert "authorization_denied" == late["category"] and late["diagnostic_id"].startswith("d-")
        shown = box.vaultsim("diag", "show", late["diagnostic_id"])
        assert 0 == shown.returncode and "403" in shown.stdout, shown.stderr
        audit_verified_intact(box)


class TestNotANumber:
    """JSON's NaN and Infinity (Python's reader takes both) in a number field were refused with a
    wrong reason: NaN "should be less than or equal to 86400"."""

    def test_agent_socket_names_it(self, served: Sandbox) -> None:
        # params are checked before the session: no session opened by this process (it would not
        # be let in as an approver after)
        with RawClient(served.agent_sock) as raw:
            for value in (b"NaN", b"Infinity", b"-Infinity"):
                answer = raw.ask(b'{"jsonrpc":"2.0","id":4,"method":"call","params":{"session_id":"s-x",'
                                 b'"operation":"read_issue","params":{"issue_id":"ISS-1"},"wait_s":' + value + b"}}\n")
                assert (4, -32602) == (answer["id"], answer["error"]["code"])
                assert "wait_s: Input should be a finite number" in answer["error"]["message"], answer

    def test_approver_socket_names_it(self, served: Sandbox) -> None:
        with RawClient(served.home / "approver.sock") as raw:
            hello(served, raw)
            answer = raw.ask(b'{"jsonrpc":"2.0","id":5,"method":"stats","params":{"rubber_stamp_s":NaN}}\n')
            assert (5, -32602) == (answer["id"], answer["error"]["code"])
            assert "rubber_stamp_s: Input should be a finite number" in answer["error"]["message"], answer


REFUSED_LOCKS = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rb")
for start in range(0, 2000, 50):  # 50 at a time: under the 64 requests a connection may have in progress
    s.sendall(b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"lock"}\n' % i for i in range(start, start + 50)))
    for _ in range(50):
        assert "say approver.hello" in json.loads(f.readline())["error"]["message"]
print("done", flush=True)
"""


class TestRefusedApproverAttemptsFlood:
    def test_a_flood_of_refused_attempts_is_recorded_a_bounded_number_of_times(self, sandbox: Sandbox) -> None:
        """Every refused hello, decide, lock or unlock was an audit record (about 550 bytes): a
        process on the approver socket, no token needed, grew the log by megabytes a second until
        the disk filled and the vault stopped serving calls. Now a process's first 32 refused
        attempts are recorded, then only its 64th, 128th, ... (each saying its number), as the
        agent socket bounds refused hand-offs; accepted ones are all recorded."""
        from audit_daemon_helpers import events
        setup(sandbox)
        flooder = sandbox.spawn([PY, "-c", REFUSED_LOCKS, str(sandbox.home / "approver.sock")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = flooder.communicate(timeout=120)
        assert "done" in out, err
        with RawClient(sandbox.home / "approver.sock") as person:  # accepted attempts: all recorded
            hello(sandbox, person)
            for _ in range(40):
                assert "result" in person.ask(frame("lock"))
        audit_verified_intact(sandbox)
        attempts = [e for e in events(sandbox) if e["type"] == "approver_attempt" and e["method"] == "lock"]
        refused = [e for e in attempts if e["pid"] == flooder.pid]
        assert 32 + 5 == len(refused)  # the first 32, then the 64th, 128th, 256th, 512th and 1024th
        assert all("say approver.hello" in e["reason"] for e in refused)
        assert "refused attempt 1024 of this process" in refused[-1]["reason"]
        assert 40 == sum(e["accepted"] for e in attempts)


class TestFakeRemoteBody:
    def test_a_body_nested_too_deeply_is_invalid_json_not_a_dropped_connection(self, sandbox: Sandbox) -> None:
        """The fake remote (reachable by any local client holding a token) parsed a body nested
        10,000 deep into a RecursionError: the connection closed unanswered and a traceback went
        to its log. Now 400 invalid_json, as any body that is not a JSON object, and it serves on."""
        from urllib.parse import urlsplit
        _, url = sandbox.start_remote({"tracker_token": TOKEN})
        where = urlsplit(url)
        body = b"[" * 10_000 + b"]" * 10_000
        with socket.create_connection((where.hostname, where.port), timeout=10) as conn:
            conn.sendall(b"POST /v1/issues HTTP/1.1\r\nHost: remote\r\nAuthorization: Bearer " + TOKEN.encode()
                         + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            head = conn.recv(4096)
        assert head.startswith(b"HTTP/1.1 400 ") and b'"invalid_json"' in head, head
        import httpx
        ok = httpx.get(f"{url}/v1/issues/ISS-1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert 200 == ok.status_code
        assert "Traceback" not in (sandbox.root / "remote.stderr").read_text()


@pytest.fixture
def read_only_home(sandbox: Sandbox) -> Iterator[tuple[Sandbox, Callable[[], None]]]:
    """A sandbox with one credential whose vault home is then made read-only (a read-only bind
    mount over it, as a file system remounted read-only after errors), and a way to clear that."""
    sandbox.set_secret("A", "alpha-value")
    home = str(sandbox.home)
    done = subprocess.run(f"mount --bind {home} {home} && mount -o remount,ro,bind {home}", shell=True,
                          capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["umount", home], capture_output=True)
        pytest.skip(f"cannot bind-mount here (needs root): {done.stderr.strip()}")
    mounted = True

    def clear() -> None:
        nonlocal mounted
        if mounted:
            subprocess.run(["umount", home], check=True)
            mounted = False

    try:
        yield sandbox, clear
    finally:
        if mounted:
            subprocess.run(["umount", "-l", home], capture_output=True)


class TestReadOnlyHome:
    def test_secret_set_says_why_in_one_line_and_keeps_the_credentials(
            self, read_only_home: tuple[Sandbox, Callable[[], None]]) -> None:
        """`secret set` on a read-only home ended in a traceback ("internal error (a bug in
        vaultsim)", exit 3): opening the lock file raised EROFS. Now one line naming the file and
        the cause, exit 1 as for any store that cannot be written; once the home is writable again
        the same command works and the earlier credential is still there."""
        box, clear = read_only_home
        out = box.vaultsim("secret", "set", "B", input="beta-value")
        assert 1 == out.returncode, out.stderr
        assert "Traceback" not in out.stderr and 1 == len(out.stderr.strip().splitlines()), out.stderr
        assert str(box.home / "credentials.lock") in out.stderr and "Read-only file system" in out.stderr
        clear()
        box.set_secret("B", "beta-value")
        listed = box.vaultsim("secret", "list", "--json")
        assert ["A", "B"] == [c["name"] for c in json.loads(listed.stdout)]


class TestDiagnosticsThatCannotBeKept:
    def test_the_call_is_answered_and_the_log_says_why(self, sandbox: Sandbox) -> None:
        """`diagnostics/` replaced by a file mid-run: the failed call is answered (no diagnostic
        id), and the daemon's log said only "could not store diagnostic: VaultError"; now it
        names the directory and what is wrong with it (our own text: no input, no secret)."""
        _, url = sandbox.start_remote({"tracker_token": TOKEN}, fault="permission_denied")
        sandbox.set_secret("tracker_token", TOKEN)
        sandbox.start_daemon("--remote", url)
        assert run_script(sandbox, FAILING_CALL)[0]["diagnostic_id"].startswith("d-")
        where = sandbox.home / "diagnostics"
        shutil.rmtree(where)
        where.write_text("not a directory")
        answer = run_script(sandbox, FAILING_CALL)[0]
        assert "authorization_denied" == answer["category"] and answer.get("diagnostic_id") is None
        logged = (sandbox.root / "daemon.stderr").read_text()
        assert f"could not store diagnostic: " in logged and str(where) in logged, logged[-1000:]
        assert TOKEN not in logged


class TestDaemonInputFilesThatAreNotFiles:
    @pytest.mark.parametrize("option", ["--policy", "--catalog", "--config"])
    def test_a_fifo_is_refused_at_once_not_waited_on(self, sandbox: Sandbox, option: str) -> None:
        """`vaultsim daemon --policy F` where F is a FIFO (or /dev/zero, a terminal) waited forever
        for a writer (or read without end): the daemon never started and never said why. Now exit
        2 at once naming the file: only a regular file is read."""
        fifo = sandbox.root / "policy.yaml"
        os.mkfifo(fifo)
        out = sandbox.vaultsim("daemon", "--foreground", "--unlocked", option, str(fifo), timeout=30)
        assert 2 == out.returncode, out.stderr
        assert f"{fifo}: not a regular file" in out.stderr and "Traceback" not in out.stderr

    def test_dev_zero_is_refused_not_read_without_end(self, sandbox: Sandbox) -> None:
        out = sandbox.vaultsim("daemon", "--foreground", "--unlocked", "--catalog", "/dev/zero", timeout=30)
        assert 2 == out.returncode and "/dev/zero: not a regular file" in out.stderr, out.stderr


class TestCredentialsFileSwappedForAFifo:
    def test_calls_are_refused_with_the_reason_and_the_daemon_serves_on(self, sandbox: Sandbox) -> None:
        """A same-user process (an agent run without the jail) swaps credentials.enc for a FIFO: the
        next call read it in the event loop and waited forever for a writer, and with it every
        client and the person's lock. Now the call is refused naming the file (nothing sent), the
        daemon answers others, and once the file is back calls succeed."""
        setup(sandbox)
        creds = sandbox.home / "credentials.enc"
        kept = sandbox.root / "credentials.kept"
        os.rename(creds, kept)
        os.mkfifo(creds, 0o600)
        refused = run_script(sandbox, "client.open_session('a', 'run-1')\n"
                                      "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n", timeout=60)[0]
        assert "local_failure" == refused["category"]
        assert f"{creds} is not a regular file" in refused["message"], refused
        with RawClient(sandbox.agent_sock, timeout=10) as other:
            assert other.ask(frame("vault.status"))["result"]["halted"] is None
        os.unlink(creds)
        os.rename(kept, creds)
        again = run_script(sandbox, "client.open_session('a', 'run-1')\n"
                                    "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n")[0]
        assert "success" == again["category"]


class TestReportReadersAndFifos:
    @pytest.mark.parametrize("command", [("report", "merge"), ("policy", "suggest")])
    def test_a_fifo_report_is_refused_at_once(self, tmp_path: Path, command: tuple[str, str]) -> None:
        """`vaultsim report merge A B` and `vaultsim policy suggest REPORT` read each report whole:
        a FIFO given as one (a shell's `<(...)` that never writes) was waited on forever. Now exit 2
        at once naming the file."""
        fifo = tmp_path / "report.json"
        os.mkfifo(fifo)
        out = subprocess.run([PY, "-m", "vault.cli.main", *command, str(fifo), str(fifo)], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert 2 == out.returncode, out.stderr
        assert f"{fifo}: not a regular file" in out.stderr and "Traceback" not in out.stderr
