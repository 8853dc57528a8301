"""Red-team pass 24 over the MCP bridge: hosts that cancel late, and the MCP lifecycle's corners.

The hosts are hand-written JSON-RPC clients on `vaultsim mcp`'s stdio (as a host's own client
is, or httpx on the Streamable HTTP endpoint); the person is the test at the approver socket.
Each test here failed before its fix:

    a cancel that comes after     the host cancelled (notifications/cancelled, as SDK clients do
    the person allowed            at their timeout) a create_deployment the person had allowed a
                                  moment before. The vault cannot withdraw what runs: it ran (one
                                  deployment) while the README promised a cancelled call "is never
                                  executed". On stdio the host got no answer and, without an
                                  idempotency_key, no handle to look it up (vault_lookup needs a
                                  correlation id or a key); over HTTP its POST was answered -32800
                                  "Request cancelled", which a host reads as "did not run". Now the
                                  transports ask the vault first and ignore a cancel that cannot
                                  withdraw anything (MCP lets a receiver do so), and the call is
                                  answered with its Result; progress names the correlation_id
    a GET stream resumed with     (Streamable HTTP resumption) answered 500: the SDK, with no event
    Last-Event-ID                 store, returned nothing. Now a fresh stream opens
    a GET stream closed and       409 "Only one SSE stream is allowed per session" for 15-30 s: the
    reopened                      client's close was taken for a half-close awaiting an answer and
                                  held until a keep-alive ping failed (vault.mcp.http_deadline)
    a list cursor                 tools/list with a cursor the bridge never gave answered the whole
                                  list as if it were valid; MCP says -32602

Tried and already right: initialize with 2024-11-05, 2099-01-01 or "banana" (answered with a
version the bridge speaks), with a number (-32602); initialize twice over HTTP on one session; a
second GET while one is open (409); a session id reused after DELETE (404 for POST, GET and
DELETE); a 50 MB body (413, the session served on); a cancel before the person decides (withdrawn).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from helpers import Sandbox, canary, sim_headers
from mcp_world import Approver, World, start_world
from test_redteam_mcp22 import StdioHost, _answer, _call, _post, _result

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
    async def test_stdio_the_call_runs_once_and_the_host_is_answered(self, sandbox: Sandbox) -> None:
        """The host asks for a deployment with a progress token and no idempotency_key, the person
        allows, the remote commits (and holds its answer), then the host's cancel arrives. The vault
        cannot withdraw a call that runs: it runs once, so the cancel is ignored (MCP lets a receiver
        ignore a cancel for a request that cannot be cancelled) and the host gets the deployment's
        Result. Before, it got nothing and had no handle to look the call up; the progress it got
        now names the call's correlation_id too, and a vault_lookup by it says the same."""
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
            ran = (await host.answer(2))["result"]["structuredContent"]
            await host.send(_call(4, "vault_lookup", {"correlation_id": cid.group(1)}))
            looked = (await host.answer(4))["result"]["structuredContent"]
        finally:
            await person.close()
            await host.close()
        assert ("success", "started") == (ran["category"], ran["data"]["status"]), ran
        assert cid.group(1) == ran["correlation_id"]
        assert ("success", "found") == (looked["category"], looked.get("reconciled")), looked
        assert 1 == len(world.state("deployments"))
        log = (sandbox.root / "mcp.stderr").read_text()
        assert "came after the person allowed" in log, log[-2000:]
        assert world.secret not in json.dumps([progress, ran, looked]) + log

    async def test_stdio_a_cancel_before_the_person_decides_still_withdraws(self, sandbox: Sandbox) -> None:
        """The same host cancelling while the person has not decided: withdrawn as before (the row
        goes, a late allow is refused, nothing runs)."""
        world = _slow_world(sandbox)
        person = await Approver.connect(world.sandbox.home)
        host = await StdioHost.start(world, "--cancel-grace", "0.3")  # the grace itself is test_mcp44's
        try:
            await host.send(_call(2, "create_deployment", {"environment": "staging", "version": "9.9.8"}))
            asked = await person.request()
            await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
            settled = await person.next("approval.settled")
            with pytest.raises(Exception, match="already settled"):
                await person.decide(asked["request_id"], "allow_once")
            await host.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
            assert {} == (await host.answer(3))["result"]
        finally:
            await person.close()
            await host.close()
        assert (asked["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
        # no answer (MCP), or the withdrawal's own Result when it is written before the SDK drops
        # the request: either way never a deployment, never "success"
        told = [a["result"]["structuredContent"]["category"] for a in host.seen if a.get("id") == 2]
        assert told in ([], ["approval_expired"]), host.seen
        assert [] == world.state("deployments")


    async def test_http_the_post_is_answered_with_what_ran_not_request_cancelled(self, sandbox: Sandbox) -> None:
        """The same over Streamable HTTP: the host POSTs the cancel after the person allowed. The
        SDK answered the call's POST -32800 "Request cancelled" while the deployment ran: a host
        reading that resends. Now the cancel is accepted (202) and ignored, and the POST carries
        the deployment's Result; a cancel while the person has not decided still withdraws."""
        from test_mcp_http import start_http_bridge
        from test_redteam_mcp22 import _open

        world = _slow_world(sandbox)
        _, url = start_http_bridge(world.sandbox, "--cancel-grace", "0.3")  # the grace itself is test_mcp44's
        person = await Approver.connect(world.sandbox.home)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
        try:
            async with httpx.AsyncClient() as c:
                sid = await _open(c, url)
                post = asyncio.create_task(_post(c, url, _call(2, "create_deployment", {
                    "environment": "staging", "version": "1.0.0"}), sid))
                asked = await person.request()
                await person.decide(asked["request_id"], "allow_once")
                assert await _until(lambda: world.state("deployments"))
                accepted = await _post(c, url, cancel, sid)
                httpx.post(f"{world.url}/_sim/release", headers=sim_headers(world.url), timeout=10).raise_for_status()
                ran = _result((await asyncio.wait_for(post, 30)).text)
                waiting = asyncio.create_task(_post(c, url, _call(3, "create_deployment", {
                    "environment": "staging", "version": "1.0.1"}), sid))
                asked2 = await person.request()
                await _post(c, url, {**cancel, "params": {"requestId": 3}}, sid)
                while (settled := await person.next("approval.settled"))["request_id"] != asked2["request_id"]:
                    pass  # the first request's own settling
                withdrawn = (await asyncio.wait_for(waiting, 30)).text
        finally:
            await person.close()
        assert 202 == accepted.status_code
        assert ("success", "started") == (ran["category"], ran["data"]["status"]), ran
        assert (asked2["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
        # the withdrawn call's POST: -32800, or (when the withdrawal's own answer wins the race with
        # the SDK's cancel) its Result saying it was withdrawn; never a deployment
        told = _answer(withdrawn)
        assert told.get("error", {}).get("code") == -32800 or told["result"]["structuredContent"][
            "category"] == "approval_expired", told
        assert ["1.0.0"] == [d["version"] for d in world.state("deployments")]


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
