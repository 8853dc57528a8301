"""`vaultsim mcp --http 127.0.0.1:PORT`: Streamable HTTP on loopback, one vault session per MCP session.

Real bridge process on a real TCP port; the official Python SDK's streamable
HTTP client (and, where node is there, the TypeScript one) connects by URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox, new_sandbox, wait_for
from mcp_world import Approver, World, bridge_argv, result_of, start_world

pytest.importorskip("mcp.client.streamable_http", reason="the mcp SDK is not installed")


def start_http_bridge(sandbox: Sandbox, *args: str, nofile: int | None = None) -> tuple[subprocess.Popen[str], str]:
    """`vaultsim mcp --http 127.0.0.1:0` (its open-file limit `nofile`, if given); returns the
    process and the URL it printed. Its stderr is the sandbox's mcp-http.stderr."""
    def limit() -> None:
        if nofile is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    errlog = sandbox.root / "mcp-http.stderr"
    proc = sandbox.spawn([PY, *bridge_argv("--http", "127.0.0.1:0", *args)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=open(errlog, "a"), preexec_fn=limit)
    line = wait_for(lambda: proc.poll() is not None or next(
        (ln for ln in errlog.read_text().splitlines() if "serving http://" in ln), None), what="bridge URL")
    assert proc.poll() is None, errlog.read_text()
    return proc, line.split("serving ", 1)[1].strip()


@pytest.fixture(scope="module")
def http_world() -> Iterator[tuple[World, str]]:
    box = new_sandbox()
    try:
        world = start_world(box)
        # a short cancel grace: these tests see a cancel withdraw; the grace itself is test_mcp44's
        _, url = start_http_bridge(box, "--progress-every", "0.2", "--cancel-grace", "0.3")
        yield world, url
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


@asynccontextmanager
async def mcp_http(url: str, name: str = "cursor", version: str = "0.50") -> AsyncIterator[Any]:
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import Implementation

    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write, client_info=Implementation(name=name, version=version)) as s:
            await s.initialize()
            yield s


class TestHttpSessions:
    async def test_each_mcp_session_is_its_own_vault_session(self, http_world: tuple[World, str]) -> None:
        """Two HTTP MCP sessions: two labelled vault sessions (the caller's pid found from the loopback
        peer); a grant in one does not serve the other; ending one (DELETE) ends its grant."""
        world, url = http_world
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_http(url, "cursor") as a:
                async with mcp_http(url, "claude-desktop", "0.9") as b:
                    await a.list_tools()
                    await b.list_tools()
                    sessions = {s["client"]["name"]: s for s in await person.sessions()}
                    call = asyncio.create_task(a.call_tool("create_issue", {"title": "http a"}))
                    req = await person.request()
                    await person.decide(req["request_id"], "allow_session")
                    assert "success" == result_of(await call)["category"]
                    again = result_of(await a.call_tool("create_issue", {"title": "http a2"}))
                    other = asyncio.create_task(b.call_tool("create_issue", {"title": "http b"}))
                    req_b = await person.request()  # b asks: a's grant is a's alone
                    await person.decide(req_b["request_id"], "deny")
                    denied = result_of(await other)
                closed_b = await person.next("session.closed")
                still = await person.sessions()
            closed_a = await person.next("session.closed")
            ended = await person.next("grant.ended")
        finally:
            await person.close()
        assert {"cursor", "claude-desktop"} == set(sessions)
        label = sessions["cursor"]["client"]
        assert (os.getpid(), "mcp-http") == (label["host_pid"], label["via"])
        assert f"cursor 0.50 (pid {os.getpid()}) via mcp-http" == label["text"]
        assert sessions["cursor"]["session_id"] != sessions["claude-desktop"]["session_id"]
        assert "success" == again["category"] and "approval_denied" == denied["category"]
        assert sessions["claude-desktop"]["session_id"] == closed_b["session_id"]
        assert [sessions["cursor"]["session_id"]] == [s["session_id"] for s in still]
        assert sessions["cursor"]["session_id"] == closed_a["session_id"] == ended["session_id"]
        assert 0 == world.issues_titled("http b")

    async def test_cancel_over_http_withdraws(self, http_world: tuple[World, str]) -> None:
        """A client that times out over HTTP cancels; the vault withdraws the request; nothing runs."""
        world, url = http_world
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_http(url) as s:
                call = asyncio.create_task(s.call_tool("create_issue", {"title": "http abandoned"},
                                                       read_timeout_seconds=1.5))
                await person.request()
                with pytest.raises(Exception):
                    await call
                settled = await person.next("approval.settled")
        finally:
            await person.close()
        assert "withdrawn" == settled["state"]
        assert 0 == world.issues_titled("http abandoned")

    async def test_a_modern_client_falls_back_to_a_session(self, http_world: tuple[World, str]) -> None:
        """The SDK's auto-negotiating Client is told this bridge serves sessions, and uses one."""
        from mcp import Client

        world, url = http_world
        async with Client(url) as client:
            read = result_of(await client.call_tool("read_issue", {"issue_id": "ISS-1"}))
            version = client.session.protocol_version
        assert version in ("2025-11-25", "2025-06-18")
        assert "success" == read["category"]

    async def test_a_browser_page_cannot_reach_it(self, http_world: tuple[World, str]) -> None:
        """DNS rebinding: a request naming another host is refused before any session exists."""
        import httpx
        _, url = http_world
        r = httpx.post(url, headers={"Host": "evil.example", "Content-Type": "application/json",
                                     "Accept": "application/json, text/event-stream"},
                       content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        assert r.status_code >= 400
        assert "mcp-session-id" not in {k.lower() for k in r.headers}


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to run a client as another user, and a system python3")
def test_another_users_process_is_refused(http_world: tuple[World, str]) -> None:
    """A TCP port is open to every user: a process of another user gets 403, not this user's vault."""
    _, url = http_world
    probe = ("import urllib.request, urllib.error, sys\n"
             "req = urllib.request.Request(sys.argv[1], method='POST', data=b'{\"jsonrpc\":\"2.0\",\"id\":1,"
             "\"method\":\"initialize\",\"params\":{}}', headers={'Content-Type': 'application/json', "
             "'Accept': 'application/json, text/event-stream'})\n"
             "try:\n    print(urllib.request.urlopen(req).status)\n"
             "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())\n")
    out = subprocess.run(["/usr/bin/python3", "-c", probe, url], user=65534, group=65534, cwd="/",
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert out.stdout.startswith("403"), out.stdout + out.stderr
    assert "another user" in out.stdout


class TestHttpOptions:
    @pytest.mark.parametrize("value", ["0.0.0.0:8080", "192.168.1.5:80", "localhost:80", "127.0.0.1",
                                       "127.0.0.1:99999"])
    def test_only_a_loopback_address_and_port(self, sandbox: Sandbox, value: str) -> None:
        out = sandbox.vaultsim("mcp", "--http", value, "--wait")
        assert 2 == out.returncode
        assert "--http" in out.stderr

    def test_a_taken_port_is_bad_input(self, sandbox: Sandbox) -> None:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        try:
            out = sandbox.vaultsim("mcp", "--http", f"127.0.0.1:{s.getsockname()[1]}", "--wait")
        finally:
            s.close()
        assert 2 == out.returncode and "cannot listen" in out.stderr


@pytest.mark.skipif(shutil.which("node") is None
                    or not (ROOT / "tests" / "mcp_ts" / "node_modules" / "@modelcontextprotocol").is_dir(),
                    reason="node and `npm ci --prefix tests/mcp_ts` are needed for the TypeScript client")
async def test_typescript_client_by_url(http_world: tuple[World, str]) -> None:
    """The TypeScript SDK's Streamable HTTP client: tools, a call, a labelled session."""
    from test_mcp_ts import TS_DIR, structured

    world, url = http_world
    person = await Approver.connect(world.sandbox.home)
    proc = await asyncio.create_subprocess_exec("node", str(TS_DIR / "host.mjs"), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, cwd=str(TS_DIR))
    try:
        async def ask(cmd: dict[str, Any]) -> dict[str, Any]:
            proc.stdin.write((json.dumps(cmd) + "\n").encode())  # type: ignore[union-attr]
            return json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))  # type: ignore[union-attr]

        hello = await ask({"id": "1", "do": "connect", "url": url, "name": "windsurf", "version": "3"})
        tools = await ask({"id": "2", "do": "list"})
        read = await ask({"id": "3", "do": "call", "name": "read_issue", "arguments": {"issue_id": "ISS-1"}})
        labels = [s["client"]["text"] for s in await person.sessions()]
        await ask({"id": "4", "do": "close"})
        closed = await person.next("session.closed")
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        await proc.wait()
        await person.close()
    assert "error" not in hello, hello
    assert [] == tools["invalid"] and "read_issue" in {t["name"] for t in tools["tools"]}
    assert "success" == structured(read)["category"]
    assert [f"windsurf 3 (pid {proc.pid}) via mcp-http"] == [t for t in labels if t.startswith("windsurf")]
    assert closed["session_id"]
