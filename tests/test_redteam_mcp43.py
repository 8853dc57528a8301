"""Red-team pass 43h over the MCP bridge: careful hosts as real hosts behave, whose verdict must be PASS.

The hosts are the official Python SDK client (tests/agents/rt43h_host.py, one mode per host
behaviour) or hand-written JSON-RPC on the Streamable HTTP endpoint; the person is the test at the
approver socket. Each test here failed before its fix:

    a host that lost its         a URL host's POST of create_issue was cut while the person was asked;
    connection, looked its call  from a new MCP session it did what the README says: vault_lookup by
    up and handed the wait over  its idempotency_key, which answered `unknown` with the resume_token.
                                 It kept the token and ended (its own bridge stopped, or the old MCP
                                 session ended). The bridge withdrew the request as one "the host
                                 never got a token for" (it was still waiting on the cut POST's
                                 behalf): the person's row went away, the handed-over token said
                                 approval_expired, and the careful host's "waiting" was graded
                                 FAIL_OUTCOME (no approval pending) under `vaultsim run`. Now a token
                                 the bridge has answered to a host, on any of its MCP sessions, is
                                 the host's: ending a session leaves that request to the person
                                 (vault.mcp.link)
    a stdio host that quits      with a vault_resume in flight for the token it was answered (stdin
    mid-resume                   closed, as hosts do on quit): the bridge withdrew the request at EOF,
                                 so the token the host kept for its successor collected nothing. Now
                                 that resume is answered approval_pending and the wait stays with the
                                 person (the same rule)

Decided where the README was silent: a URL host that lost its connection should come back on the
same MCP session (its Mcp-Session-Id stays open): the person's session grant lives there, and a new
session's next call in that scope asks again, which `vaultsim run` grades as approval fatigue (a
second session of one process asking for a scope its first holds). The README says so.

Tried with tests/agents/rt43h_host.py under `vaultsim run --agent` (see its docstring) and found
right: a host timeout (1 s) under which the bridge's `--wait-budget` is sized (tokens collected
with vault_resume, one prompt per scope); tools/list polled, ping and progress tokens beside
calls in flight; a stdio host restarted by its supervisor that resumes the token it kept (gate-6
PASS); the same-session HTTP reconnect after a cut POST (gate-1, fatigue-4, c05, refusal-2,
locked-vault PASS; gate-7 FAIL_UNROUTED_WAIT as expected). Run two at a time in the jail, the
hosts that stop their own bridge ran past gate-2's 8 s deadline on this loaded 2-core machine
(alone they pass: the host's own start-up and margins, not the bridge). Left as
documented: a host cancel withdraws the request, of a vault_resume too, so a host whose own timeout
is shorter than the wait it asks for, and that asks again, asks the person again each time (since
pass 44 the cancel is held back for a grace and the retry joins the request: tests/test_mcp44.py);
and gated calls a host fans out before a session grant each ask the person.

Pass 44 on the `restart` host's gate-6 failures: it packed two lives (interpreter, SDK import, its
own bridge and handshake, twice) into the first process's 8 s and checked no time before the
restart or its resume; loaded, it resumed after its deadline or was killed at it (FAIL_DEADLINE,
then FAIL_OUTCOME for a wait not held in time). The host was at fault; it now restarts only with
time for a second life left.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import pytest

from helpers import Sandbox
from mcp_world import Approver, World, start_world

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")
httpx = pytest.importorskip("httpx")

HELLO = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rt43h-host", "version": "1"}}}


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def _post(c: Any, url: str, body: Any, sid: str | None = None, method: str = "POST") -> Any:
    h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
         "mcp-protocol-version": "2025-06-18"}
    if sid:
        h["mcp-session-id"] = sid
    if method == "DELETE":
        return await c.delete(url, headers=h, timeout=60)
    return await c.post(url, headers=h, content=json.dumps(body), timeout=60)


def _result(text: str) -> dict[str, Any]:
    data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    return dict(json.loads(data[-1] if data else text)["result"]["structuredContent"])


async def _open(c: Any, url: str) -> str:
    sid = (await _post(c, url, HELLO)).headers["mcp-session-id"]
    await _post(c, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    return str(sid)


def _call(rid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": args}}


async def _cut_then_look_up(url: str, person: Approver) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A create_issue whose POST is cut while the person is asked, looked up from a new MCP session.
    Returns the cut session's id, the person's request and the lookup's Result."""
    args = {"title": "Flaky login test", "idempotency_key": "rt43h-issue-1", "wait_s": 40}
    async with httpx.AsyncClient() as first:
        sid = await _open(first, url)
        cut = asyncio.create_task(_post(first, url, _call(1, "create_issue", args), sid))
        req = await person.request()
        cut.cancel()  # the connection drops: no notifications/cancelled
        with pytest.raises(asyncio.CancelledError):
            await cut
    async with httpx.AsyncClient() as again:
        sid2 = await _open(again, url)
        looked = _result((await _post(again, url, _call(2, "vault_lookup", {
            "idempotency_key": "rt43h-issue-1", "operation": "create_issue"}), sid2)).text)
    return sid, req, looked


class TestAWaitHandedOverAfterAReconnect:
    async def test_ending_the_bridge_leaves_the_looked_up_request_to_the_person(self, world: World) -> None:
        """The own-bridge host's way out: it saved the token from the lookup, said "waiting" and
        stopped its `vaultsim mcp --http` (SIGTERM). The request must still wait for the person, and
        the token must collect it: allowed later, it runs once."""
        from test_mcp_http import start_http_bridge

        proc, url = start_http_bridge(world.sandbox)
        person = await Approver.connect(world.sandbox.home)
        try:
            _, req, looked = await _cut_then_look_up(url, person)
            assert ("unknown", True) == (looked["reconciled"], bool(looked.get("resume_token"))), looked
            proc.send_signal(signal.SIGTERM)
            assert 0 == await asyncio.to_thread(proc.wait, 20)
            decided = await person.decide(req["request_id"], "allow_once")
            # the host's successor, with its own bridge (the first one's log moved aside: its URL is read from it)
            log = world.sandbox.root / "mcp-http.stderr"
            log.rename(log.with_name("mcp-http.first.stderr"))
            _, url2 = start_http_bridge(world.sandbox)
            async with httpx.AsyncClient() as later:
                sid = await _open(later, url2)
                got = _result((await _post(later, url2, _call(1, "vault_resume", {
                    "resume_token": looked["resume_token"], "wait_s": 10}), sid)).text)
        finally:
            await person.close()
        assert "withdrawn" not in json.dumps(decided), decided
        assert ("success", True) == (got["category"], got["ok"]), got
        assert 1 == len([i for i in world.state("issues") if i["title"] == "Flaky login test"])
        assert world.secret not in json.dumps([looked, got])

    async def test_deleting_the_cut_session_leaves_the_looked_up_request_to_the_person(self, world: World) -> None:
        """The same when the host ends the MCP session it lost (DELETE with its Mcp-Session-Id, as a
        tidy host does) while its bridge lives on: the token it was handed still collects the call."""
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        person = await Approver.connect(world.sandbox.home)
        try:
            sid, req, looked = await _cut_then_look_up(url, person)
            async with httpx.AsyncClient() as c:
                assert (await _post(c, url, None, sid, method="DELETE")).status_code in (200, 204)
                await person.decide(req["request_id"], "allow_once")
                sid2 = await _open(c, url)
                got = _result((await _post(c, url, _call(1, "vault_resume", {
                    "resume_token": looked["resume_token"], "wait_s": 10}), sid2)).text)
        finally:
            await person.close()
        assert ("success", True) == (got["category"], got["ok"]), got
        assert 1 == len([i for i in world.state("issues") if i["title"] == "Flaky login test"])


class TestAStdioHostQuittingMidResume:
    async def test_a_resume_in_flight_at_eof_leaves_the_wait_to_the_person(self, world: World) -> None:
        """A stdio host got approval_pending (the token is its), called vault_resume, and quit with
        that call in flight (stdin closed, as hosts do on quit). The resume is answered with the
        call still pending, the bridge exits 0, and the token collects the call once allowed."""
        from helpers import PY, ROOT
        from mcp_world import bridge_argv

        proc = await asyncio.create_subprocess_exec(
            PY, *bridge_argv(), env=world.sandbox.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=open(world.sandbox.root / "mcp.stderr", "ab"))
        assert proc.stdin is not None and proc.stdout is not None
        person = await Approver.connect(world.sandbox.home)

        async def send(message: dict[str, Any]) -> None:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(message) + "\n").encode())
            await proc.stdin.drain()

        async def answer(rid: int) -> dict[str, Any]:
            assert proc.stdout is not None
            while True:
                message = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
                if message.get("id") == rid:
                    return dict(message)

        try:
            await send(HELLO)
            await answer(0)
            await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await send(_call(1, "create_issue", {"title": "Flaky login test", "wait_s": 0}))
            first = (await answer(1))["result"]["structuredContent"]
            req = await person.request()
            await send(_call(2, "vault_resume", {"resume_token": first["resume_token"], "wait_s": 40}))
            proc.stdin.close()  # EOF is read after the resume's line
            resumed = (await answer(2))["result"]["structuredContent"]
            code = await asyncio.wait_for(proc.wait(), 20)
            decided = await person.decide(req["request_id"], "allow_once")
            # the successor: its own bridge, the kept token
            again = await asyncio.create_subprocess_exec(
                PY, *bridge_argv(), env=world.sandbox.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=open(world.sandbox.root / "mcp.stderr", "ab"))
            proc = again
            assert proc.stdin is not None and proc.stdout is not None
            await send(HELLO)
            await answer(0)
            await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await send(_call(1, "vault_resume", {"resume_token": first["resume_token"], "wait_s": 10}))
            got = (await answer(1))["result"]["structuredContent"]
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 20)
        finally:
            await person.close()
            if proc.returncode is None:
                proc.kill()
        assert ("approval_pending", first["resume_token"]) == (resumed["category"], resumed["resume_token"]), resumed
        assert 0 == code
        assert "withdrawn" not in json.dumps(decided), decided
        assert ("success", True) == (got["category"], got["ok"]), got
        assert 1 == len([i for i in world.state("issues") if i["title"] == "Flaky login test"])

    async def test_a_successor_quitting_mid_resume_of_its_kept_token_leaves_the_wait_too(self, world: World) -> None:
        """The token came from an earlier bridge (the host kept it across its restart): the new
        bridge never answered it, yet the host holds it. Quitting with its vault_resume in flight
        must leave the wait to the person as above (it was withdrawn at EOF: the token the host
        keeps for its next life collected nothing, and under `vaultsim run` a withdrawal after the
        host exited is a late request)."""
        from helpers import PY, ROOT
        from mcp_world import bridge_argv

        person = await Approver.connect(world.sandbox.home)
        procs: list[asyncio.subprocess.Process] = []

        async def life(*calls: dict[str, Any]) -> list[dict[str, Any]]:
            """One bridge: the handshake, then each call answered before the next, then EOF, except
            that the last call is sent with EOF right behind it (quit with it in flight)."""
            proc = await asyncio.create_subprocess_exec(
                PY, *bridge_argv(), env=world.sandbox.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=open(world.sandbox.root / "mcp.stderr", "ab"))
            procs.append(proc)
            assert proc.stdin is not None and proc.stdout is not None

            async def answer(rid: int) -> dict[str, Any]:
                assert proc.stdout is not None
                while True:
                    message = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
                    if message.get("id") == rid:
                        return dict(message)

            for message in (HELLO, {"jsonrpc": "2.0", "method": "notifications/initialized"}):
                proc.stdin.write((json.dumps(message) + "\n").encode())
            await answer(0)
            got = []
            for n, call in enumerate(calls, 1):
                proc.stdin.write((json.dumps({**call, "id": n}) + "\n").encode())
                if n == len(calls):
                    proc.stdin.close()  # EOF right behind the last call
                else:
                    await proc.stdin.drain()
                got.append((await answer(n))["result"]["structuredContent"])
            assert 0 == await asyncio.wait_for(proc.wait(), 20)
            return got

        try:
            (first,) = await life(_call(1, "create_issue", {"title": "Flaky login test", "wait_s": 0}))
            req = await person.request()
            token = first["resume_token"]
            (resumed,) = await life(_call(1, "vault_resume", {"resume_token": token, "wait_s": 40}))
            decided = await person.decide(req["request_id"], "allow_once")
            (got,) = await life(_call(1, "vault_resume", {"resume_token": token, "wait_s": 10}))
        finally:
            await person.close()
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
        assert ("approval_pending", token) == (resumed["category"], resumed["resume_token"]), resumed
        assert "withdrawn" not in json.dumps(decided), decided
        assert ("success", True) == (got["category"], got["ok"]), got
        assert 1 == len([i for i in world.state("issues") if i["title"] == "Flaky login test"])
