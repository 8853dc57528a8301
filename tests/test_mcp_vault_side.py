"""What the MCP bridge needs from the agent socket: `catalog`, `call.cancel`, and session labels.

Driven on the raw agent socket (no MCP), against a real daemon and remote, with
the test as the approver, so each method is checked on its own terms.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from audit_daemon_helpers import events
from helpers import Sandbox, stop_process
from mcp_world import Approver, RelayAgent, World, start_world


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def agent(world: World, name: str = "agent-a", run_id: str = "r1", client: dict[str, Any] | None = None):
    from vault.client import AsyncRpcClient

    c = await AsyncRpcClient.connect(world.sandbox.agent_sock)
    params: dict[str, Any] = {"agent": name, "run_id": run_id}
    if client is not None:
        params["client"] = client
    sid = (await c.request("session.open", **params))["session_id"]
    return c, sid


class TestCatalog:
    async def test_operations_with_their_approval_rule_and_nothing_internal(self, world: World) -> None:
        """`catalog` names each operation with risk, params and the policy's rule; no endpoint or credential."""
        c, _ = await agent(world)
        try:
            first = await c.request("catalog")
            second = await c.request("catalog")
        finally:
            await c.close()
        ops = {op["name"]: op for op in first["operations"]}
        assert {"mode": "per_call", "deadline_s": 120.0} == ops["delete_release"]["approval"]
        assert "auto" == ops["read_issue"]["approval"]["mode"]
        # as the catalog file spells it (maxLength, not the model's max_length)
        assert {"type": "string", "required": True, "summary": True, "maxLength": 64} == \
            ops["read_issue"]["params"]["issue_id"]
        assert ops["create_issue"]["mutates"] and ops["create_issue"]["idempotent"]
        text = str(first)
        for internal in ("/v1/", "tracker_token", "executor", "credential", "http://"):
            assert internal not in text
        assert first["fingerprint"] == second["fingerprint"]


class TestCancel:
    """The agent runs in its own process (RelayAgent), so this test process can be its approver."""

    async def test_pending_request_is_withdrawn_and_never_runs(self, world: World) -> None:
        """call.cancel takes a pending request back: the approver's row goes, a late allow is refused,
        a resume says withdrawn, and the remote is never contacted."""
        from vault.errors import RpcError

        person = await Approver.connect(world.sandbox.home)
        a = await RelayAgent.start(world.sandbox)
        try:
            sid = (await a.request("session.open", agent="agent-a", run_id="r1"))["session_id"]
            pending = await a.request("call", session_id=sid, operation="create_issue",
                                      params={"title": "taken back"}, wait_s=0)
            req = await person.request()
            out = await a.request("call.cancel", session_id=sid, resume_token=pending["resume_token"])
            settled = await person.next("approval.settled")
            with pytest.raises(RpcError) as late:
                await person.decide(req["request_id"], "allow_once")
            resumed = await a.request("call.resume", session_id=sid, resume_token=pending["resume_token"])
            again = await a.request("call.cancel", session_id=sid, resume_token=pending["resume_token"])
            stats = await person.client.request("stats", run_id="r1")
        finally:
            await a.close()
            await person.close()
        assert (True, "withdrawn", "pending") == (out["withdrawn"], out["state"], out["was"])
        assert ("withdrawn", "withdrawn") == (settled["state"], settled["decision"])
        assert "withdrawn" in late.value.message
        assert ("approval_expired", "never") == (resumed["category"], resumed["retry"])
        assert "withdrawn" in resumed["message"]
        assert (False, "withdrawn") == (again["withdrawn"], again["state"])
        assert 1 == stats["runs"]["r1"]["decisions"]["withdrawn"]
        assert 0 == world.issues_titled("taken back")

    async def test_allowed_but_uncollected_request_is_withdrawn_too(self, world: World) -> None:
        """A request allowed while nobody waited has not run yet: cancelling it still means it never runs."""
        person = await Approver.connect(world.sandbox.home)
        a = await RelayAgent.start(world.sandbox)
        try:
            sid = (await a.request("session.open", agent="agent-a", run_id="r1"))["session_id"]
            pending = await a.request("call", session_id=sid, operation="create_issue",
                                      params={"title": "allowed then dropped"}, wait_s=0)
            req = await person.request()
            await person.decide(req["request_id"], "allow_once")
            out = await a.request("call.cancel", session_id=sid, resume_token=pending["resume_token"])
            resumed = await a.request("call.resume", session_id=sid, resume_token=pending["resume_token"])
        finally:
            await a.close()
            await person.close()
        assert (True, "allowed") == (out["withdrawn"], out["was"])
        assert ("approval_expired", "never") == (resumed["category"], resumed["retry"])
        assert 0 == world.issues_titled("allowed then dropped")

    async def test_a_withdrawn_call_leaves_whole_records_and_no_intent(self, world: World) -> None:
        """In the audit log a withdrawn call is what happened: asked, shown, answered pending, withdrawn
        by the agent (and, when collected, answered withdrawn). No intent (nothing was sent), so `audit
        show` has no call of unknown outcome, and once the daemon stopped (its last head signed) the
        log verifies intact."""
        from vault.audit import verify
        from vault.audit.show import no_result

        person = await Approver.connect(world.sandbox.home)
        a = await RelayAgent.start(world.sandbox)
        try:
            sid = (await a.request("session.open", agent="agent-a", run_id="r1"))["session_id"]
            pending = await a.request("call", session_id=sid, operation="create_issue",
                                      params={"title": "pending, taken back"}, wait_s=0)
            await person.request()
            await a.request("call.cancel", session_id=sid, resume_token=pending["resume_token"])
            await a.request("call.resume", session_id=sid, resume_token=pending["resume_token"])
            allowed = await a.request("call", session_id=sid, operation="create_issue",
                                      params={"title": "allowed, taken back"}, wait_s=0)
            req = await person.request()
            await person.decide(req["request_id"], "allow_once")
            await a.request("call.cancel", session_id=sid, resume_token=allowed["resume_token"])
        finally:
            await a.close()
            await person.close()
        stop_process(world.daemon)  # SIGTERM: in-flight answers recorded, the last head signed
        evs = events(world.sandbox)

        def records(cid: str) -> list[tuple[str, str | None]]:
            return [(ev["type"], ev.get("category") or ev.get("decision"))
                    for ev in evs if ev.get("correlation_id") == cid]

        assert [("call_requested", None), ("prompt_shown", None), ("classification", "approval_pending"),
                ("decision", "withdrawn"), ("classification", "approval_expired")] == \
            records(pending["correlation_id"])
        assert [("call_requested", None), ("prompt_shown", None), ("classification", "approval_pending"),
                ("decision", "allow_once"), ("decision", "withdrawn")] == records(allowed["correlation_id"])
        withdrawals = [ev for ev in evs if ev.get("decision") == "withdrawn"]
        assert [("agent", "pending"), ("agent", "allowed")] == [(ev["by"], ev["was"]) for ev in withdrawals]
        assert [] == no_result(evs)
        assert "intact" == verify(world.sandbox.home / "audit.log").status
        assert 0 == world.issues_titled("pending, taken back") + world.issues_titled("allowed, taken back")

    async def test_too_late_once_it_ran_and_never_for_another_agent(self, world: World) -> None:
        """A request that already ran is reported as such; another agent's token is unknown to it."""
        from vault.errors import RpcError

        person = await Approver.connect(world.sandbox.home)
        a = await RelayAgent.start(world.sandbox)
        b = await RelayAgent.start(world.sandbox)
        try:
            sid = (await a.request("session.open", agent="agent-a", run_id="r1"))["session_id"]
            other = (await b.request("session.open", agent="agent-b", run_id="r1"))["session_id"]
            pending = await a.request("call", session_id=sid, operation="create_issue",
                                      params={"title": "ran"}, wait_s=0)
            with pytest.raises(RpcError) as foreign:
                await b.request("call.cancel", session_id=other, resume_token=pending["resume_token"])
            req = await person.request()
            await person.decide(req["request_id"], "allow_once")
            done = await a.request("call.resume", session_id=sid, resume_token=pending["resume_token"])
            late = await a.request("call.cancel", session_id=sid, resume_token=pending["resume_token"])
        finally:
            await a.close()
            await b.close()
            await person.close()
        assert "unknown resume token" in foreign.value.message
        assert "success" == done["category"]
        assert (False, "allowed", True) == (late["withdrawn"], late["state"], late["started"])
        assert 1 == world.issues_titled("ran")


class TestClientLabel:
    async def test_label_is_a_claim_and_only_ancestry_is_checked(self, world: World) -> None:
        """The approver gets the label marked as claimed; `host_verified` only when the named host
        pid is an ancestor of the process that opened the session."""
        person = await Approver.connect(world.sandbox.home)
        c, _ = await agent(world, client={"name": "claude-code", "version": "1.2", "host_pid": os.getpid(),
                                          "via": "mcp"})
        try:
            ours = (await person.next("session.opened"))["client"]
            child = subprocess.run([sys.executable, "-c", CHILD_OPENS_SESSION], env={
                **world.sandbox.env, "SOCK": str(world.sandbox.agent_sock), "HOST": str(os.getpid())},
                capture_output=True, text=True, timeout=60)
            childs = (await person.next("session.opened"))["client"]
        finally:
            await c.close()
            await person.close()
        assert 0 == child.returncode, child.stderr
        # this process named itself: not its own ancestor, so the claim stays unverified
        assert ("claude-code 1.2 (pid %d) via mcp" % os.getpid(), True, False) == (
            ours["text"], ours["claimed"], ours["host_verified"])
        assert ("host", os.getpid(), True) == (childs["name"], childs["host_pid"], childs["host_verified"])

    async def test_pid_1_is_no_verified_host(self, world: World) -> None:
        """pid 1 is every process's ancestor: naming it says nothing about who started the agent,
        so the approver is never told it was checked (an agent claiming `host_pid: 1` was shown
        as run by its host)."""
        person = await Approver.connect(world.sandbox.home)
        c, _ = await agent(world, client={"name": "claude-code", "host_pid": 1})
        try:
            label = (await person.next("session.opened"))["client"]
        finally:
            await c.close()
            await person.close()
        assert (1, True, False) == (label["host_pid"], label["claimed"], label["host_verified"])

    BAD = {"escape": {"name": "evil\x1b[2Jhost"}, "empty": {"name": ""}, "too-long": {"name": "x" * 65},
           "bidi": {"name": "ok", "via": "\u202eltr"}, "pid-0": {"name": "ok", "host_pid": 0},
           "pid-true": {"name": "ok", "host_pid": True}, "pid-text": {"name": "ok", "host_pid": "4121"},
           "unknown-field": {"name": "ok", "extra": 1}, "not-an-object": "claude"}

    async def test_bad_labels_are_refused(self, sandbox: Sandbox) -> None:
        """A label that could steer the approver's screen, or is not a label, is refused as bad params."""
        from vault.client import AsyncRpcClient
        from vault.errors import RpcError

        sandbox.start_daemon()
        c = await AsyncRpcClient.connect(sandbox.agent_sock)
        codes = {}
        try:
            for name, label in self.BAD.items():
                try:
                    await c.request("session.open", agent="a", client=label)
                    codes[name] = "accepted"
                except RpcError as exc:
                    codes[name] = exc.rpc_code
        finally:
            await c.close()
        assert {name: -32602 for name in self.BAD} == codes


class TestLinkAtTheConnectionCap:
    async def test_a_refused_connection_is_answered_as_a_result_and_then_recovers(self, world: World) -> None:
        """Past the daemon's per-process connection cap (an HTTP bridge serving that many MCP
        sessions) a tool call is a local_failure Result with nothing sent, not an exception; once
        connections are free again the same link opens its session and calls."""
        from vault.daemon.limits import MAX_CONNECTIONS_PER_PROCESS
        from vault.mcp.link import VaultLink, WaitPolicy
        from vault.models import Category

        held = []
        link = VaultLink(str(world.sandbox.agent_sock), "agent-a", "r1", None, WaitPolicy())
        try:
            for _ in range(MAX_CONNECTIONS_PER_PROCESS):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(world.sandbox.agent_sock))
                held.append(s)
            refused = await link.call("read_issue", {"issue_id": "ISS-1"}, None, None, mutates=False)
            for s in held:
                s.close()
            held.clear()
            deadline = time.monotonic() + 30
            while True:  # the daemon frees the closed connections on its own schedule
                done = await link.call("read_issue", {"issue_id": "ISS-1"}, None, None, mutates=False)
                if done.category is not Category.local_failure or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
        finally:
            for s in held:
                s.close()
            await link.close()
        assert (Category.local_failure, "bounded") == (refused.category, str(refused.retry))
        assert "did not open a session" in refused.message and "nothing was sent" in refused.message
        assert Category.success == done.category, done.message


class TestTuiShowsTheLabel:
    def test_pending_row_and_session_show_who_the_agent_acts_for(self) -> None:
        from tui.state import AgentSession, Request

        client = {"name": "claude-code", "version": "1.2", "host_pid": 4121, "via": "mcp",
                  "text": "claude-code 1.2 (pid 4121) via mcp", "claimed": True, "host_verified": False}
        req = Request.from_wire({"request_id": "r-1", "agent": "claude-code", "pid": 777, "client": client})
        s = AgentSession.from_wire({"session_id": "s-1", "agent": "claude-code", "pid": 777, "client": client})
        bare = Request.from_wire({"request_id": "r-2", "agent": "stub", "pid": 778})
        assert ("claude-code 1.2 (pid 4121) via mcp", False) == (req.who, req.client_verified)
        assert "claude-code 1.2 (pid 4121) via mcp" == s.who
        assert "stub" == bare.who


CHILD_OPENS_SESSION = """
import os
from vault.client import AgentClient
c = AgentClient(os.environ["SOCK"])
c.request("session.open", agent="child", client={"name": "host", "host_pid": int(os.environ["HOST"])})
"""
