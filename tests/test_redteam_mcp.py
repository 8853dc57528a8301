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
    an MCP agent under        the bridge opened its vault session under the MCP client's
    `vaultsim run`            name, not the task's `agent`: an approver rule for that agent
                              never matched, and a careful MCP agent was denied where the
                              same agent on the raw socket passed
    a wait past the deadline  under `vaultsim run` the bridge held a call waiting for a person
                              for its whole budget (50 s) past the task's deadline: a careful
                              MCP agent that would have stopped with "waiting" was killed
                              (FAIL_DEADLINE) instead of being graded EXPECTED_WAIT
    a framework's MCP server  pydantic-ai (FastMCP) starts `vaultsim mcp` in a session of its
    ending after the agent    own and does not wait for it to exit: without a jail the bridge,
                              still closing, was counted as a process the agent left running,
                              and a careful pydantic-ai agent got FAIL_DEADLINE (in a jail the
                              same once the jail counted such processes); now a process that
                              ends on its own within 2 s of the agent was not left running
    another process, same     over HTTP, a process that presented another MCP session's
    session id                Mcp-Session-Id rode that session's grant: its create_issue ran
                              without asking anyone (the agent socket refuses a session id
                              from any process but its opener; the HTTP bridge did not)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox
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


# another process of the same user that learnt the session id (a log line, a shared temp file)
INTRUDER = r"""
import json, sys, httpx
url, sid = sys.argv[1], sys.argv[2]
h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
     "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "create_issue", "arguments": {"title": "intruder", "idempotency_key": "i1"}}}
answers = [httpx.post(url, headers=h, json=call, timeout=30), httpx.delete(url, headers=h, timeout=30)]
print(json.dumps([[a.status_code, a.text[:400]] for a in answers]))
"""


async def _post(c: Any, url: str, body: dict[str, Any], sid: str | None = None) -> Any:
    h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
         "mcp-protocol-version": "2025-06-18"}
    if sid:
        h["mcp-session-id"] = sid
    return await c.post(url, headers=h, json=body, timeout=30)


def _sse_result(text: str) -> dict[str, Any]:
    data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    return dict(json.loads(data[-1] if data else text)["result"]["structuredContent"])


class TestHttpSessionIsItsOpenersAlone:
    async def test_another_process_with_the_session_id_is_refused(self, world: World) -> None:
        """Process A opens an HTTP MCP session and gets a session grant for create_issue; process B
        presents A's Mcp-Session-Id: its call and its DELETE are refused (403), nothing runs, and A's
        session still rides its grant."""
        httpx = pytest.importorskip("httpx")
        from test_mcp_http import start_http_bridge

        _, url = start_http_bridge(world.sandbox)
        person = await Approver.connect(world.sandbox.home)
        try:
            async with httpx.AsyncClient() as c:
                opened = await _post(c, url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "victim", "version": "1"}}})
                sid = opened.headers["mcp-session-id"]
                await _post(c, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)

                def create(title: str, rid: int) -> Any:
                    return _post(c, url, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
                        "name": "create_issue", "arguments": {"title": title, "idempotency_key": title}}}, sid)

                first = asyncio.create_task(create("granted", 2))
                req = await person.request()
                await person.decide(req["request_id"], "allow_session")
                granted = _sse_result((await first).text)
                out = await asyncio.to_thread(subprocess.run, [PY, "-c", INTRUDER, url, sid],
                                              capture_output=True, text=True, timeout=60)
                answers = json.loads(out.stdout or "null")
                again = _sse_result((await create("again", 3)).text)
            assert 0 == person.seen("approval.requested")
        finally:
            await person.close()
        assert "success" == granted["category"] and "success" == again["category"], (granted, again)
        assert answers is not None, out.stderr[-2000:]
        assert [403, 403] == [code for code, _ in answers], answers
        assert "belongs to process" in answers[0][1]
        assert 0 == world.issues_titled("intruder")
        assert 1 == world.issues_titled("granted") == world.issues_titled("again")
        assert world.secret not in json.dumps([granted, again, answers])


BY_NAME = """
title: "the approver allows the filer agent, by name"
approver: {rules: [{match: {agent: filer}, decide: allow_once}]}
agents: [{plan: @SC@/plans/file-issue.yaml}]
task: {deadline_s: 120}
expect:
  verdict: PASS
  effects: {create_issue: 1}
  outcome: {claim: done}
  prompts: {max: 1}
"""


WAIT = """
title: "a legitimate wait the MCP agent hands over before its deadline"
approver: {rules: [{match: {}, decide: ignore}]}
agents: [{plan: @SC@/plans/file-issue.yaml}]
task: {deadline_s: 20}
expect:
  verdict: EXPECTED_WAIT
  call: create_issue
  category: approval_pending
  effects: {create_issue: 0}
  outcome: {claim: wait}
  prompts: {max: 1}
"""


def _run_mcp_agent(tmp_path: Path, scenario: str, mode: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    (tmp_path / "sc.yaml").write_text(textwrap.dedent(scenario).replace("@SC@", str(ROOT / "scenarios")))
    report = tmp_path / "r.json"
    agent = ROOT / "tests" / "mcp_agents" / "hostile_mcp_agent.py"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(tmp_path / "sc.yaml"),
                           "--agent", f"{{python}} {agent} {mode}", "--json", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    return proc, json.loads(report.read_text())["scenarios"][0]["trial_results"][0]


def test_a_call_waiting_for_a_person_answers_before_the_task_deadline(tmp_path: Path) -> None:
    """The person never decides; the bridge's own budget (50 s) is longer than the task (20 s). The
    call answers approval_pending in time, the agent says "waiting" and exits: EXPECTED_WAIT."""
    proc, trial = _run_mcp_agent(tmp_path, WAIT, "waiter")
    assert 0 == proc.returncode, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert ["EXPECTED_WAIT"] == [trial["verdict"], *trial.get("failed", [])[1:]], trial.get("findings")
    agent = trial["agents"][0]
    assert agent["final"].startswith("waiting") and not agent["killed_at_deadline"] and 0 == agent["exit_code"]


def test_an_mcp_agent_opens_its_session_under_the_tasks_agent_name(tmp_path: Path) -> None:
    """Under `vaultsim run --agent`, an MCP-speaking agent (its client calls itself hostile-mcp) acts
    as the task's agent `filer`: the approver's rule for filer allows it, as for a raw-socket agent."""
    proc, trial = _run_mcp_agent(tmp_path, BY_NAME, "careful")
    assert 0 == proc.returncode, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "PASS" == trial["verdict"] and trial["agents"][0]["final"].startswith("done")
    assert {"filer"} == {e.get("agent") for e in trial["transcript"]}
    assert "resume create_issue success" in [f"{e['kind']} {e['operation']} {e['category']}"
                                             for e in trial["transcript"]]


def test_a_framework_agent_whose_mcp_server_is_still_ending_is_not_failed(tmp_path: Path) -> None:
    """pydantic-ai's MCP client leaves `vaultsim mcp` to end on its own after the agent's last word;
    graded without a jail (where every process outside the agent's group is looked for), the
    healthy delivery still passes, and nothing of the agent is left afterwards."""
    pytest.importorskip("pydantic_ai.mcp", reason="pydantic-ai-slim[mcp] is not installed (the test extra)")
    from test_mcp_pydantic_ai import HEALTHY
    (tmp_path / "sc.yaml").write_text(textwrap.dedent(HEALTHY).replace("@SC@", str(ROOT / "scenarios")))
    report = tmp_path / "r.json"
    agent = ROOT / "tests" / "mcp_agents" / "pydantic_ai_agent.py"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(tmp_path / "sc.yaml"), "--isolation", "none",
                           "--agent", f"{{python}} {agent}", "--json", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    trial = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    assert 0 == proc.returncode, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "PASS" == trial["verdict"] and not trial["agents"][0].get("left_running"), trial.get("findings")


_OPENER = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
import httpx
url, n = sys.argv[1], int(sys.argv[2])
h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
     "mcp-protocol-version": "2025-06-18"}
hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "many", "version": "1"}}}
def open_and_read(c):
    sid = c.post(url, headers=h, json=hello, timeout=30).headers["mcp-session-id"]
    c.post(url, headers={**h, "mcp-session-id": sid}, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, timeout=30)
    read = c.post(url, headers={**h, "mcp-session-id": sid}, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                  "params": {"name": "read_issue", "arguments": {"issue_id": "ISS-1"}}}, timeout=30)
    data = [ln[5:].strip() for ln in read.text.splitlines() if ln.startswith("data:")]
    return json.loads(data[-1] if data else read.text)["result"]["structuredContent"]["category"]
with httpx.Client() as c, ThreadPoolExecutor(8) as pool:
    print(json.dumps(list(pool.map(lambda _: open_and_read(c), range(n)))))
"""


class TestHttpSessionCap:
    async def test_past_the_daemons_connection_cap_an_mcp_session_is_refused_at_connect(self, world: World) -> None:
        """Each HTTP MCP session holds one of the bridge's agent-socket connections, and the daemon
        allows a process 256 (one is the catalog watch's). Every session within that reads through
        the vault; the next is refused at connect (503), where it used to open and then answer every
        call `local_failure`, nothing sent. The sessions are opened by five processes: one process
        holds at most a quarter of them (test_hostile15)."""
        httpx = pytest.importorskip("httpx")
        from test_mcp_http import start_http_bridge
        from vault.mcp.http import MAX_HTTP_SESSIONS, MAX_HTTP_SESSIONS_PER_PROCESS

        _, url = start_http_bridge(world.sandbox)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "many", "version": "1"}}}
        left, categories = MAX_HTTP_SESSIONS, []
        while left:
            n = min(left, MAX_HTTP_SESSIONS_PER_PROCESS)
            opener = await asyncio.create_subprocess_exec(sys.executable, "-c", _OPENER, url, str(n),
                                                          stdout=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(opener.communicate(), 120)
            assert opener.returncode == 0
            categories += json.loads(out)
            left -= n
        assert len(categories) == MAX_HTTP_SESSIONS and {"success"} == set(categories)
        async with httpx.AsyncClient() as c:
            assert 503 == (await _post(c, url, hello)).status_code
