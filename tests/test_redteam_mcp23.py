"""Red-team pass 23 over the MCP bridge: hosts written from the README's MCP section alone.

The hosts are hand-written JSON-RPC clients (stdio lines, or httpx on the Streamable HTTP
endpoint); the person is the test at the approver socket. Each test here failed before its fix:

    a host that closes stdin     every request still in flight when stdin ended was answered
    with calls in flight         a bare JSON-RPC error -32000 "Connection closed" (the SDK cancels
                                 its handlers at EOF), never a Result: a read or a create riding
                                 a grant that had run lost its answer, and a call waiting for a
                                 person was withdrawn without the host being told. Now the bridge
                                 answers every request read before EOF first (vault.mcp.stdio
                                 Outstanding, vault.cli.mcp): a waiting call is withdrawn and
                                 answered with the vault's Result for it, others get 1.5 s to
                                 finish and are answered
    a URL host that DELETEs its  the row was withdrawn, and the POST waiting on it ended with an
    session mid-call             empty 200 (no answer); now answered like stdio's EOF
                                 (vault.mcp.http LoopbackGuard._answer_first)
    an HTTP body that is JSON    a batch (an array), an empty batch, `params` that is not an
    but no message               object: HTTP 400 with -32602 "Validation error" and pydantic's
                                 report, which quoted the body back. JSON-RPC 2.0 calls this
                                 -32600 (invalid request); -32602 is a method's invalid params.
                                 Now -32600 with the request's id when it has one, nothing quoted;
                                 a lone surrogate escape is -32602 naming where, as on stdio
                                 (vault.mcp.http_unreadable)

Tried and already right: a token handed to the host (wait_s 0), then EOF or DELETE, then a new
bridge or MCP session collecting it with vault_resume once the person allows (runs once);
initialize sent twice on one stdio connection (answered again, the
same session); notifications/cancelled for a call waiting for a person (the row withdrawn, a
later ping answered); a progressToken on a waiting call; tool arguments with U+2028, an emoji,
quotes and backslashes (shown to the person as sent); a 900 kB body (refused by the catalog's
max length) and a 4 MB one (refused over the wire's 1 MiB line limit, nothing sent);
resources/list, resources/read of another URI (-32002), prompts/get with arguments; methods the
bridge does not serve (resources/subscribe, logging/setLevel, completion/complete: -32601).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox
from mcp_world import Approver, World, bridge_argv, start_world
from test_redteam_mcp22 import HELLO, StdioHost, _call, _open, _post, _result

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")
httpx = pytest.importorskip("httpx")


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def _to_the_end(host: StdioHost, timeout: float = 30.0) -> tuple[list[dict[str, Any]], int]:
    """Every answer the bridge writes until it exits, and its exit code."""
    assert host.proc.stdout is not None
    answers = list(host.seen)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while line := await asyncio.wait_for(host.proc.stdout.readline(), max(0.1, end - loop.time())):
        message = json.loads(line)
        if "method" not in message:
            answers.append(message)
    return answers, await asyncio.wait_for(host.proc.wait(), max(0.1, end - loop.time()))


def _only(answers: list[dict[str, Any]], rid: int) -> dict[str, Any]:
    mine = [a for a in answers if a.get("id") == rid]
    assert len(mine) == 1, answers
    assert "result" in mine[0], f"answered with no Result: {mine[0]}"
    return dict(mine[0]["result"]["structuredContent"])


class TestAHostThatClosesStdinWithCallsInFlight:
    async def test_a_read_in_flight_is_answered_with_its_result(self, world: World) -> None:
        """`printf '...' | vaultsim mcp`: the handshake, one read, end of input. The read's Result
        comes back before the bridge exits (it was -32000 "Connection closed")."""
        host = await StdioHost.start(world)
        await host.send(_call(2, "read_issue", {"issue_id": "ISS-1"}))
        assert host.proc.stdin is not None
        host.proc.stdin.close()
        answers, code = await _to_the_end(host)
        read = _only(answers, 2)
        assert ("success", "ISS-1") == (read["category"], read["data"]["id"]), read
        assert 0 == code
        assert world.secret not in json.dumps(answers)

    async def test_every_call_of_a_pipe_written_at_once_is_answered(self, world: World) -> None:
        """The whole conversation in one write, then EOF, as `printf ... | vaultsim mcp` delivers it:
        the handshake and six reads. Each read gets its Result, though the input had ended before
        any handler started."""
        proc = await asyncio.create_subprocess_exec(
            PY, *bridge_argv(), env=world.sandbox.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=open(world.sandbox.root / "mcp.stderr", "ab"))
        lines = [HELLO, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                 *(_call(n, "read_issue", {"issue_id": "ISS-1"}) for n in range(1, 7))]
        assert proc.stdin is not None
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in lines).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        answers, code = await _to_the_end(StdioHost(proc))
        reads = [_only(answers, n) for n in range(1, 7)]
        assert ["success"] * 6 == [r["category"] for r in reads], answers
        assert 0 == code

    async def test_a_create_riding_a_grant_is_answered_and_ran_once(self, world: World) -> None:
        """The person allowed create_issue for the session; the host's second create rides the grant
        and the host closes stdin straight after sending it. It ran at the remote either way (a
        disconnection is not a cancellation): the host must be told so, not "Connection closed"."""
        person = await Approver.connect(world.sandbox.home)
        host = await StdioHost.start(world)
        try:
            await host.send(_call(2, "create_issue", {"title": "first", "idempotency_key": "k-first"}))
            req = await person.request()
            await person.decide(req["request_id"], "allow_session")
            first = (await host.answer(2))["result"]["structuredContent"]
            await host.send(_call(3, "create_issue", {"title": "second", "idempotency_key": "k-second"}))
            assert host.proc.stdin is not None
            host.proc.stdin.close()
            answers, code = await _to_the_end(host)
        finally:
            await person.close()
        second = _only(answers, 3)
        assert ("success", "success") == (first["category"], second["category"]), (first, answers)
        assert (1, 1) == (world.issues_titled("first"), world.issues_titled("second"))
        assert 0 == code

    async def test_a_call_waiting_for_a_person_is_withdrawn_and_the_host_told(self, world: World) -> None:
        """The host closes stdin while the person has not decided. The request is withdrawn (as
        before: the row leaves the person's screen, a late allow is refused, nothing runs) and the
        host now gets the vault's Result saying so, promptly, instead of "Connection closed"."""
        person = await Approver.connect(world.sandbox.home)
        host = await StdioHost.start(world)
        try:
            await host.send(_call(2, "create_issue", {"title": "abandoned", "idempotency_key": "k-abandoned"}))
            req = await person.request()
            assert host.proc.stdin is not None
            started = time.monotonic()
            host.proc.stdin.close()
            answers, code = await _to_the_end(host)
            took = time.monotonic() - started
            settled = await person.next("approval.settled")
            with pytest.raises(Exception, match="already settled"):
                await person.decide(req["request_id"], "allow_once")
        finally:
            await person.close()
        told = _only(answers, 2)
        assert ("approval_expired", "never", req["request_id"]) == (
            told["category"], told["retry"], told["request_id"]), told
        assert "withdrawn" in told["message"] and "nothing was sent" in told["message"]
        assert (req["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
        assert 0 == world.issues_titled("abandoned")
        assert 0 == code and took < 10, took  # withdrawn at once, not held for the wait budget

    async def test_many_calls_waiting_at_once_are_each_withdrawn_and_answered(self, world: World) -> None:
        """Twenty creates in flight on one stdio connection, each put to the person, then EOF: every
        one answered with its withdrawal, every row gone from the person's screen, nothing run."""
        person = await Approver.connect(world.sandbox.home)
        host = await StdioHost.start(world)
        try:
            for n in range(1, 21):
                await host.send(_call(n, "create_issue", {"title": f"many-{n}", "idempotency_key": f"k-many-{n}"}))
            asked = {(await person.request())["request_id"] for _ in range(20)}
            assert host.proc.stdin is not None
            host.proc.stdin.close()
            answers, code = await _to_the_end(host)
            gone = {(await person.next("approval.settled"))["request_id"] for _ in range(20)}
        finally:
            await person.close()
        told = [_only(answers, n) for n in range(1, 21)]
        assert ["approval_expired"] * 20 == [t["category"] for t in told], answers
        assert asked == gone == {t["request_id"] for t in told}
        assert 0 == sum(world.issues_titled(f"many-{n}") for n in range(1, 21))
        assert 0 == code


def test_a_pipe_host_is_graded_done(tmp_path: Any) -> None:
    """tests/mcp_agents/rt23m_pipe_host.py under the plugin's world: it writes its calls and closes
    the bridge's stdin, then reads its answers. Its read comes back a success Result and it claims
    done (before: "Connection closed", so it could only say not done of a read that ran)."""
    import subprocess
    import sys

    from helpers import ROOT

    test = tmp_path / "test_pipe.py"
    test.write_text(
        "import sys\n"
        f"AGENT = [sys.executable, {str(ROOT / 'tests' / 'mcp_agents' / 'rt23m_pipe_host.py')!r}]\n"
        "TASK = {'operations': ['read_issue'], 'deadline_s': 20,\n"
        "        'steps': [{'id': 'look', 'call': 'read_issue', 'params': {'issue_id': 'ISS-1'}}]}\n"
        "def test_pipe(vaultsim):\n"
        "    run = vaultsim.run_agent(AGENT, task=TASK, isolation='none')\n"
        "    assert run.settled == ['success'], (run.final, run.stderr[-2000:])\n"
        "    vaultsim.assert_verdict('PASS', outcome={'claim': 'done'})\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--rootdir", str(tmp_path), "-c", "/dev/null", str(test)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert 0 == out.returncode, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout


class TestAUrlHostThatEndsItsSessionWithACallWaiting:
    async def test_the_waiting_call_is_withdrawn_and_answered_before_the_session_ends(self, world: World) -> None:
        """A URL host DELETEs its MCP session while its own create waits for the person (a chat
        closed mid-call). The row was withdrawn but the POST ended with an empty 200: no answer at
        all. Now, as at stdio's EOF, it is answered with the vault's Result (withdrawn, nothing sent)
        before the session goes."""
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        person = await Approver.connect(world.sandbox.home)
        try:
            async with httpx.AsyncClient() as c, httpx.AsyncClient() as ender:
                sid = await _open(c, url)
                call = asyncio.create_task(_post(c, url, _call(2, "create_issue", {
                    "title": "closed chat", "idempotency_key": "k-closed"}), sid))
                req = await person.request()
                ended = await ender.delete(url, headers={"mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"})
                answer = await asyncio.wait_for(call, 30)
                settled = await person.next("approval.settled")
        finally:
            await person.close()
        assert 200 == ended.status_code
        told = _result(answer.text)
        assert ("approval_expired", req["request_id"]) == (told["category"], told["request_id"]), told
        assert (req["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
        assert 0 == world.issues_titled("closed chat")


class TestHttpBodiesThatAreJsonButNoMessage:
    async def test_each_is_answered_invalid_request_without_quoting_it(self, world: World) -> None:
        """A URL host that sends a batch (MCP 2025-03-26 had them), an empty batch, or `params`
        that is a list gets HTTP 400 with -32600 (the request's id when it has one), as JSON-RPC
        2.0 names an invalid request; a lone surrogate escape is -32602 naming where (as stdio
        answers); a body that is no JSON stays -32700. No answer quotes the body (a batch holding
        a token was echoed back in pydantic's report). The session still serves afterwards."""
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        token = "tok-" + "9f3a" * 8  # what a host's model might have put in an argument
        async with httpx.AsyncClient() as c:
            sid = await _open(c, url)
            batch = await _post(c, url, [_call(2, "create_issue", {"title": token}),
                                         {"jsonrpc": "2.0", "id": 3, "method": "ping"}], sid)
            empty = await _post(c, url, [], sid)
            listed = await _post(c, url, {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": [token]}, sid)
            h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                 "mcp-protocol-version": "2025-06-18", "mcp-session-id": sid}
            broken = await c.post(url, headers=h, content=json.dumps(_call(5, "read_issue", {"issue_id": "x"})).replace(
                '"x"', '"\\ud800"').encode())
            garbage = await c.post(url, headers=h, content=b"{" + token.encode())
            read = _result((await _post(c, url, _call(6, "read_issue", {"issue_id": "ISS-1"}), sid)).text)
        answers = [r.json() for r in (batch, empty, listed, broken, garbage)]
        assert [400] * 5 == [r.status_code for r in (batch, empty, listed, broken, garbage)], answers
        assert [(None, -32600), (None, -32600), (4, -32600), (5, -32602), (None, -32700)] == [
            (a["id"], a["error"]["code"]) for a in answers], answers
        assert "batch" in answers[0]["error"]["message"] and "own POST" in answers[0]["error"]["message"]
        assert "issue_id" in answers[3]["error"]["message"]
        assert token not in json.dumps(answers)
        assert "success" == read["category"]
