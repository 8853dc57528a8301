"""`vaultsim mcp` driven by the official TypeScript MCP SDK client (npm @modelcontextprotocol/sdk, on node).

tests/mcp_ts/host.mjs is a stand-in host: this test tells it what to call, the
way a model would, and is the person at the approver socket. The TypeScript
client is where the host timeouts come from: 60 s by default, reset on
progress when asked (`resetTimeoutOnProgress`), and `notifications/cancelled`
sent when it gives up. CI installs the client with `npm ci` (.ci/run).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from helpers import ROOT, Sandbox, new_sandbox
from mcp_world import EVENT_TIMEOUT_S, PY, Approver, World, bridge_argv, start_world

TS_DIR = ROOT / "tests" / "mcp_ts"
if shutil.which("node") is None:
    pytest.skip("node is not installed: the TypeScript MCP client tests need node 18+", allow_module_level=True)
if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
    pytest.skip("the TypeScript MCP SDK is not installed: run `npm ci --prefix tests/mcp_ts`",
                allow_module_level=True)
pytest.importorskip("mcp", reason="the bridge needs the mcp SDK (pip install 'vaultsim[mcp]')")


class TsHost:
    """The node process running host.mjs: commands in, JSON lines out, sorted by command id."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.ids = (f"c{n}" for n in itertools.count(1))
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, sandbox: Sandbox, *bridge_args: str, name: str = "claude-code",
                    version: str = "1.2") -> "TsHost":
        proc = await asyncio.create_subprocess_exec(
            "node", str(TS_DIR / "host.mjs"), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=open(sandbox.root / "ts-host.stderr", "a"), cwd=str(TS_DIR))
        host = cls(proc)
        hello = await host.ask({"do": "connect", "command": PY, "args": bridge_argv(*bridge_args),
                                "env": {**sandbox.env, "PYTHONPATH": str(ROOT)}, "name": name,
                                "version": version})
        assert "error" not in hello, hello
        host.server = hello
        return host

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            self.queue(msg["id"]).put_nowait(msg)

    def queue(self, cid: str) -> asyncio.Queue[dict[str, Any]]:
        return self.lines.setdefault(cid, asyncio.Queue())

    def send(self, cmd: dict[str, Any]) -> str:
        cid = next(self.ids)
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"id": cid, **cmd}) + "\n").encode())
        return cid

    async def next(self, cid: str, timeout: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        return await asyncio.wait_for(self.queue(cid).get(), timeout)

    async def answer(self, cid: str, timeout: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        """The final line for a command (progress lines skipped)."""
        while "progress" in (msg := await self.next(cid, timeout)):
            pass
        return msg

    async def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return await self.answer(self.send(cmd))

    def call(self, name: str, arguments: dict[str, Any], **opts: Any) -> str:
        return self.send({"do": "call", "name": name, "arguments": arguments, **opts})

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                await self.ask({"do": "close"})
            finally:
                self.proc.stdin.close()  # type: ignore[union-attr]
                try:
                    await asyncio.wait_for(self.proc.wait(), 15)
                except TimeoutError:
                    self.proc.kill()
                    await self.proc.wait()
        self.reader.cancel()


def structured(msg: dict[str, Any]) -> dict[str, Any]:
    assert "result" in msg, msg
    return msg["result"]["structuredContent"]


@pytest.fixture(scope="module")
def shared_world() -> Iterator[World]:
    """One remote and daemon for the module; every test brings its own host, bridge and vault session."""
    box = new_sandbox()
    try:
        yield start_world(box)
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


@pytest.fixture
async def host(shared_world: World) -> AsyncIterator[TsHost]:
    h = await TsHost.start(shared_world.sandbox, "--progress-every", "0.2", "--cancel-grace", "0.3")  # grace: test_mcp44
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def person(shared_world: World) -> AsyncIterator[Approver]:
    p = await Approver.connect(shared_world.sandbox.home)
    try:
        yield p
    finally:
        await p.close()


class TestTypeScriptHost:
    async def test_lists_one_tool_per_operation_with_schemas_ajv_compiles(self, host: TsHost) -> None:
        listed = await host.ask({"do": "list"})
        names = {t["name"] for t in listed["tools"]}
        assert {"read_issue", "create_issue", "delete_release", "restart_service", "vault_resume",
                "vault_lookup"} <= names
        assert [] == listed["invalid"]
        assert all(t["outputSchema"]["type"] == "object" for t in listed["tools"])
        assert "vaultsim" == host.server["server"]["name"] and host.server["server"]["version"]
        assert host.server["capabilities"]["tools"]["listChanged"] is True

    async def test_read_grant_and_denial(self, host: TsHost, person: Approver, shared_world: World) -> None:
        """Read unasked; a session-approved create carries the second; a per-call delete is denied.
        Structured content passes the SDK's own output-schema validation on every answer."""
        read = structured(await host.ask({"do": "call", "name": "read_issue", "arguments": {"issue_id": "ISS-1"}}))
        first = host.call("create_issue", {"title": "ts one"})
        req = await person.request()
        assert "claude-code 1.2" in req["client"]["text"] and "mcp" == req["client"]["via"]
        await person.decide(req["request_id"], "allow_session")
        created = structured(await host.answer(first))
        second = structured(await host.ask({"do": "call", "name": "create_issue", "arguments": {"title": "ts two"}}))
        delete = host.call("delete_release", {"release_id": "r-1"})
        req = await person.request()
        assert "delete_release" == req["operation"]
        await person.decide(req["request_id"], "deny")
        denied = await host.answer(delete)
        assert 0 == person.seen("approval.requested")
        assert "success" == read["category"] == created["category"] == second["category"]
        assert denied["result"]["isError"] is True
        assert ("approval_denied", "never") == (structured(denied)["category"], structured(denied)["retry"])
        assert 1 == shared_world.issues_titled("ts one") == shared_world.issues_titled("ts two")
        assert shared_world.secret not in json.dumps([read, created, second, denied])

    async def test_progress_keeps_a_short_timeout_alive(self, host: TsHost, person: Approver,
                                                        shared_world: World) -> None:
        """A 1.5 s client timeout, reset on progress: the call outlives it and returns the decision."""
        cid = host.call("create_issue", {"title": "ts outlives"}, timeout=1500, reset=True, progress=True)
        req = await person.request()
        ticks = []
        while len(ticks) < 12:  # 12 ticks of 0.2 s: well past the 1.5 s timeout
            msg = await host.next(cid)
            assert "progress" in msg, msg  # no timeout error meanwhile
            ticks.append(msg["progress"])
        await person.decide(req["request_id"], "allow_once")
        done = await host.answer(cid)
        assert "success" == structured(done)["category"]
        assert ticks == sorted(ticks)
        assert 1 == shared_world.issues_titled("ts outlives")

    async def test_hard_timeout_gets_a_token_then_resumes(self, shared_world: World, person: Approver) -> None:
        """A budget under the client's fixed timeout: approval_pending with token and deadline in
        time, then vault_resume after the decision, one execution."""
        h = await TsHost.start(shared_world.sandbox, "--wait-budget", "1", "--progress-every", "0.2")
        try:
            pending = structured(await h.ask({"do": "call", "name": "create_issue",
                                              "arguments": {"title": "ts later"}, "timeout": 5000}))
            req = await person.request()
            await person.decide(req["request_id"], "allow_once")
            done = structured(await h.ask({"do": "call", "name": "vault_resume",
                                           "arguments": {"resume_token": pending["resume_token"]}}))
        finally:
            await h.close()
        assert ("approval_pending", "after_approval") == (pending["category"], pending["retry"])
        assert pending["deadline"] > 0 and pending["request_id"] == req["request_id"]
        assert "success" == done["category"]
        assert 1 == shared_world.issues_titled("ts later")

    @pytest.mark.parametrize("how", ["timeout", "abort"])
    async def test_cancelled_call_never_runs(self, host: TsHost, person: Approver, shared_world: World,
                                             how: str) -> None:
        """The host times out or aborts: notifications/cancelled withdraws the request at the vault,
        the approver sees it go, and nothing reaches the remote even if someone says yes."""
        from vault.errors import RpcError

        title = f"ts abandoned {how}"
        opts = {"timeout": 1000} if how == "timeout" else {}
        cid = host.call("create_issue", {"title": title}, **opts)
        req = await person.request()
        if how == "abort":
            await host.ask({"do": "abort", "target": cid})
        failed = await host.answer(cid)
        settled = await person.next("approval.settled")
        with pytest.raises(RpcError):
            await person.decide(req["request_id"], "allow_once")
        assert "error" in failed
        assert (req["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
        assert 0 == shared_world.issues_titled(title)

    async def test_two_calls_run_at_once(self, host: TsHost, person: Approver) -> None:
        """A read sent while a create waits for a person is answered first."""
        create = host.call("create_issue", {"title": "ts concurrent"})
        req = await person.request()
        read = structured(await host.ask({"do": "call", "name": "read_issue", "arguments": {"issue_id": "ISS-1"}}))
        assert host.queue(create).empty()  # still waiting
        await person.decide(req["request_id"], "allow_once")
        assert "success" == read["category"] == structured(await host.answer(create))["category"]

    async def test_unroutable_without_an_approver(self, host: TsHost, shared_world: World) -> None:
        async def no_approvers() -> bool:
            return (shared_world.sandbox.status() or {}).get("approvers") == 0

        from mcp_world import eventually
        await eventually(no_approvers, what="earlier tests' approvers to leave")
        res = structured(await host.ask({"do": "call", "name": "create_issue", "arguments": {"title": "ts nobody"}}))
        assert ("approval_unroutable", "human_required") == (res["category"], res["retry"])
