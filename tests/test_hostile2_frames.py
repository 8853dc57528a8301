"""Second hostile pass on the framing: a client that half-closes (shutdown SHUT_WR) still
gets its answers; one that hangs up entirely while a call waits is noticed.

`socat`, `nc -N` and scripts that say "no more requests" shut their write side and
then read: every request they sent is answered, the last one even without its
newline, and only then does the daemon close. Real daemon, real sockets.
"""

from __future__ import annotations

import json
import socket

import pytest

from helpers import Sandbox, wait_for
from hostile_fixtures import RawClient, frame, hello, served, setup, spawn_script  # noqa: F401 (served: a fixture)


def read_to_eof(sock: socket.socket) -> list[dict]:
    buf = b""
    while chunk := sock.recv(65536):
        buf += chunk
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


def connect(path: object) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(path))
    return s


class TestHalfClosed:
    def test_a_call_in_flight_is_answered_after_the_client_shuts_its_write_side(self, served: Sandbox) -> None:
        """A call that goes to the remote, then SHUT_WR: its Result still arrives, then EOF (it was
        dropped unanswered)."""
        with connect(served.agent_sock) as s:
            s.sendall(frame("session.open", {"agent": "half"}, rid="open"))
            sid = json.loads(s.makefile("rb").readline())["result"]["session_id"]
            s.sendall(frame("call", {"session_id": sid, "operation": "read_issue",
                                     "params": {"issue_id": "ISS-1"}}, rid="call"))
            s.shutdown(socket.SHUT_WR)
            answers = read_to_eof(s)
        assert [("call", "success")] == [(a["id"], a["result"]["category"]) for a in answers]

    def test_the_last_request_needs_no_newline(self, served: Sandbox) -> None:
        """`printf '{...}' | socat - UNIX-CONNECT:agent.sock`: the line ends at EOF and is answered."""
        with connect(served.agent_sock) as s:
            s.sendall(frame("vault.status", {}, rid=7).rstrip(b"\n"))
            s.shutdown(socket.SHUT_WR)
            answers = read_to_eof(s)
        assert [7] == [a["id"] for a in answers] and "result" in answers[0]

    def test_half_a_request_then_eof_gets_a_parse_error(self, served: Sandbox) -> None:
        with connect(served.agent_sock) as s:
            s.sendall(b'{"jsonrpc":"2.0","id":1,"meth')
            s.shutdown(socket.SHUT_WR)
            answers = read_to_eof(s)
        assert [-32700] == [a["error"]["code"] for a in answers]
        assert served.status() is not None

    def test_a_client_that_hangs_up_while_its_call_waits_ends_its_session(self, sandbox: Sandbox) -> None:
        """SHUT_WR with a call waiting for a person keeps the session (its answer can still be
        read); closing entirely afterwards is noticed while the call still waits: the session
        ends, as for any closed connection."""
        served = sandbox  # a fresh daemon: this test process must never have been an agent
        setup(served)
        agent = spawn_script(served, (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['VAULTSIM_SOCKET'])\n"
            "f = s.makefile('rb')\n"
            "s.sendall(b'" + frame("session.open", {"agent": "hangs-up"}).decode() .rstrip("\n")
            + "\\n')\n"
            "sid = json.loads(f.readline())['result']['session_id']\n"
            "s.sendall(json.dumps({'jsonrpc': '2.0', 'id': 2, 'method': 'call', 'params': {\n"
            "    'session_id': sid, 'operation': 'delete_release', 'params': {'release_id': 'r-1'},\n"
            "    'wait_s': 60}}).encode() + b'\\n')\n"
            "s.shutdown(socket.SHUT_WR)\n"
            "print('sent', flush=True)\n"
            "sys.stdin.readline()\n"
            "f.close(); s.close()\n"
            "print('closed', flush=True)\n"
            "sys.stdin.readline()\n"))
        try:
            with RawClient(served.home / "approver.sock") as approver:
                hello(served, approver, "watcher")
                assert "result" in approver.ask(frame("subscribe", {}, rid="sub"))

                def note(method: str) -> dict:
                    while True:
                        msg = json.loads(approver.file.readline())
                        if msg.get("method") == method:
                            return msg["params"]

                assert agent.stdout.readline().strip() == "sent"
                request = note("approval.requested")
                # half-closed, still connected: the session and its waiting call stay
                assert (1, 1) == (served.status()["sessions"], served.status()["pending"])
                agent.stdin.write("\n")
                agent.stdin.flush()
                assert agent.stdout.readline().strip() == "closed"
                closed = note("session.closed")
                assert (closed["session_id"], closed["reason"]) == (request["session_id"], "connection closed")
        finally:
            agent.kill()
            agent.wait()
        assert 0 == served.status()["sessions"]


class TestNotifications:
    """A request without an id gets no answer by JSON-RPC, yet every method here answers: sent
    as a notification it would act unseen. It is refused -32600 (null id) and nothing is done."""

    @pytest.mark.parametrize("method, params", [
        ("session.open", {"agent": "unseen"}),
        ("call", {"session_id": "s-x", "operation": "create_issue", "params": {"title": "t"}}),
        ("vault.status", {})])
    def test_agent_socket(self, served: Sandbox, method: str, params: dict) -> None:
        before = served.status()["sessions"]
        with RawClient(served.agent_sock) as c:
            answer = c.ask(frame(method, params, rid=...))
            assert (None, -32600) == (answer["id"], answer["error"]["code"])
            assert "without an id" in answer["error"]["message"]
            assert "result" in c.ask(frame("vault.status", {}, rid=2))  # the connection serves on
            assert before == served.status()["sessions"]

    def test_approver_lock_is_not_done(self, sandbox: Sandbox) -> None:
        sandbox.start_daemon()
        with RawClient(sandbox.home / "approver.sock") as c:
            hello(sandbox, c)
            answer = c.ask(frame("lock", {}, rid=...))
            assert (None, -32600) == (answer["id"], answer["error"]["code"])
            assert sandbox.status()["locked"] is False


class TestNestingBombs:
    @pytest.mark.parametrize("bomb", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000],
                             ids=["arrays", "objects"])
    def test_too_deep_is_named_not_called_unreadable(self, served: Sandbox, bomb: bytes) -> None:
        """Valid JSON nested past what the parser takes: -32700 saying so (it said 'not a JSON
        text in UTF-8', sending the client to look for an encoding bug), and the daemon serves on."""
        with RawClient(served.agent_sock) as c:
            answer = c.ask(bomb + b"\n")
            assert (None, -32700) == (answer["id"], answer["error"]["code"])
            assert "nested too deeply" in answer["error"]["message"]
            assert "result" in c.ask(frame("vault.status", {}, rid=2))
