"""Red-team pass 24 over the MCP bridge: hosts that cancel late, and the MCP lifecycle's corners.

The hosts are hand-written JSON-RPC clients on `vaultsim mcp`'s stdio (as a host's own client
is); the person is the test at the approver socket. The fault found, now fixed:

    a cancel that comes after     the host cancelled (notifications/cancelled, as SDK clients do
    the person allowed            at their timeout) a create_deployment the person had allowed a
                                  moment before. The vault cannot withdraw what runs, so it ran
                                  (one deployment), while the README promised a cancelled call "is
                                  never executed", and the host, which MCP says gets no answer for
                                  a cancelled request and had sent no idempotency_key, had no handle
                                  to find out (vault_lookup needs a correlation id or a key). Now
                                  the README says a late cancel withdraws nothing, each progress
                                  notification names the call's correlation_id, and the bridge's
                                  log says the cancel came too late and where the outcome is; a
                                  vault_lookup by that correlation id answers what the call did
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from helpers import Sandbox, canary, sim_headers
from mcp_world import Approver, World
from test_redteam_mcp22 import StdioHost, _call

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")
httpx = pytest.importorskip("httpx")


def _slow_world(sandbox: Sandbox) -> World:
    """A world whose remote commits a deployment and holds its answer until released."""
    secret = canary()
    creds = {"tracker_token": secret, "releases_token": secret, "builds_token": secret,
             "deploy_token": secret, "records_token": secret}
    _, url = sandbox.start_remote(creds, fault="late_response_after_commit:op=create_deployment")
    for name in creds:
        sandbox.set_secret(name, secret)
    return World(sandbox, url, secret, sandbox.start_daemon("--remote", url))


async def _notification(host: StdioHost, method: str, timeout: float = 30.0) -> dict[str, Any]:
    """The next notification named `method` (answers read meanwhile are kept for host.answer)."""
    assert host.proc.stdout is not None
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        line = await asyncio.wait_for(host.proc.stdout.readline(), max(0.1, end - loop.time()))
        assert line, "the bridge closed its output"
        message = json.loads(line)
        if message.get("method") == method:
            return dict(message["params"])
        if "method" not in message:
            host.seen.append(message)


async def _until(check: Any, timeout: float = 20.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not (got := check()) and loop.time() < end:
        await asyncio.sleep(0.05)
    return got


class TestACancelAfterThePersonAllowed:
    async def test_the_call_runs_once_and_the_host_can_find_its_outcome(self, sandbox: Sandbox) -> None:
        """The host asks for a deployment with a progress token and no idempotency_key, the person
        allows, the remote commits (and holds its answer), then the host's cancel arrives. The vault
        cannot withdraw a call that runs: it runs once. The host is not answered for the cancelled
        request, as MCP says, but the progress it got names the call's correlation_id, and a
        vault_lookup by it says the deployment was made (a host left guessing resends)."""
        world = _slow_world(sandbox)
        person = await Approver.connect(world.sandbox.home)
        host = await StdioHost.start(world, "--progress-every", "0.3")
        try:
            request = _call(2, "create_deployment", {"environment": "staging", "version": "9.9.9"})
            request["params"]["_meta"] = {"progressToken": "p-2"}
            await host.send(request)
            asked = await person.request()
            progress = await _notification(host, "notifications/progress")
            cid = re.search(r"correlation_id (c-[0-9a-z]+)", progress.get("message", ""))
            assert cid, progress
            await person.decide(asked["request_id"], "allow_once")
            assert await _until(lambda: world.state("deployments")), "the deployment never reached the remote"
            await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": 2, "reason": "the host timed out"}})
            await host.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
            assert {} == (await host.answer(3))["result"]
            httpx.post(f"{world.url}/_sim/release", headers=sim_headers(world.url), timeout=10).raise_for_status()
            logged = await _until(lambda: "could not be withdrawn" in (sandbox.root / "mcp.stderr").read_text())
            await host.send(_call(4, "vault_lookup", {"correlation_id": cid.group(1)}))
            looked = (await host.answer(4))["result"]["structuredContent"]
        finally:
            await person.close()
            await host.close()
        assert ("success", "found") == (looked["category"], looked.get("reconciled")), looked
        assert "do not repeat it" in looked["message"], looked
        assert 1 == len(world.state("deployments"))
        assert logged and cid.group(1) in (sandbox.root / "mcp.stderr").read_text()
        assert not any(a.get("id") == 2 for a in host.seen), host.seen  # MCP: a cancelled request is not answered
        assert world.secret not in json.dumps([progress, looked]) + (sandbox.root / "mcp.stderr").read_text()
