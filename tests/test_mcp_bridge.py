"""`vaultsim mcp` over stdio, driven by the official Python MCP SDK client the way a host drives it.

Real processes throughout: the fake remote (its ledger is the evidence of
what ran), the daemon, the bridge started by the SDK's stdio client, and the
test as the person at the approver socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from audit_daemon_helpers import events
from helpers import Sandbox, stop_process
from mcp_world import Approver, World, mcp_stdio, result_of, start_world

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")
jsonschema = pytest.importorskip("jsonschema")

FAST = ("--wait-budget", "30", "--progress-every", "0.2")


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


class TestDiscovery:
    async def test_one_tool_per_operation_with_valid_schemas(self, world: World) -> None:
        """tools/list names every catalog operation plus resume and lookup; each schema is valid JSON Schema."""
        async with mcp_stdio(world.sandbox) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            init = s.initialize_result
        assert {"read_issue", "create_issue", "attach_note", "delete_release", "read_build",
                "create_deployment", "update_record", "restart_service",
                "vault_resume", "vault_lookup"} == set(tools)
        for t in tools.values():
            jsonschema.Draft202012Validator.check_schema(t.input_schema)
            jsonschema.Draft202012Validator.check_schema(t.output_schema)
            assert "object" == t.input_schema["type"]
        create = tools["create_issue"]
        assert ["title"] == create.input_schema["required"]
        assert {"title", "body", "idempotency_key", "wait_s"} == set(create.input_schema["properties"])
        assert "Risk: create" in create.description and "asks a person" in create.description
        assert "every call asks" in tools["delete_release"].description
        assert tools["delete_release"].annotations.destructive_hint is True
        assert tools["read_issue"].annotations.read_only_hint is True
        assert "runs without asking anyone" in tools["read_issue"].description
        # the catalog's pattern reaches the schema: a host can refuse a bad name before sending it
        restart = tools["restart_service"].input_schema["properties"]["service_name"]
        validator = jsonschema.Draft202012Validator(tools["restart_service"].input_schema)
        assert validator.is_valid({"service_name": "web"})
        assert not validator.is_valid({"service_name": "web; rm -rf /"})
        assert "pattern" in restart
        assert "vaultsim" == init.server_info.name and "" != init.server_info.version
        assert init.capabilities.tools.list_changed is True

    async def test_catalog_resource_and_rules_prompt(self, world: World) -> None:
        """vault://catalog lists the operations and what each retry obliges; the prompt says it in words."""
        async with mcp_stdio(world.sandbox) as s:
            resources = (await s.list_resources()).resources
            doc = json.loads((await s.read_resource("vault://catalog")).contents[0].text)
            prompt = await s.get_prompt("vault-rules")
        assert ["vault://catalog"] == [str(r.uri) for r in resources]
        by_name = {op["name"]: op for op in doc["operations"]}
        assert "per_call" == by_name["delete_release"]["approval"]["mode"]
        assert "delete_release on release <release_id>" == by_name["delete_release"]["grant_scope"]
        assert "vault_lookup" in doc["retry"]["reconcile_first"]
        assert "vault_resume" in doc["retry"]["after_approval"]
        assert "reconcile_first" == doc["categories"]["outcome_unknown"]
        text = prompt.messages[0].content.text
        assert "reconcile_first" in text and "vault_resume" in text


class TestCalls:
    async def test_read_session_grant_denial_and_no_credential(self, world: World) -> None:
        """A read runs unasked; a create asks once and the second rides the grant; a per-call delete
        is asked and denied (nothing reaches the remote); no credential crosses."""
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_stdio(world.sandbox) as s:
                read = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}))
                first = asyncio.create_task(s.call_tool("create_issue", {"title": "via mcp 1"}))
                req = await person.request()
                assert ("create_issue", "pytest-host 7.1") == (req["operation"], req["client"]["name"] + " "
                                                               + req["client"]["version"])
                await person.decide(req["request_id"], "allow_session")
                created = result_of(await first)
                second = result_of(await s.call_tool("create_issue", {"title": "via mcp 2"}))
                delete = asyncio.create_task(s.call_tool("delete_release", {"release_id": "r-1"}))
                req = await person.request()
                assert "delete_release" == req["operation"] and not req["allow_session_offered"]
                await person.decide(req["request_id"], "deny")
                denied = await delete
            assert 0 == person.seen("approval.requested")  # the second create asked nobody
        finally:
            await person.close()
        assert ("success", True) == (read["category"], read["ok"])
        assert "success" == created["category"] and "success" == second["category"]
        assert denied.is_error is True
        assert ("approval_denied", "never") == (result_of(denied)["category"], result_of(denied)["retry"])
        assert 1 == world.issues_titled("via mcp 1") == world.issues_titled("via mcp 2")
        assert all(r.get("state") == "published" for r in world.state("releases"))
        shown = json.dumps([read, created, second, result_of(denied)])
        assert world.secret not in shown
        assert world.secret not in (world.sandbox.root / "mcp.stderr").read_text()

    async def test_unroutable_when_no_approver_is_connected(self, world: World) -> None:
        """With nobody to ask, a prompted call is refused at once as approval_unroutable, never left hanging."""
        async with mcp_stdio(world.sandbox) as s:
            res = result_of(await s.call_tool("create_issue", {"title": "nobody asked"}))
        assert ("approval_unroutable", "human_required") == (res["category"], res["retry"])
        assert 0 == world.issues_titled("nobody asked")

    async def test_bad_input_answers_in_the_result_shape(self, world: World) -> None:
        """Unknown tool, missing or extra parameter, a bad wait_s: each is a Result (isError), nothing sent."""
        async with mcp_stdio(world.sandbox) as s:
            answers = [await s.call_tool(name, args) for name, args in [
                ("no_such_operation", {}), ("read_issue", {}), ("read_issue", {"issue_id": "ISS-1", "x": 1}),
                ("read_issue", {"issue_id": "ISS-1", "wait_s": "soon"}), ("vault_resume", {}),
                ("vault_lookup", {})]]
        for a in answers:
            r = result_of(a)
            assert a.is_error and not r["ok"] and "local_failure" == r["category"], r
            assert {"ok", "category", "operation", "retry", "correlation_id", "message"} <= set(r)
        assert "no_such_operation" in result_of(answers[0])["message"]
        assert "issue_id" in result_of(answers[1])["message"]
        assert not [e for e in world.ledger()["operations"]]


class TestWaiting:
    async def test_progress_while_a_person_decides(self, world: World) -> None:
        """While the approval is pending the host gets increasing progress notifications; the
        decision made after them still completes the same call."""
        person = await Approver.connect(world.sandbox.home)
        ticks: list[tuple[float, str | None]] = []
        ticked = asyncio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            ticks.append((progress, message))
            if len(ticks) >= 3:
                ticked.set()

        try:
            async with mcp_stdio(world.sandbox, *FAST) as s:
                call = asyncio.create_task(s.call_tool("create_issue", {"title": "slow yes"},
                                                       progress_callback=on_progress))
                req = await person.request()
                await asyncio.wait_for(ticked.wait(), 30)
                await person.decide(req["request_id"], "allow_once")
                res = result_of(await call)
        finally:
            await person.close()
        assert "success" == res["category"]
        values = [p for p, _ in ticks]
        assert values == sorted(values) and len(set(values)) == len(values)
        assert "create_issue" in (ticks[0][1] or "") and req["request_id"] in (ticks[0][1] or "")
        assert 1 == world.issues_titled("slow yes")

    async def test_hard_timeout_host_gets_a_token_then_resumes(self, world: World) -> None:
        """A budget under the host's timeout: the call answers approval_pending with a token and a
        deadline in time; after the person decides, vault_resume returns the one execution."""
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_stdio(world.sandbox, "--wait-budget", "1", "--progress-every", "0.2") as s:
                pending = result_of(await s.call_tool("create_issue", {"title": "later"}, read_timeout_seconds=20))
                req = await person.request()
                assert 0 == world.issues_titled("later")
                await person.decide(req["request_id"], "allow_once")
                done = result_of(await s.call_tool("vault_resume", {"resume_token": pending["resume_token"]}))
                again = result_of(await s.call_tool("vault_resume", {"resume_token": pending["resume_token"]}))
        finally:
            await person.close()
        assert ("approval_pending", "after_approval") == (pending["category"], pending["retry"])
        assert pending["resume_token"] and pending["deadline"] > 0 and pending["request_id"] == req["request_id"]
        assert "success" == done["category"] and done["correlation_id"] == pending["correlation_id"]
        assert again["data"] == done["data"]  # collected twice, run once
        assert 1 == world.issues_titled("later")

    async def test_cancelled_call_is_withdrawn_and_never_runs(self, world: World) -> None:
        """The host gives up (timeout, notifications/cancelled): the request disappears for the
        approver, a late 'allow' is refused, and the remote never sees the call."""
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_stdio(world.sandbox, *FAST, "--cancel-grace", "0.3") as s:  # grace: test_mcp44
                call = asyncio.create_task(s.call_tool("create_issue", {"title": "abandoned"},
                                                       read_timeout_seconds=2))
                req = await person.request()
                with pytest.raises(Exception) as timed_out:
                    await call
                settled = await person.next("approval.settled")
                from vault.errors import RpcError
                with pytest.raises(RpcError) as late:
                    await person.decide(req["request_id"], "allow_once")
                # the session is still usable afterwards
                read = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}))
        finally:
            await person.close()
        assert "timed out" in str(timed_out.value).lower() or "timeout" in type(timed_out.value).__name__.lower()
        assert (req["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
        assert "withdrawn" in late.value.message
        assert "success" == read["category"]
        assert 0 == world.issues_titled("abandoned")
        assert not [e for e in world.ledger()["operations"] if e.get("operation") == "create_issue"]
        # its records: whole, withdrawn by the agent, and no intent (nothing was sent)
        stop_process(world.daemon)  # SIGTERM: in-flight answers recorded, the last head signed
        from vault.audit import verify
        mine = [ev for ev in events(world.sandbox) if ev.get("correlation_id") == req["correlation_id"]]
        assert not {"intent", "remote_result"} & {ev["type"] for ev in mine}
        assert [("withdrawn", "agent")] == [(ev["decision"], ev.get("by")) for ev in mine if ev["type"] == "decision"]
        assert {"approval_pending", "approval_expired"} >= \
            {ev["category"] for ev in mine if ev["type"] == "classification"}
        assert "intact" == verify(world.sandbox.home / "audit.log").status

    async def test_calls_on_one_session_run_concurrently(self, world: World) -> None:
        """A read sent while an approval is pending is answered at once; both complete."""
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_stdio(world.sandbox, *FAST) as s:
                create = asyncio.create_task(s.call_tool("create_issue", {"title": "meanwhile"}))
                req = await person.request()
                reads = await asyncio.wait_for(asyncio.gather(
                    s.call_tool("read_issue", {"issue_id": "ISS-1"}),
                    s.call_tool("read_build", {"build_id": "b-101"})), 20)
                assert not create.done()  # the read did not queue behind the pending create
                await person.decide(req["request_id"], "allow_once")
                created = result_of(await create)
        finally:
            await person.close()
        assert ["success", "success"] == [result_of(r)["category"] for r in reads]
        assert "success" == created["category"]


class TestIdentity:
    async def test_one_vault_session_labelled_with_the_host(self, world: World) -> None:
        """The approver sees the client's name and version and the host's pid (the bridge's parent,
        confirmed by the daemon), marked as a claim; the session and its grant end with the MCP session."""
        person = await Approver.connect(world.sandbox.home)
        try:
            async with mcp_stdio(world.sandbox, name="claude-code", version="1.2") as s:
                await s.list_tools()
                # the bridge opens its vault session when the host says `initialized`, beside
                # `tools/list`: the list's answer may come first
                deadline = time.monotonic() + 20
                while not (sessions := await person.sessions()) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                call = asyncio.create_task(s.call_tool("create_issue", {"title": "labelled"}))
                req = await person.request()
                await person.decide(req["request_id"], "allow_session")
                await call
                granted = await person.sessions()
            closed = await person.next("session.closed")
            ended = await person.next("grant.ended")
            after = await person.sessions()
        finally:
            await person.close()
        assert 1 == len(sessions)
        client = sessions[0]["client"]
        assert ("claude-code", "1.2", os.getpid(), "mcp") == (client["name"], client["version"],
                                                               client["host_pid"], client["via"])
        assert "claude-code 1.2 (pid %d) via mcp" % os.getpid() == client["text"]
        assert client["claimed"] is True and client["host_verified"] is True
        assert "claude-code" == sessions[0]["agent"]
        assert sessions[0]["pid"] != os.getpid()  # the fact: the bridge's own process
        assert "this mcp session of claude-code ends" in req["session_scope"]
        assert 1 == len(granted[0]["grants"])
        assert sessions[0]["session_id"] == closed["session_id"] == ended["session_id"]
        assert [] == after

    async def test_a_modern_era_client_gets_the_same_tools(self, world: World) -> None:
        """The SDK's high-level Client negotiates the 2026 protocol over stdio: same tools, same Results."""
        from mcp import Client, StdioServerParameters

        from mcp_world import PY, ROOT, bridge_argv
        params = StdioServerParameters(command=PY, args=bridge_argv(), env=world.sandbox.env, cwd=str(ROOT))
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            read = result_of(await client.call_tool("read_issue", {"issue_id": "ISS-1"}))
            version = client.session.protocol_version
        assert "2026-07-28" == version
        assert {"read_issue", "vault_resume"} <= names
        assert "success" == read["category"]
