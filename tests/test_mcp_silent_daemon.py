"""A daemon that stops answering (SIGSTOP, or half a line and then nothing) never hangs an MCP host.

Before, the bridge's requests to the daemon had no time limit: a tool call waited for ever, with a
future left behind per call, and the catalog's lock held tools/list too. Now every request a tool
call makes is answered within its own time (a person's wait; a call's remote work) plus 5 s, and
under `vaultsim run` by the task's deadline, as a clear Result; the connection is kept, so a daemon that answers again serves the next call on the
same session, unless it stopped mid-line, when the bridge opens a new one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import Sandbox
from mcp_world import World, eventually, mcp_stdio, result_of, start_world
from vault.client import AsyncRpcClient, DaemonSilent
from vault.mcp.link import VaultLink, WaitPolicy

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


@pytest.mark.timeout(120)
async def test_a_stopped_daemon_gets_a_tool_error_in_time_and_calls_work_once_it_answers(world: World) -> None:
    # under `vaultsim run`: a task whose deadline is 14 s away, so the bridge's calls must have
    # answered by 12 s (its `until`, the deadline less its margin)
    deadline = time.time() + 14
    task = world.sandbox.write("task.json", json.dumps({"agent": "mcp-host", "deadline": deadline, "deadline_s": 14}))
    async with mcp_stdio(world.sandbox, env={**world.sandbox.env, "VAULTSIM_TASK": str(task)}) as s:
        first = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}))
        assert first["ok"], first
        os.kill(world.daemon.pid, signal.SIGSTOP)
        try:
            # the host's own deadline (30 s) is past the task's: the bridge answers first
            silent = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}, read_timeout_seconds=30))
            answered = time.time()
            made = result_of(await s.call_tool("create_issue", {"title": "while stopped", "idempotency_key": "k-1"},
                                               read_timeout_seconds=30))
        finally:
            os.kill(world.daemon.pid, signal.SIGCONT)
        assert (silent["ok"], silent["category"]) == (False, "local_failure"), silent
        assert "did not answer" in silent["message"], silent
        assert answered < deadline, answered - deadline
        await eventually(lambda: world.sandbox.status() is not None, what="the daemon answers again")
        # a change may have happened: reconcile first, and the message says how
        assert (made["category"], made["retry"]) == ("outcome_unknown", "reconcile_first"), made
        assert "vault_lookup" in made["message"], made
        again = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}, read_timeout_seconds=30))
        assert again["ok"], again


async def _half_line_daemon(path: str, sessions: list[str], seen: list[str]) -> asyncio.AbstractServer:
    """Opens sessions; answers a connection's first `call` with half a line and then nothing,
    every later connection's call in full."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sid = f"s-{len(sessions) + 1}"
        sessions.append(sid)
        while line := await reader.readline():
            msg = json.loads(line)
            seen.append(msg["method"])
            if msg["method"] == "session.open":
                out: dict[str, Any] = {"session_id": sid}
            else:
                out = {"ok": True, "category": "success", "operation": msg["params"].get("operation", msg["method"]),
                       "correlation_id": "c-1", "message": "done", "retry": "none"}
            data = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": out}).encode() + b"\n"
            if msg["method"] == "call" and sid == "s-1":
                writer.write(data[: len(data) // 2])  # half a line, and then silence
                await writer.drain()
                continue
            writer.write(data)
            await writer.drain()

    return await asyncio.start_unix_server(serve, path)


@pytest.mark.timeout(60)
async def test_half_a_line_is_a_clear_error_and_the_next_call_opens_a_new_session(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    sessions: list[str] = []
    seen: list[str] = []
    server = await _half_line_daemon(path, sessions, seen)
    # the task's `until` 1 s away: the bridge gives the daemon 1.5 s past it
    link = VaultLink(path, "a", None, None, WaitPolicy(budget_s=0.5, until=time.time() + 1))
    try:
        began = time.monotonic()
        cut = await link.call("create_issue", {"title": "x"}, "k-1", None, mutates=True)
        assert time.monotonic() - began < 15
        assert cut.category.value == "outcome_unknown" and "did not answer" in cut.message, cut
        assert link._client is not None and not link._client._waiting  # nothing left behind
        done = await link.call("create_issue", {"title": "x"}, "k-1", None, mutates=True)
        assert done.ok and sessions == ["s-1", "s-2"], (done, sessions, seen)
    finally:
        await link.close()
        server.close()


@pytest.mark.timeout(60)
async def test_a_client_request_given_up_leaves_no_future_and_the_connection_serves_on(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            msg = json.loads(line)
            if msg["method"] == "slow":
                await release.wait()  # a stopped daemon: its answer comes only after it resumes
            writer.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": msg["method"]}).encode() + b"\n")
            await writer.drain()

    server = await asyncio.start_unix_server(serve, path)
    client = await AsyncRpcClient.connect(path)
    try:
        for _ in range(3):
            with pytest.raises(DaemonSilent, match="did not answer slow within 0.2s"):
                await client.request_within(0.2, "slow")
        assert not client._waiting and not client.closed.is_set()
        release.set()
        assert await client.request_within(5, "quick") == "quick"
    finally:
        await client.close()
        server.close()


@pytest.mark.timeout(60)
async def test_a_line_the_daemon_ends_after_resuming_keeps_the_session_and_its_grants(tmp_path: Path) -> None:
    # (left48) a daemon stopped half-way through its answer, then resumed: it ends the line. The
    # bridge, which closed the connection at the time limit, lost its session and with it the
    # session's grants, though the bridge process lives on (section 3): its next call asked a person
    # again. Now the connection is kept once the line has ended, and the next call is the same session's.
    path = str(tmp_path / "agent.sock")
    sessions: list[str] = []
    resumed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sid = f"s-{len(sessions) + 1}"
        sessions.append(sid)
        calls = 0
        while line := await reader.readline():
            msg = json.loads(line)
            out: dict[str, Any] = {"session_id": sid} if msg["method"] == "session.open" else {
                "ok": True, "category": "success", "operation": "create_issue", "correlation_id": f"c-{sid}",
                "message": "done", "retry": "none"}
            data = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": out}).encode() + b"\n"
            if msg["method"] == "call" and calls == 0:
                calls += 1
                writer.write(data[: len(data) // 2])  # stopped half-way through the answer
                await writer.drain()
                await resumed.wait()
                data = data[len(data) // 2:]  # resumed: the rest of the line
            writer.write(data)
            await writer.drain()

    server = await asyncio.start_unix_server(serve, path)
    link = VaultLink(path, "a", None, None, WaitPolicy(budget_s=0.5, until=time.time() + 1))
    try:
        cut = await link.call("create_issue", {"title": "x"}, "k-1", None, mutates=True)
        assert cut.category.value == "outcome_unknown" and "did not answer" in cut.message, cut
        resumed.set()
        assert link._client is not None
        client = link._client
        await eventually(lambda: not client.partial, what="the rest of the line")
        link.policy = WaitPolicy(budget_s=0.5, until=time.time() + 10)
        done = await link.call("create_issue", {"title": "x"}, "k-1", None, mutates=True)
        assert done.ok and done.correlation_id == "c-s-1", done
        assert sessions == ["s-1"], sessions  # one session: its grants kept
    finally:
        await link.close()
        server.close()
