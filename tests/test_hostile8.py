"""Eighth hostile pass: hostile hosts of the MCP bridge, and the daemon beside them.

Real processes only: a daemon with its fake remote, `vaultsim mcp` on real
pipes, raw lines written as a host (or an attacker) would write them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox
from hostile_fixtures import served  # noqa: F401

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
