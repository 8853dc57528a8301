"""The MCP bridge: a real MCP client over stdio, forwarding to a real daemon."""

from __future__ import annotations

import json

import pytest

from helpers import PY, ROOT, Sandbox, canary

mcp_client = pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed")


async def call_tools(sandbox: Sandbox, calls: list[tuple[str, dict]]) -> list:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {**sandbox.env, "VAULTSIM_SOCKET": str(sandbox.agent_sock)}
    params = StdioServerParameters(command=PY, args=["-m", "vault.cli", "mcp", "--agent", "mcp-test"],
                                   env=env, cwd=str(ROOT))
    out = []
    with open(sandbox.root / "mcp.stderr", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                out.append(sorted(t.name for t in tools.tools))
                for name, args in calls:
                    out.append(await session.call_tool(name, args))
    return out


class TestMcpBridge:
    async def test_tool_results_are_vault_results(self, sandbox: Sandbox) -> None:
        """vault_call returns the Result; a refusal is flagged isError; no credential crosses."""
        secret = canary()
        _, url = sandbox.start_remote({"tracker_token": secret, "releases_token": secret})
        sandbox.set_secret("tracker_token", secret)
        sandbox.set_secret("releases_token", secret)
        sandbox.start_daemon("--remote", url)
        sandbox.start_approver([{"match": {"operation": "delete_release"}, "decide": "deny"}])
        tools, read, denied = await call_tools(sandbox, [
            ("vault_call", {"operation": "read_issue", "params": {"issue_id": "ISS-1"}}),
            ("vault_call", {"operation": "delete_release", "params": {"release_id": "r-1"}}),
        ])
        assert tools == ["vault_call", "vault_lookup", "vault_resume"]
        assert read.is_error is False
        assert read.structured_content["category"] == "success"
        assert denied.is_error is True
        assert (denied.structured_content["category"], denied.structured_content["retry"]) == ("approval_denied", "never")
        text = json.dumps([read.model_dump(mode="json"), denied.model_dump(mode="json")])
        assert secret not in text
        assert secret not in (sandbox.root / "mcp.stderr").read_text()
