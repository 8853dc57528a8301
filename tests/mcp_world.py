"""A vault world as an MCP host sees it, for the MCP tests.

Real processes: the fake remote with its effect ledger, the daemon, `vaultsim
mcp` started by an official MCP client the way hosts start it. The approver
is the test itself on the approver socket: requests arrive as events and the
test decides when it chooses, so nothing waits a fixed time.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from helpers import PY, ROOT, Sandbox, canary, remote_ledger, sim_headers
from vault.runner import world_procs

EVENT_TIMEOUT_S = 30.0  # generous: the machine is shared; a wait ends on its event, not on this


@dataclass
class World:
    sandbox: Sandbox
    url: str
    secret: str
    daemon: Any = None

    def ledger(self) -> dict[str, Any]:
        return remote_ledger(self.url)

    def issues_titled(self, title: str) -> int:
        return sum(1 for i in self.state("issues") if i.get("title") == title)

    def state(self, collection: str) -> list[dict[str, Any]]:
        import httpx
        data = httpx.get(f"{self.url}/_sim/state", headers=sim_headers(self.url), timeout=10).json()
        items = data.get(collection, [])
        return list(items.values()) if isinstance(items, dict) else list(items)


def start_world(sandbox: Sandbox, *daemon_args: str) -> World:
    """Remote + credentials (a canary value) + an unlocked daemon pointed at the remote."""
    secret = canary()
    creds = {"tracker_token": secret, "releases_token": secret, "builds_token": secret,
             "deploy_token": secret, "records_token": secret}
    _, url = sandbox.start_remote(creds)
    for name in creds:
        sandbox.set_secret(name, secret)
    daemon = sandbox.start_daemon("--remote", url, *daemon_args)
    return World(sandbox, url, secret, daemon)


@dataclass
class Approver:
    """A person at the approver socket, driven by the test."""

    client: Any
    events: dict[str, asyncio.Queue[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    async def connect(cls, home: Path, name: str = "person") -> "Approver":
        from vault.client import connect_approver
        from vault.home import VaultHome

        self = cls(None)
        self.client, _ = await connect_approver(VaultHome(home), name, self._on_notify)
        return self

    def _queue(self, method: str) -> asyncio.Queue[dict[str, Any]]:
        return self.events.setdefault(method, asyncio.Queue())

    async def _on_notify(self, method: str, params: dict[str, Any]) -> None:
        self._queue(method).put_nowait(params)

    async def next(self, method: str, timeout: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        return await asyncio.wait_for(self._queue(method).get(), timeout)

    def seen(self, method: str) -> int:
        return self._queue(method).qsize()

    async def request(self, timeout: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        return await self.next("approval.requested", timeout)

    async def decide(self, request_id: str, decision: str) -> dict[str, Any]:
        return await self.client.request("decide", request_id=request_id, decision=decision)

    async def sessions(self) -> list[dict[str, Any]]:
        return (await self.client.request("sessions"))["sessions"]

    async def close(self) -> None:
        await self.client.close()


_RELAY = """
import json, os, sys
from vault.client import AgentClient
from vault.errors import RpcError
c = AgentClient(os.environ["RELAY_SOCKET"])
for line in sys.stdin:
    req = json.loads(line)
    try:
        out = {"result": c.request(req["method"], **req["params"])}
    except RpcError as exc:
        out = {"error": exc.message, "code": exc.rpc_code}
    print(json.dumps(out), flush=True)
"""


class RelayAgent:
    """An agent in its own process that sends what the test tells it to: the test process can then
    be the approver (an agent's own process, or its parent, may never decide its requests)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, sandbox: Sandbox) -> "RelayAgent":
        proc = await world_procs.start_agent_async(
            world_procs.python_argv(_RELAY), env={**sandbox.env, "RELAY_SOCKET": str(sandbox.agent_sock)})
        return cls(proc)

    async def request(self, method: str, **params: Any) -> Any:
        from vault.errors import RpcError

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"method": method, "params": params}) + "\n").encode())
        await self.proc.stdin.drain()
        out = json.loads(await asyncio.wait_for(self.proc.stdout.readline(), EVENT_TIMEOUT_S))
        if "error" in out:
            raise RpcError(out["code"], out["error"])
        return out["result"]

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


def bridge_argv(*args: str) -> list[str]:
    return ["-m", "vault.cli.main", "mcp", *args]


@asynccontextmanager
async def mcp_stdio(sandbox: Sandbox, *args: str, name: str = "pytest-host", version: str = "7.1",
                    message_handler: Any = None, env: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """An initialized official-SDK ClientSession on `vaultsim mcp ARGS` over stdio (handshake era)."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp_types import Implementation

    params = StdioServerParameters(command=PY, args=bridge_argv(*args), env=env or sandbox.env, cwd=str(ROOT))
    with open(sandbox.root / "mcp.stderr", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, client_info=Implementation(name=name, version=version),
                                     message_handler=message_handler) as session:
                await session.initialize()
                yield session


def result_of(tool_result: Any) -> dict[str, Any]:
    """The vault Result of a tool call: its structured content, which must equal its text."""
    data = tool_result.structured_content
    assert data == json.loads(tool_result.content[0].text)
    return data


async def eventually(pred: Any, timeout: float = EVENT_TIMEOUT_S, what: str = "condition") -> Any:
    """Poll an async or plain predicate with a deadline (for state with no event of its own)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


__all__ = ["Approver", "RelayAgent", "World", "bridge_argv", "eventually", "mcp_stdio", "result_of", "start_world",
           "PY", "ROOT"]
