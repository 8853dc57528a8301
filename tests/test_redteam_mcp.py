"""Red-team pass over the MCP bridge: an LLM host's agent that misbehaves through `vaultsim mcp`.

The hostile host is the official MCP SDK client (as hosts use it) or
tests/mcp_agents/hostile_mcp_agent.py under `vaultsim run --agent`, written
from the README and the agent contract alone. Each test here failed before
its fix:

    an oversized argument     a 2 MiB string went to the daemon as one over-long line; the
                              daemon dropped the connection, so the bridge answered a false
                              outcome_unknown ("the vault daemon went away ... it may have
                              run") and the MCP session lost its vault session, its grants
                              with it: the next call asked the person again
"""

from __future__ import annotations

import asyncio
import json

import pytest

from helpers import Sandbox
from mcp_world import Approver, World, mcp_stdio, result_of, start_world

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


class TestHostileArguments:
    async def test_an_oversized_argument_is_refused_and_the_session_keeps_its_grant(self, world: World) -> None:
        """After a session grant for create_issue, a call with a 2 MiB title: a local_failure with
        nothing sent (not outcome_unknown), the same vault session, and the next create rides the
        grant without asking the person again. No credential in any answer."""
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_stdio(world.sandbox, "--wait-budget", "30") as s:
                first = asyncio.create_task(s.call_tool("create_issue", {"title": "granted", "idempotency_key": "k1"}))
                req = await person.request()
                await person.decide(req["request_id"], "allow_session")
                granted = result_of(await first)
                sessions = [x["session_id"] for x in await person.sessions()]
                huge = result_of(await s.call_tool("create_issue", {"title": "x" * (2 << 20),
                                                                    "idempotency_key": "k2"}))
                after = result_of(await s.call_tool("create_issue", {"title": "after", "idempotency_key": "k3"}))
                assert sessions == [x["session_id"] for x in await person.sessions()]
            assert 0 == person.seen("approval.requested")  # the grant still answered for "after"
        finally:
            await person.close()
        assert "success" == granted["category"]
        assert ("local_failure", "bounded") == (huge["category"], huge["retry"]), huge
        assert "over the wire's limit" in huge["message"] and "Nothing was sent" in huge["message"]
        assert "success" == after["category"], after
        assert 1 == world.issues_titled("granted") == world.issues_titled("after")
        assert 2 == len(world.state("issues")) - 1  # the seeded issue, "granted" and "after": no huge one
        assert world.secret not in json.dumps([granted, huge, after])
