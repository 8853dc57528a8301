"""Red-team pass 22 over the MCP bridge: hosts written from the README's MCP section and the agent contract.

The hosts are hand-written JSON-RPC clients (stdio lines, or httpx on the Streamable HTTP
endpoint), as a host's own client is; the person is the test at the approver socket. Each
test here failed before its fix:

    a host that reconnects and    a URL host's POST of create_deployment (the remote ignores keys)
    looks up first                was cut while the person was asked; from a new MCP session it
                                  called vault_lookup with its idempotency_key, as the README says,
                                  and was told not_found ("it did not take effect"): the call was
                                  still waiting at the vault. It resent, the person allowed both
                                  rows, and two deployments ran. A lookup of a call that waits for
                                  a person, or was allowed and has not run, is now `unknown` with
                                  its request and resume_token (vault/daemon/calls.py, gate)
    a killed host comes back      the same for a stdio host killed mid-wait whose call the person
                                  allowed afterwards: not_found, then a second prompt; now it is
                                  collected with vault_resume and runs once
    a JSON-RPC batch (stdio)      answered once with id null: the host waited on each request in
                                  it until its own timeout. Now served message by message
    a host fanning out 600 calls  a create already put to the person whose bridge-side resume
    on one session                the vault refused (64 requests in flight on a connection) came
                                  back rate_limited, its token lost: 6-12 of 16-32 rows were left
                                  on the person's screen with nobody to collect them

Tried and already right: tools/call before `initialized` (served) and before `initialize`
(an error with its id); `arguments` that is a list, a string, a number (-32602 with its id) or
null; a progressToken that is an object; the same call twice at once with one key (two prompts,
a cancel withdraws its own); ping while a call waits; notifications/cancelled over HTTP (the row
withdrawn, -32800); a host that sends an Authorization header with malformed bodies, a wrong
content type, an unknown protocol version, a 100 kB header or a stranger's session id (no header
value in any answer or log line); a POST cut while progress notifications flow (no traceback;
the call still runs when allowed, as documented); a 2026-07-28 stdio client (labelled from its
first request's envelope); a careful MCP agent (tests/mcp_agents/rt22m_careful.py) over all 42
scenarios under `vaultsim run --agent`, in the jail: every verdict as expected.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox
from mcp_world import Approver, World, bridge_argv, start_world

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")
httpx = pytest.importorskip("httpx")

HELLO = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rt22-host", "version": "1"}}}


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def _post(c: Any, url: str, body: Any, sid: str | None = None) -> Any:
    h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
         "mcp-protocol-version": "2025-06-18"}
    if sid:
        h["mcp-session-id"] = sid
    return await c.post(url, headers=h, content=json.dumps(body), timeout=60)


def _answer(text: str) -> dict[str, Any]:
    data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    return dict(json.loads(data[-1] if data else text))


def _result(text: str) -> dict[str, Any]:
    return dict(_answer(text)["result"]["structuredContent"])


async def _open(c: Any, url: str) -> str:
    sid = (await _post(c, url, HELLO)).headers["mcp-session-id"]
    await _post(c, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    return str(sid)


def _call(rid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": args}}


class TestAReconnectingHostLooksUpFirst:
    async def test_a_lookup_of_a_call_still_waiting_for_a_person_is_not_not_found(self, world: World) -> None:
        """A URL host's POST of create_deployment (the remote ignores idempotency keys) is cut while
        the person is asked. Reconnected (a new MCP session), the host does what the README says:
        vault_lookup with its idempotency_key before any retry. The call has not run, but it still
        waits at the vault and runs if the person allows it: the lookup must not say not_found
        (which licenses a resend: two prompts, two deployments)."""
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        person = await Approver.connect(world.sandbox.home)
        deploy = {"environment": "staging", "version": "1.4.2", "idempotency_key": "deploy-1.4.2"}
        try:
            async with httpx.AsyncClient() as first:
                sid = await _open(first, url)
                cut = asyncio.create_task(_post(first, url, _call(1, "create_deployment", deploy), sid))
                req = await person.request()
                cut.cancel()  # the connection drops: no notifications/cancelled
                with pytest.raises(asyncio.CancelledError):
                    await cut
            async with httpx.AsyncClient() as again:
                sid2 = await _open(again, url)
                looked = _result((await _post(again, url, _call(2, "vault_lookup", {
                    "idempotency_key": "deploy-1.4.2", "operation": "create_deployment"}), sid2)).text)
                if looked.get("reconciled") == "not_found":  # the careful host's rule: only then resend
                    resend = asyncio.create_task(_post(again, url, _call(3, "create_deployment", deploy), sid2))
                    req2 = await person.request()
                    await person.decide(req2["request_id"], "allow_once")
                    collected = _result((await resend).text)
                    expected = 2  # the resend's, and the first call's once it is allowed below
                else:  # unknown, with the receipt: collect the first call instead of sending it again
                    collect = asyncio.create_task(_post(again, url, _call(3, "vault_resume", {
                        "resume_token": looked.get("resume_token") or "none"}), sid2))
                    expected = 1
                await person.decide(req["request_id"], "allow_once")
                if expected == 1:
                    collected = _result((await collect).text)
                deployed = await _count(world, "deployments", expected)
            assert 0 == person.seen("approval.requested")
        finally:
            await person.close()
        assert "unknown" == looked["reconciled"], looked
        assert req["request_id"] in looked["message"] and "Do not send it again" in looked["message"]
        assert ("success", "started") == (collected["category"], collected["data"]["status"]), collected
        assert 1 == deployed
        assert world.secret not in json.dumps([looked, collected])


async def _count(world: World, collection: str, expected: int, timeout: float = 20.0) -> int:
    """How many items the remote holds once `expected` have landed (or the deadline passed)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while len(world.state(collection)) < expected and loop.time() < end:
        await asyncio.sleep(0.05)
    return len(world.state(collection))


class StdioHost:
    """A host that writes JSON-RPC lines to `vaultsim mcp` itself (as a hand-written client does)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.seen: list[dict[str, Any]] = []  # answers read while looking for another

    @classmethod
    async def start(cls, world: World, *args: str) -> "StdioHost":
        proc = await asyncio.create_subprocess_exec(
            PY, *bridge_argv(*args), env=world.sandbox.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=open(world.sandbox.root / "mcp.stderr", "ab"))
        host = cls(proc)
        await host.send(HELLO)
        assert 0 == (await host.answer(0))["id"]
        await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return host

    async def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        await self.proc.stdin.drain()

    async def answer(self, rid: Any, timeout: float = 30.0) -> dict[str, Any]:
        """The answer carrying `rid` (notifications are skipped; other answers kept for later)."""
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            found = next((m for m in self.seen if m.get("id") == rid), None)
            if found is not None:
                self.seen.remove(found)
                return found
            line = await asyncio.wait_for(self.proc.stdout.readline(), max(0.1, end - loop.time()))
            assert line, "the bridge closed its output"
            message = json.loads(line)
            assert isinstance(message, dict), f"a batch answer: {line[:200]!r}"
            if "method" not in message:
                self.seen.append(message)

    async def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), 30)


class TestABatchIsAnsweredByItsIds:
    async def test_each_request_of_a_batch_gets_its_own_answer(self, world: World) -> None:
        """A host of MCP 2025-03-26 (which allows JSON-RPC batches) sends a read, a ping, a call with
        `params` that is not an object and a notification as one batch: the read is served, the ping
        answered, the bad call refused -32600 with its id, each on its own line; an empty batch is
        -32600 with id null. The bridge answered the whole batch once, id null, and left the host
        waiting on ids 2, 3 and 4 until its own timeout."""
        host = await StdioHost.start(world)
        try:
            await host.send([_call(2, "read_issue", {"issue_id": "ISS-1"}),
                             {"jsonrpc": "2.0", "id": 3, "method": "ping"},
                             {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": ["read_issue"]},
                             {"jsonrpc": "2.0", "method": "notifications/progress",
                              "params": {"progressToken": 1, "progress": 1}}])
            read, ping, bad = await host.answer(2), await host.answer(3), await host.answer(4)
            await host.send([])
            empty = await host.answer(None)
            after = await host.send(_call(5, "read_issue", {"issue_id": "ISS-1"})) or await host.answer(5)
        finally:
            code = await host.close()
        assert "success" == read["result"]["structuredContent"]["category"], read
        assert {} == ping["result"]
        assert -32600 == bad["error"]["code"], bad
        assert -32600 == empty["error"]["code"], empty
        assert "success" == after["result"]["structuredContent"]["category"]
        assert 0 == code


class TestAKilledHostComesBack:
    async def test_the_allowed_call_of_a_killed_host_is_collected_not_sent_again(self, world: World) -> None:
        """A stdio host asks for create_issue and is killed (its bridge with it) while the person is
        asked; the person allows it afterwards. The restarted host (same client name) looks it up
        by its key: not not_found (it was allowed and runs once collected): it collects it with the
        resume_token the lookup gives, and the issue exists once, with no second prompt."""
        person = await Approver.connect(world.sandbox.home)
        try:
            host = await StdioHost.start(world)
            await host.send(_call(1, "create_issue", {"title": "killed host", "idempotency_key": "kh-1"}))
            req = await person.request()
            host.proc.kill()
            await host.proc.wait()
            await person.decide(req["request_id"], "allow_once")
            host = await StdioHost.start(world)
            try:
                await host.send(_call(2, "vault_lookup", {"idempotency_key": "kh-1", "operation": "create_issue"}))
                looked = (await host.answer(2))["result"]["structuredContent"]
                if looked["reconciled"] == "unknown":
                    await host.send(_call(3, "vault_resume", {"resume_token": looked["resume_token"]}))
                    collected = (await host.answer(3))["result"]["structuredContent"]
                    assert "success" == collected["category"], collected
            finally:
                await host.close()
            assert 0 == person.seen("approval.requested")
        finally:
            await person.close()
        # "found" when the vault ran it for the killed bridge's own wait before it saw it go
        assert looked["reconciled"] in ("unknown", "found"), looked
        assert 1 == world.issues_titled("killed host")


class TestABusySessionKeepsItsTokens:
    async def test_every_prompt_of_a_fanned_out_host_comes_back_with_its_token(self, world: World) -> None:
        """A framework fans out 600 calls at once on one MCP session (reads, and every fifth a
        create_issue that asks the person, who never decides). The vault serves 64 requests at a
        time on a connection and refuses the rest (rate_limited): fine for a call it refused
        before asking anyone. But a create it had already put to the person, whose bridge-side
        resume was the refused request, came back rate_limited without its token: the host would
        resend (a second prompt) and the first stayed on the person's screen, collectable by
        nobody. Every request the person was shown must reach the host as approval_pending with
        its token (or its outcome)."""
        person = await Approver.connect(world.sandbox.home)
        n = 600
        try:
            host = await StdioHost.start(world, "--wait-budget", "3", "--progress-every", "0.5")
            try:
                for i in range(n):
                    args = {"title": f"fan {i}"} if i % 5 == 0 else {"issue_id": "ISS-1"}
                    await host.send({"jsonrpc": "2.0", "id": 1000 + i, "method": "tools/call", "params": {
                        "_meta": {"progressToken": i}, "name": "create_issue" if i % 5 == 0 else "read_issue",
                        "arguments": args}})
                answers = [await host.answer(1000 + i, timeout=60) for i in range(n)]
                await host.send({"jsonrpc": "2.0", "id": 7, "method": "ping"})
                assert {} == (await host.answer(7))["result"]  # still serving
            finally:
                assert 0 == await host.close()
            shown = {(await person.request())["request_id"] for _ in range(person.seen("approval.requested"))}
        finally:
            await person.close()
        results = [a["result"]["structuredContent"] for a in answers]
        handed = {r["request_id"] for r in results if r["category"] == "approval_pending" and r.get("resume_token")}
        assert shown and shown <= handed, f"{len(shown - handed)} of {len(shown)} prompts lost their token"
        assert not any(r["category"] == "success" for r in results[::5])  # no create ran unasked
        assert world.secret not in json.dumps(results)


def test_a_careful_mcp_agent_passes_the_restart_and_lost_answer_gates(tmp_path: Any) -> None:
    """tests/mcp_agents/rt22m_careful.py under `vaultsim run --agent` (it passes all 42 shipped
    scenarios): a restarted process collects its predecessor's approval through vault_resume
    (gate-6), and a lost answer is looked up, not resent (gate-4)."""
    import subprocess
    agent = ROOT / "tests" / "mcp_agents" / "rt22m_careful.py"
    report = tmp_path / "r.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(ROOT / "scenarios" / "gate-6-restart-resumes-receipt.yaml"),
                           str(ROOT / "scenarios" / "gate-4-lost-answer.yaml"), "--agent", f"{{python}} {agent}",
                           "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert 0 == proc.returncode, proc.stdout[-3000:] + proc.stderr[-2000:]
    trials = [t for s in json.loads(report.read_text())["scenarios"] for t in s["trial_results"]]
    assert ["PASS", "PASS"] == [t["verdict"] for t in trials]
