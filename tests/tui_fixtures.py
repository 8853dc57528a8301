"""Shared pieces for the TUI tests: recorded daemon payloads, agents, polling.

The recorded payloads have exactly the shape the daemon sends (a Pilot test
checks their keys against a live daemon), with fixed ids and times so the
snapshot tests are byte-for-byte stable. Agents are real fresh processes
started with asyncio so the app keeps running while a test waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from textual.pilot import Pilot

from helpers import Sandbox
from tui.app import VaultApp
from tui.messages import DaemonNotice, LinkUp, SessionsLoaded, StatsLoaded
from tui.screens.main import MainScreen
from tui.widgets.pending import PendingTable
from vault.client import ApproverClient
from vault.home import VaultHome
from vault.runner import world_procs

# 2026-01-01 00:00:00 UTC: the frozen "now" of every snapshot
NOW = 1767225600.0


def frozen() -> float:
    return NOW


def request(rid: str, op: str, risk: str, params: dict[str, Any], scope: str, *, agent: str = "triage-bot",
            pid: int = 4121, session: str = "s-0001", mode: str = "session", owner: str | None = None,
            created: float = -20, left: float = 100) -> dict[str, Any]:
    offered = mode == "session"
    return {
        "request_id": rid, "agent": agent, "pid": pid, "session_id": session, "run_id": "run-7",
        "operation": op, "risk": risk, "params": params, "scope": scope,
        "session_scope": (f"{scope} until process {pid} exits" if offered
                          else f"not offered: {op} asks every call (per_call)"),
        "mode": mode, "allow_session_offered": offered, "owner": owner,
        "deadline": NOW + left, "created": NOW + created, "correlation_id": f"c-{rid[2:]}",
    }


PENDING = [
    request("r-0001", "create_issue", "create", {"title": "flaky test in ci"}, "create_issue on tracker",
            created=-25, left=95),
    request("r-0002", "delete_release", "delete", {"release_id": "v1.4.2"},
            "delete_release on release v1.4.2", mode="per_call", created=-2, left=118),
    request("r-0003", "update_record", "update", {"record_id": "dns-1", "value": "[hidden]"},
            "update_record on record dns-1", agent="sync-agent", pid=4188, session="s-0002",
            owner="human", created=-108, left=12),
]

SESSIONS = [
    {"session_id": "s-0001", "agent": "triage-bot", "run_id": "run-7", "pid": 4121,
     "exe": "/usr/bin/python3", "opened": NOW - 300, "lineage": [[4121, 5120.5], [4100, 5118.25]],
     "gone": []},
    {"session_id": "s-0002", "agent": "sync-agent", "run_id": "run-7", "pid": 4188,
     "exe": "/usr/bin/python3", "opened": NOW - 200, "lineage": [[4188, 5220.5], [4100, 5118.25]],
     "gone": []},
]

GRANTS = [
    {"grant_id": "g-0001", "session_id": "s-0001", "operation": "attach_note",
     "scope": "attach_note on tracker", "pid": 4121, "created": NOW - 240, "expires_at": None},
    {"grant_id": "g-0002", "session_id": "s-0002", "operation": "create_deployment",
     "scope": "create_deployment on deployments to staging", "pid": 4188, "created": NOW - 150,
     "expires_at": NOW + 3600},
]


def counts(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "prompts": 6,
        "by_operation": {"create_issue": 2, "attach_note": 1, "read_issue": 1, "delete_release": 1,
                         "update_record": 1},
        "by_risk": {"create": 2, "update": 2, "read": 1, "delete": 1},
        "scopes_asked": {"create_issue on tracker": 2, "attach_note on tracker": 1,
                         "read_issue on tracker": 1, "delete_release on release v1.4.2": 1,
                         "update_record on record dns-1": 1},
        "scopes_granted": {"create_issue on tracker": 1, "attach_note on tracker": 1,
                           "read_issue on tracker": 1},
        "decisions": {"allow_session": 2, "allow_once": 1},
        "time_to_decision_ms": {"count": 3, "p50": 2100.0, "max": 5300.0},
        "repeated_scope_prompts": 1, "read_prompts": 1, "destructive_session_grants": 0,
        "unroutable": 0, "locked_refusals": 0,
    }
    base.update(over)
    return base


STATS = {"runs": {"run-7": counts()}, "sessions": {}}

ACTIVITY = [
    ("activity", {"time": NOW - 280, "agent": "triage-bot", "pid": 4121, "session_id": "s-0001",
                  "operation": "read_issue", "category": "success", "retry": "none", "correlation_id": "c-a1",
                  "kind": "call", "gone": [], "asked": NOW - 280.01}),
    ("approval.settled", {"request_id": "r-0000", "state": "allowed", "decision": "allow_session",
                          "by": "human"}),
    ("activity", {"time": NOW - 60, "agent": "triage-bot", "pid": 4121, "session_id": "s-0001",
                  "operation": "create_issue", "category": "success", "retry": "none",
                  "correlation_id": "c-a2", "kind": "call", "gone": [], "asked": NOW - 60.2}),
]


async def feed(app: VaultApp, *, pending: bool = True, locked: bool = False) -> None:
    """Put the recorded daemon conversation into an unlinked app, as the link would."""
    app.post_message(LinkUp([], locked=False))
    app.post_message(SessionsLoaded(SESSIONS))
    for g in GRANTS:
        app.post_message(DaemonNotice("grant.created", g))
    for method, params in ACTIVITY:
        app.post_message(DaemonNotice(method, params))
    if pending:
        for p in PENDING:
            app.post_message(DaemonNotice("approval.requested", p))
    app.post_message(StatsLoaded(STATS))
    if locked:
        app.post_message(DaemonNotice("vault.locked", {"locked": True, "by": "human"}))


def offline_app() -> VaultApp:
    """An app with no daemon, a frozen clock and a pretend home, for snapshots."""
    app = VaultApp(None, clock=frozen)
    app.state.home = "/tmp/vs-demo/h"
    return app


# ---- polling (no fixed sleeps) -----------------------------------------------------------

async def until(pilot: Pilot, pred: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Let the app run until `pred()` is truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


# ---- agents ----------------------------------------------------------------------------

AGENT_PRELUDE = (
    "import json, os, sys\n"
    "from vault.client import AgentClient\n"
    "client = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=120)\n"
    "client.open_session(os.environ.get('AGENT_NAME', 'stub'), os.environ['VAULTSIM_RUN_ID'])\n"
    "def call(op, **params):\n"
    "    print(client.call(op, params).to_json(), flush=True)\n"
    "def pause():\n"
    "    print(json.dumps({'paused': True}), flush=True)\n"
    "    sys.stdin.readline()\n"
)


@dataclass
class Agent:
    """A fresh agent process running a few lines of Python against the agent socket."""

    proc: asyncio.subprocess.Process
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def next(self, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        assert line, "the agent exited early"
        out = json.loads(line)
        self.lines.append(out)
        return out

    async def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        await self.proc.stdin.drain()

    async def finish(self, timeout: float = 60) -> list[dict[str, Any]]:
        assert self.proc.stdout is not None
        rest, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        for line in rest.decode().splitlines():
            if line.startswith("{"):
                self.lines.append(json.loads(line))
        assert self.proc.returncode == 0
        return self.lines

    def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def start_agent(sandbox: Sandbox, body: str, *, run_id: str = "run-1", name: str = "stub") -> Agent:
    env = world_procs.agent_env(sandbox.env, sandbox.agent_sock, run_id, {"AGENT_NAME": name})
    with open(sandbox.root / "agent.stderr", "a") as err:
        proc = await world_procs.start_agent_async(world_procs.python_argv(AGENT_PRELUDE + body), env=env,
                                                   stderr=err)
    return Agent(proc)


# ---- a TUI on a live daemon ------------------------------------------------------------

@pytest.fixture
async def agents() -> AsyncIterator[list[Agent]]:
    """Agents a test started; killed and waited for on the test's own loop, so that no process
    transport outlives it (one finalised after its loop closed raises inside whatever runs
    then: on CPython 3.11.7 a module being compiled fails with "AST constructor recursion
    depth mismatch", gh-106905)."""
    started: list[Agent] = []
    yield started
    for a in started:
        a.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(a.proc.wait(), 10)


@asynccontextmanager
async def tui(sandbox: Sandbox) -> AsyncIterator[Pilot]:
    app = VaultApp(VaultHome(sandbox.home))
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.state.connected, "the TUI to subscribe")
        yield pilot


async def agent(sandbox: Sandbox, agents: list[Agent], body: str, run_id: str = "run-1") -> Agent:
    a = await start_agent(sandbox, body, run_id=run_id)
    agents.append(a)
    return a


def daemon_stats(sandbox: Sandbox, run_id: str = "run-1") -> dict[str, Any]:
    with ApproverClient.for_home(VaultHome(sandbox.home), "test-peek") as c:
        return c.request("stats", run_id=run_id)["runs"].get(run_id, {"prompts": 0, "decisions": {}})


def daemon_status(sandbox: Sandbox) -> dict[str, Any]:
    with ApproverClient.for_home(VaultHome(sandbox.home), "test-peek") as c:
        return c.request("status")


def main(pilot: Pilot) -> MainScreen:
    screen = pilot.app.screen
    assert isinstance(screen, MainScreen)
    return screen


def rows(pilot: Pilot) -> int:
    return main(pilot).query_one(PendingTable).row_count


def text_of(widget: Any) -> str:
    return str(widget.render())
