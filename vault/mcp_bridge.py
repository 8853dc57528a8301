"""`vaultsim mcp`: an MCP server over stdio that forwards tool calls to the daemon.

An MCP client (an agent framework) starts `vaultsim mcp` as its tool server.
The bridge process opens one vault session on agent.sock, so grants bind to
it and end when the client stops the bridge. Tools mirror the agent socket:
`vault_call`, `vault_resume`, `vault_lookup`. Each answer is the same Result
as on the socket, as text and structured content, with `isError` set when the
call did not succeed, so a client cannot mistake a failure for output.
The bridge never sees a credential: it has only the agent socket.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
from typing import Any

from .cli import add_home_arg
from .client import AgentClient
from .errors import BadInput, RpcError, VaultError
from .home import VaultHome
from .models import Result

try:  # optional extra: vaultsim[mcp]
    from mcp.server.mcpserver import MCPServer
    from mcp_types import CallToolResult, TextContent
except ImportError:  # pragma: no cover - reported by run()
    MCPServer = None  # type: ignore[assignment,misc]


class Bridge:
    """One agent session, used from the MCP server's worker threads one call at a time."""

    def __init__(self, socket_path: str, agent: str, run_id: str | None) -> None:
        self.socket_path, self.agent, self.run_id = socket_path, agent, run_id
        self._client: AgentClient | None = None
        self._lock = threading.Lock()

    def _session(self) -> AgentClient:
        if self._client is None:
            self._client = AgentClient(self.socket_path)
            self._client.open_session(self.agent, self.run_id)
        return self._client

    def run(self, fn_name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            try:
                result: Result = getattr(self._session(), fn_name)(*args, **kwargs)
            except RpcError as exc:
                return {"ok": False, "error": exc.message}
            except VaultError as exc:
                self._client = None  # the daemon went away; reconnect next time
                return {"ok": False, "error": exc.message}
        return result.model_dump(mode="json", exclude_none=True)


def build_server(bridge: Bridge) -> Any:
    server = MCPServer(name="vaultsim", instructions=(
        "Tools that run operations through the vaultsim vault. You name an operation from the "
        "catalog and its parameters; the vault holds the credentials and may ask a person to "
        "approve. Follow each result's `retry` instruction: reconcile with vault_lookup before "
        "retrying an outcome_unknown, never retry a `never`."))

    def answer(data: dict[str, Any]) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(data))],
                              structured_content=data, is_error=not data.get("ok", False))

    @server.tool(description="Run a catalog operation through the vault.")
    async def vault_call(operation: str, params: dict[str, Any] | None = None,
                         idempotency_key: str | None = None, wait_s: float | None = None) -> CallToolResult:
        return answer(await asyncio.to_thread(bridge.run, "call", operation, params or {},
                                              idempotency_key=idempotency_key, wait_s=wait_s))

    @server.tool(description="Collect the outcome of a call that returned approval_pending.")
    async def vault_resume(resume_token: str, wait_s: float | None = None) -> CallToolResult:
        return answer(await asyncio.to_thread(bridge.run, "resume", resume_token, wait_s=wait_s))

    @server.tool(description="Ask whether an earlier operation took effect (by correlation id or idempotency key).")
    async def vault_lookup(correlation_id: str | None = None, idempotency_key: str | None = None,
                           operation: str | None = None) -> CallToolResult:
        return answer(await asyncio.to_thread(bridge.run, "lookup", correlation_id=correlation_id,
                                              idempotency_key=idempotency_key, operation=operation))

    return server


def configure(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--socket", help="agent socket (default: $VAULTSIM_SOCKET or the home's agent.sock)")
    p.add_argument("--agent", default="mcp-agent", help="agent name shown to approvers")
    p.add_argument("--run-id", default=os.environ.get("VAULTSIM_RUN_ID"))


def run(args: argparse.Namespace) -> int:
    if MCPServer is None:
        raise BadInput("the MCP bridge needs the mcp SDK: pip install 'vaultsim[mcp]'")
    socket_path = args.socket or os.environ.get("VAULTSIM_SOCKET") or str(VaultHome.resolve(args.home).agent_sock)
    build_server(Bridge(socket_path, args.agent, args.run_id)).run("stdio")
    return 0
