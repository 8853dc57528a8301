"""A stopped daemon (SIGSTOP) hangs none of the blocking clients (left48; the MCP bridge: test_mcp_silent_daemon).

An agent's `AgentClient` (agent_stub's) waited on the daemon without a bound: now a request gets its
own time plus a margin, never much past the task's deadline (vault.silence), then DaemonSilent.
The scripted approver and the TUI give nothing up (a decision sent again could be a second one):
they say the daemon is not answering once a request has waited, and that it answers again when it
does, the request then answered as usual.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from typing import Any

import pytest

from helpers import Sandbox
from mcp_world import eventually, start_world
from vault.approvers.scripted import ApproverScript, ScriptedApprover
from vault.client import AgentClient, DaemonSilent
from vault.home import VaultHome

from tui.connection import ApproverLink
from tui.messages import LinkAnswering, LinkSilent, LinkUp
from tui.state import TuiState


@pytest.mark.timeout(60)
def test_an_agent_client_gives_a_stopped_daemon_up_by_its_tasks_deadline(sandbox: Sandbox) -> None:
    world = start_world(sandbox)
    until = time.time() + 3  # the task's deadline: the client waits at most 1.5 s past it
    with AgentClient(sandbox.agent_sock, until=until) as client:
        client.open_session("silent-test")
        os.kill(world.daemon.pid, signal.SIGSTOP)
        try:
            with pytest.raises(DaemonSilent, match="did not answer call within"):
                client.call("read_issue", {"issue_id": "ISS-1"}, wait_s=0)
            gave_up = time.time()
        finally:
            os.kill(world.daemon.pid, signal.SIGCONT)
    assert gave_up < until + 4, gave_up - until
    # the daemon answers again: a new client is served
    with AgentClient(sandbox.agent_sock, until=time.time() + 30) as again:
        again.open_session("silent-test")
        assert again.call("read_issue", {"issue_id": "ISS-1"}, wait_s=0).ok


@pytest.mark.timeout(60)
async def test_the_scripted_approver_says_the_daemon_is_silent_and_recovers(sandbox: Sandbox) -> None:
    world = start_world(sandbox)
    approver = ScriptedApprover(ApproverScript(name="ci", rules=[]), io.StringIO())
    said: list[str] = []
    approver.say = said.append  # type: ignore[method-assign]
    approver.watch.after_s = 0.5
    ready = asyncio.Event()
    serving = asyncio.create_task(approver.run(VaultHome(sandbox.home), ready))
    try:
        await asyncio.wait_for(ready.wait(), 20)
        assert approver.client is not None
        os.kill(world.daemon.pid, signal.SIGSTOP)
        try:
            stats = asyncio.create_task(approver.client.request("stats"))
            await eventually(lambda: said, timeout=10, what="the approver to say the daemon is silent")
            assert not stats.done()
        finally:
            os.kill(world.daemon.pid, signal.SIGCONT)
        assert isinstance(await asyncio.wait_for(stats, 20), dict)
        assert said == ["the daemon is not answering (stats waits for it; stopped, or stuck)",
                        "the daemon is answering again"], said
        assert not serving.done()  # no crash: it serves on
    finally:
        if approver.client is not None:
            await approver.client.close()
        await asyncio.wait_for(serving, 10)


@pytest.mark.timeout(60)
async def test_the_tui_shows_daemon_not_answering_and_clears_it(sandbox: Sandbox) -> None:
    world = start_world(sandbox)
    posted: list[Any] = []
    link = ApproverLink(VaultHome(sandbox.home), "person", posted.append)
    link.watch.after_s = 0.5
    running = asyncio.create_task(link.run())
    try:
        await eventually(lambda: any(isinstance(m, LinkUp) for m in posted), timeout=20, what="the link up")
        os.kill(world.daemon.pid, signal.SIGSTOP)
        try:
            stats = asyncio.create_task(link.call("stats"))
            await eventually(lambda: any(isinstance(m, LinkSilent) for m in posted), timeout=10,
                             what="the link to say the daemon is silent")
        finally:
            os.kill(world.daemon.pid, signal.SIGCONT)
        assert isinstance(await asyncio.wait_for(stats, 20), dict)
        await eventually(lambda: any(isinstance(m, LinkAnswering) for m in posted), timeout=10, what="answering")
        assert not running.done()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    # what the person sees: the status line says it, and stops saying it once answers come
    state = TuiState()
    state.link_up([], False)
    state.daemon_silent("decide", 0.0)
    assert state.silent and "decide waits" in state.silent
    state.daemon_answering(1.0)
    assert not state.silent and [a.text for a in state.activity][-1] == "the daemon is answering again"
