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
from mcp_world import Approver, World, start_world
from test_redteam_mcp22 import StdioHost, _call, _post, _result

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


class TestAStreamResumedWithLastEventId:
    async def test_a_get_with_last_event_id_opens_a_stream_and_a_closed_one_can_reopen(
            self, sandbox: Sandbox) -> None:
        """A URL host whose standalone SSE stream dropped reopens it with Last-Event-ID (as the
        Streamable HTTP transport lets clients resume). The bridge keeps no events to replay; the
        SDK answered nothing, so uvicorn sent 500 "Internal Server Error" and logged an ASGI error.
        Now the stream opens afresh (200, text/event-stream). The host then closes it and opens
        another: that was 409 "Only one SSE stream is allowed per session" for 15-30 s (the
        client's close was taken for a half-close awaiting an answer, held until a keep-alive
        ping failed), and a host that gives up after a few retries lost its notifications."""
        from test_mcp_http import start_http_bridge
        from test_redteam_mcp22 import _open

        world = start_world(sandbox)
        _, url = start_http_bridge(world.sandbox)
        async with httpx.AsyncClient() as c:
            sid = await _open(c, url)
            hd = {"accept": "text/event-stream", "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
            async with c.stream("GET", url, headers={**hd, "last-event-id": "0-abc"}, timeout=30) as resumed:
                status, kind = resumed.status_code, resumed.headers.get("content-type", "")
            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while True:  # the bridge learns of the closed stream from its connection's end
                async with c.stream("GET", url, headers=hd, timeout=30) as again:
                    status_again = again.status_code
                if status_again != 409 or loop.time() > end:
                    break
                await asyncio.sleep(0.05)
            read = await _post(c, url, _call(2, "read_issue", {"issue_id": "ISS-1"}), sid)
        log = (sandbox.root / "mcp-http.stderr").read_text()
        assert (200, "text/event-stream") == (status, kind.split(";")[0]), (status, kind, log[-2000:])
        assert 200 == status_again
        assert "success" == _result(read.text)["category"]
        assert "without starting response" not in log and "Traceback" not in log, log[-2000:]


class TestListCursors:
    async def test_a_cursor_the_bridge_never_gave_is_invalid_params(self, sandbox: Sandbox) -> None:
        """The bridge answers tools/list whole (no nextCursor). A host that sends a cursor anyway
        (a stale one, from another server) was answered the first page again as if the cursor were
        good; MCP's pagination says an invalid cursor is -32602. Without a cursor every list is whole."""
        world = start_world(sandbox)
        host = await StdioHost.start(world)
        try:
            answers = {}
            for rid, method in enumerate(("tools/list", "resources/list", "prompts/list"), start=10):
                await host.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": {"cursor": "page-2"}})
                answers[method] = await host.answer(rid)
            await host.send({"jsonrpc": "2.0", "id": 20, "method": "tools/list", "params": {}})
            whole = (await host.answer(20))["result"]
        finally:
            await host.close()
        assert {m: -32602 for m in answers} == {m: a.get("error", {}).get("code") for m, a in answers.items()}, answers
        assert "cursor" in answers["tools/list"]["error"]["message"]
        assert "nextCursor" not in whole and {"read_issue", "vault_resume"} <= {t["name"] for t in whole["tools"]}
