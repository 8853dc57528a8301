"""Red-team pass 25 over the MCP bridge: hosts whose JSON-RPC is a little off the spec.

The hosts are hand-written JSON-RPC clients on `vaultsim mcp`'s stdio, or httpx on the
Streamable HTTP endpoint, as a host's own client is. Each test here failed before its fix:

    a request whose id is null,   (JSON-RPC: an id is a string or a number; MCP: a string or an
    true, 1.5 or an object        integer, never null) was read by the SDK as a notification
                                  (its model ignores the id) and dropped: on stdio nothing came
                                  back and the host waited until its own timeout; over HTTP the
                                  POST was 202 Accepted, as for a notification (an initialize:
                                  400 "Missing session ID"). Now each is
                                  answered -32600 with id null (JSON-RPC's answer to a request
                                  whose id cannot be used), on stdio and in an HTTP 400
    a batch [1, 2]                (the JSON-RPC spec's own example) was answered -32700 "parse
                                  error" for each element: the batch was JSON; now -32600
    a request whose params is     was taken for a batch: answered "an empty batch" with id null,
    an empty list                 so the host's request was never answered by its id; now -32600
                                  with its id, as any other params that is not an object
    an MCP-Protocol-Version       (HTTP, on a session) that no era knows ("1999-01-01", "banana",
    header of no known version    empty) was taken by the SDK for the 2026-07-28 era: -32602 asking
                                  for that era's params._meta envelope keys, which told a handshake
                                  host nothing about its header. Now 400, -32600 "unsupported
                                  MCP-Protocol-Version header" with the versions served (MCP: an
                                  unsupported version is a 400), the value not quoted back

Tried and already right: a second initialize from another clientInfo (answered, the same
session); responses to requests the bridge never made, and notifications it does not know
(ignored, the bridge served on); notifications/cancelled naming no request or an unknown one
(ignored); `params: null` (served); tools/call with no name or no params (-32602 with its id); a
progressToken that is a fraction (-32602); roots/list and sampling/createMessage sent to the
server (-32601); resources/templates/list (-32601: the bridge has no templates); over HTTP, a
POST with no session id (400) or without text/event-stream accepted (406); a session id from
before the bridge restarted (404 for POST and DELETE, open a new session); the official SDK
client's ping, list_resources, list_prompts and a tool call with a progress callback on a fresh
HTTP session; a suite using the plugin under xdist with parametrize, tmp_path and monkeypatch
(VAULTSIM_HOME and VAULTSIM_SOCKET set to the team's own: untouched), -p no:cacheprovider and
--lf, an agent killed by its test mid-call, pytest-timeout's signal method mid-run, an agent that
leaves a daemonized grandchild (FAIL_DEADLINE, named): no process, home or socket left. A Node
host writing stdio by hand (a request split over three writes, CRLF endings, three messages in
one write, U+2028 in an argument): each answered by its id. A 60 MB tool argument: refused (the
wire's 1 MiB), the bridge served on. Tool names, prompt names and resource URIs with escapes and
a canary: shown escaped, never logged raw.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from helpers import Sandbox
from mcp_world import World, start_world
from test_redteam_mcp22 import StdioHost, _open, _post

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")
httpx = pytest.importorskip("httpx")

BAD_IDS = [None, True, 1.5, {"n": 1}, [7]]


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def _raw(host: StdioHost, line: str) -> None:
    assert host.proc.stdin is not None
    host.proc.stdin.write(line.encode() + b"\n")
    await host.proc.stdin.drain()


async def _answers_until(host: StdioHost, rid: Any) -> list[dict[str, Any]]:
    """Every answer the bridge writes up to and including the one carrying `rid` (a ping sent
    last, so that nothing expected can still be on its way)."""
    got = []
    while True:
        answer = await _answer_any(host)
        got.append(answer)
        if answer.get("id") == rid:
            return got


async def _answer_any(host: StdioHost, timeout: float = 30.0) -> dict[str, Any]:
    """The next answer (notifications skipped)."""
    assert host.proc.stdout is not None
    while True:
        line = await asyncio.wait_for(host.proc.stdout.readline(), timeout)
        assert line, "the bridge closed its output"
        message = json.loads(line)
        if "method" not in message:
            return dict(message)


def _invalid_request(answer: dict[str, Any]) -> str:
    assert answer.get("id", "absent") is None, answer
    assert -32600 == answer["error"]["code"], answer
    return str(answer["error"]["message"])


class TestARequestWhoseIdIsNoStringOrInteger:
    async def test_stdio_each_is_answered_invalid_request(self, world: World) -> None:
        host = await StdioHost.start(world)
        try:
            for rid in BAD_IDS:
                await _raw(host, json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/list"}))
            # a notification of the same method is still never answered
            await _raw(host, json.dumps({"jsonrpc": "2.0", "method": "tools/list"}))
            await _raw(host, json.dumps({"jsonrpc": "2.0", "id": 99, "method": "ping"}))
            got = await _answers_until(host, 99)
        finally:
            await host.close()
        assert len(BAD_IDS) + 1 == len(got), got
        said = [_invalid_request(a) for a in got[:-1]]
        assert all("id must be a string or an integer" in s for s in said), said
        assert "not null" in said[0] and "not a fraction" in said[2], said
        assert {"jsonrpc": "2.0", "id": 99, "result": {}} == got[-1]

    async def test_http_each_is_answered_400_invalid_request(self, world: World) -> None:
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        async with httpx.AsyncClient() as c:
            sid = await _open(c, url)
            answers = [await _post(c, url, {"jsonrpc": "2.0", "id": rid, "method": "ping"}, sid)
                       for rid in BAD_IDS]
            notified = await _post(c, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
            after = await _post(c, url, {"jsonrpc": "2.0", "id": 5, "method": "ping"}, sid)
            hello = await _post(c, url, {"jsonrpc": "2.0", "id": None, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "h", "version": "1"}}})
        # an initialize with id null was told "Missing session ID"
        assert 400 == hello.status_code and "id must be a string or an integer" in _invalid_request(hello.json())
        assert [400] * len(BAD_IDS) == [a.status_code for a in answers], [a.text for a in answers]
        assert all("id must be a string or an integer" in _invalid_request(a.json()) for a in answers)
        assert 202 == notified.status_code  # a notification stays unanswered
        assert 200 == after.status_code and '"id":5' in after.text, after.text


class TestBatchesAndParams:
    async def test_a_batch_of_non_objects_is_invalid_request_each(self, world: World) -> None:
        """JSON-RPC 2.0's own example: `[1,2,3]` gets one -32600 (id null) per element."""
        host = await StdioHost.start(world)
        try:
            await _raw(host, json.dumps([1, "two", {"jsonrpc": "2.0", "id": None, "method": "ping"},
                                         {"jsonrpc": "2.0", "id": 3, "method": "ping"}]))
            await _raw(host, json.dumps({"jsonrpc": "2.0", "id": 99, "method": "ping"}))
            got = await _answers_until(host, 99)
        finally:
            await host.close()
        assert 5 == len(got), got
        refused = [a for a in got if a.get("id") is None]
        assert 3 == len(refused) and all(_invalid_request(a) for a in refused), got
        assert {"jsonrpc": "2.0", "id": 3, "result": {}} in got

    async def test_params_that_is_an_empty_list_is_answered_by_its_id(self, world: World) -> None:
        host = await StdioHost.start(world)
        try:
            await _raw(host, json.dumps({"jsonrpc": "2.0", "id": 19, "method": "ping", "params": []}))
            await _raw(host, json.dumps({"jsonrpc": "2.0", "id": 20, "method": "tools/list", "params": [1]}))
            first, second = await host.answer(19), await host.answer(20)
        finally:
            await host.close()
        for answer in (first, second):
            assert -32600 == answer["error"]["code"], answer
            assert "batch" not in answer["error"]["message"], answer


class TestAnUnknownProtocolVersionHeader:
    async def test_is_refused_naming_the_header_and_the_versions_served(self, world: World) -> None:
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        async with httpx.AsyncClient() as c:
            sid = await _open(c, url)
            head = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                    "mcp-session-id": sid}
            ping = json.dumps({"jsonrpc": "2.0", "id": 11, "method": "ping"})
            refused = [await c.post(url, headers={**head, "mcp-protocol-version": v}, content=ping)
                       for v in ("1999-01-01", "banana-7f3a", "")]
            served = [await c.post(url, headers={**head, "mcp-protocol-version": v}, content=ping)
                      for v in ("2025-06-18", "2024-11-05")]
            bare = await c.post(url, headers=head, content=ping)  # no header: the SDK assumes 2025-03-26
        for answer in refused:
            assert 400 == answer.status_code, answer.text
            error = answer.json()["error"]
            assert -32600 == error["code"] and "MCP-Protocol-Version" in error["message"], error
            assert "2025-06-18" in error["data"]["supported"] and "banana" not in answer.text, error
        assert [200, 200, 200] == [a.status_code for a in (*served, bare)], [a.text for a in (*served, bare)]
