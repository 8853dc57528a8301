"""A person (or a script) can read in full what they are asked to approve.

A prompt (`approval.requested`) carries each parameter cut to 80 characters, so
that a flood of prompts stays small; `approval.detail` answers a waiting
request's parameters in full, to the approvers who could decide it. These
tests run a real daemon, real agent processes and real approvers (the TUI
under Pilot, `vaultsim approve`), and check what each could read and decide:
the whole value, never a `[hidden]` one, never a credential.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from textual.containers import VerticalScroll

from helpers import Sandbox, canary, wait_for
from tui.messages import DetailFailed, LinkUp
from tui.widgets.detail import RequestDetail
from tui.widgets.pending import PendingTable
from tui_fixtures import (PENDING, Agent, agent, agents, main, offline_app, rows, start_agent,  # noqa: F401
                          text_of, tui, until)
from vault.client import AsyncRpcClient, connect_approver
from vault.errors import RpcError
from vault.home import VaultHome
from vault.jsonrpc import CONFLICT, NOT_AUTHORIZED
from vault.text import clip, quoted, was_clipped
from vault.wire import ApprovalDetail, ApprovalRequested, read

pytestmark = pytest.mark.timeout(180)

PASSED_GATE = "local_failure"  # no remote configured: an allowed call stops at the executor
MIDDLE = "MIDDLE-OF-THE-BODY"  # where a cut value shows neither end


def long_body(middle: str = MIDDLE, n: int = 4000) -> str:
    """`n` characters, `middle` at their centre: past what a prompt shows of either end."""
    half = (n - len(middle)) // 2
    return "Steps to reproduce: " + "a" * (half - 20) + middle + "z" * (n - half - len(middle) - 4) + " END"


# create_issue with a long title and a body marked not safe to show (summary: false)
HIDING_CATALOG = {"operations": {"create_issue": {
    "description": "Open a new issue in the tracker.", "risk": "create", "executor": "http",
    "service": "tracker", "method": "POST", "path": "/v1/issues", "credential": "tracker_token",
    "params": {"title": {"type": "string", "maxLength": 4096},
               "body": {"type": "string", "required": False, "summary": False}},
    "target": "tracker", "contract": "issue", "idempotent": True, "mutates": True}}}


class Notes:
    """An approver connection's `approval.requested` notifications, awaitable one by one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        if method == "approval.requested":
            self.queue.put_nowait(params)

    async def next(self) -> ApprovalRequested:
        return read(ApprovalRequested, await asyncio.wait_for(self.queue.get(), 60))


async def approver(sandbox: Sandbox, name: str = "ci") -> tuple[AsyncRpcClient, Notes]:
    notes = Notes()
    client, _ = await connect_approver(VaultHome(sandbox.home), name, notes)
    return client, notes


async def refused(client: AsyncRpcClient, request_id: str) -> RpcError:
    with pytest.raises(RpcError) as err:
        await client.request("approval.detail", request_id=request_id)
    return err.value


def daemon_logs(sandbox: Sandbox) -> str:
    """Everything the daemon and the approvers wrote: their output and the audit log."""
    files = [p for p in sandbox.root.rglob("*") if p.is_file() and
             (p.suffix in (".log", ".stderr", ".jsonl") or "audit" in p.parts)]
    assert any(p.name == "daemon.stderr" for p in files)
    return "\n".join(p.read_text(errors="replace") for p in files)


class TestTheMethod:
    async def test_a_waiting_request_is_answered_in_full_hidden_stays_hidden(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """A 4000-character title reaches the approver cut (both ends, the middle left out);
        `approval.detail` gives it whole, with the agent, operation and risk of the prompt; a
        body not marked safe to show stays `[hidden]` (its canary value is in no answer), and the
        canary credential is in no answer and no log."""
        secret = canary()
        sandbox.set_secret("tracker_token", secret)
        catalog = sandbox.write("hiding-catalog.yaml", HIDING_CATALOG)
        sandbox.start_daemon("--catalog", str(catalog))
        client, notes = await approver(sandbox)
        title, hidden_body = long_body(), canary()
        try:
            a = await start_agent(sandbox, f"call('create_issue', title={title!r}, body={hidden_body!r})\n",
                                  name="triage")
            agents.append(a)
            note = await notes.next()
            assert was_clipped(note.params["title"]) and MIDDLE not in note.params["title"]
            raw = await client.request("approval.detail", request_id=note.request_id)
            detail = read(ApprovalDetail, raw)
            assert ApprovalDetail(request_id=note.request_id, agent="triage", operation="create_issue",
                                  risk="create", params={"title": title, "body": "[hidden]"}) == detail
            assert ["request_id", "agent", "operation", "risk", "params"] == list(raw)
            answer = json.dumps(raw)
            assert hidden_body not in answer and secret not in answer
            await client.request("decide", request_id=note.request_id, decision="deny")
            assert "approval_denied" == (await a.next())["category"]
            await a.finish()
        finally:
            await client.close()
        logs = daemon_logs(sandbox)
        assert secret not in logs

    async def test_only_an_approver_who_said_hello_may_read(self, sandbox: Sandbox,
                                                            agents: list[Agent]) -> None:
        """A client that did not say hello, and one that said it with a wrong token, are
        refused as `decide` refuses them (-32001), and learn nothing of the parameters."""
        sandbox.start_daemon()
        client, notes = await approver(sandbox)
        stranger = await AsyncRpcClient.connect(sandbox.home / "approver.sock")
        liar = await AsyncRpcClient.connect(sandbox.home / "approver.sock")
        try:
            a = await start_agent(sandbox, f"call('create_issue', title='t', body={long_body()!r})\n")
            agents.append(a)
            rid = (await notes.next()).request_id
            err = await refused(stranger, rid)
            assert NOT_AUTHORIZED == err.rpc_code and "approver.hello" in err.message
            with pytest.raises(RpcError):
                await liar.request("approver.hello", token="not-the-token", name="liar")
            err = await refused(liar, rid)
            assert NOT_AUTHORIZED == err.rpc_code and MIDDLE not in err.message
            assert MIDDLE in (await client.request("approval.detail", request_id=rid))["params"]["body"]
            await client.request("decide", request_id=rid, decision="deny")
            await a.finish()
        finally:
            for c in (client, stranger, liar):
                await c.close()

    async def test_a_settled_or_unknown_request_is_a_conflict(self, sandbox: Sandbox,
                                                              agents: list[Agent]) -> None:
        """Once decided, a request's detail is refused as a second `decide` is (-32003, already
        settled); an id that never was is -32003 too."""
        sandbox.start_daemon()
        client, notes = await approver(sandbox)
        try:
            a = await start_agent(sandbox, f"call('create_issue', title='t', body={long_body()!r})\n")
            agents.append(a)
            rid = (await notes.next()).request_id
            await client.request("decide", request_id=rid, decision="allow_once")
            assert PASSED_GATE == (await a.next())["category"]
            err = await refused(client, rid)
            assert CONFLICT == err.rpc_code and "already settled (allowed)" in err.message
            assert MIDDLE not in err.message
            err = await refused(client, "r-never-was")
            assert CONFLICT == err.rpc_code and "unknown request" in err.message
            await a.finish()
        finally:
            await client.close()

    async def test_an_owned_request_is_read_by_its_owner_only(self, sandbox: Sandbox,
                                                              agents: list[Agent]) -> None:
        """With `owner: release-manager` for creates, another approver is not sent the prompt
        (as `pending` does not list it to them) and may not read its detail either (-32001);
        the owner may."""
        policy = sandbox.write("owner.yaml", {
            "default": {"mode": "per_call"}, "risks": {"create": {"mode": "session", "owner": "release-manager"}}})
        sandbox.start_daemon("--policy", str(policy))
        owner, notes = await approver(sandbox, "release-manager")
        other, _ = await approver(sandbox, "bystander")
        try:
            a = await start_agent(sandbox, f"call('create_issue', title='t', body={long_body()!r})\n")
            agents.append(a)
            rid = (await notes.next()).request_id
            assert [] == (await other.request("pending"))["pending"]
            err = await refused(other, rid)
            assert NOT_AUTHORIZED == err.rpc_code and "release-manager" in err.message
            assert MIDDLE not in err.message
            assert MIDDLE in (await owner.request("approval.detail", request_id=rid))["params"]["body"]
            await owner.request("decide", request_id=rid, decision="deny")
            await a.finish()
        finally:
            await owner.close()
            await other.close()


class TestScriptedApprover:
    def test_a_long_value_is_matched_whole(self, sandbox: Sandbox) -> None:
        """`deny body: *DROP*`, then `allow_once body: Steps*`: a 4000-character harmless body is
        allowed (it used to be refused as uncheckable), and one with `DROP TABLE` in its middle,
        where the prompt shows neither end, is denied."""
        sandbox.start_daemon()
        approver = sandbox.start_approver([
            {"match": {"operation": "create_issue", "params": {"body": "*DROP*"}}, "decide": "deny"},
            {"match": {"operation": "create_issue", "params": {"body": "Steps*"}}, "decide": "allow_once"}])
        harmless, dropping = long_body(), long_body(" DROP TABLE issues; ")
        got = []
        for body in (harmless, dropping):
            run = sandbox.run_agent([{"call": "create_issue", "params": {"title": "t", "body": body}}])
            assert run.proc.returncode in (0, 1), run.proc.stderr
            got.append(run.results[0]["category"])
        assert [PASSED_GATE, "approval_denied"] == got
        path = Path(approver.log_path)  # type: ignore[attr-defined]

        def rules() -> list[int]:  # the approver logs a decision after the agent may have it
            return [json.loads(line)["rule"] for line in path.read_text().splitlines()]

        wait_for(lambda: 0 in rules(), what="the deny to be logged")
        # the allowed call may be retried: it failed at the executor
        assert 0 == rules()[-1] and {1} == set(rules()[:-1])

    def test_a_hidden_value_stays_uncheckable(self, sandbox: Sandbox) -> None:
        """A body not marked safe to show is `[hidden]` in the detail too: `allow body: *` never
        matches it, though the long title beside it is read whole; the same script allows a long
        note it can read whole (`allow text: Steps*`)."""
        catalog = sandbox.write("hiding-catalog.yaml", HIDING_CATALOG)
        sandbox.start_daemon("--catalog", str(catalog))
        sandbox.start_approver([
            {"match": {"operation": "create_issue", "params": {"title": "Steps*", "body": "*"}},
             "decide": "allow_once"},
            {"match": {"operation": "attach_note", "params": {"text": "Steps*"}}, "decide": "allow_once"}])
        got = []
        for step in ({"call": "create_issue", "params": {"title": long_body(), "body": "b"}},
                     {"call": "attach_note", "params": {"issue_id": "ISS-1", "text": long_body(n=2000)}}):
            got.append(sandbox.run_agent([step]).results[0]["category"])
        assert ["approval_denied", PASSED_GATE] == got


class TestTheDetailPane:
    async def test_the_pane_shows_the_whole_value_and_scrolls(self, sandbox: Sandbox,
                                                              agents: list[Agent]) -> None:
        """Selected, a request whose body was cut shows the body whole in the detail pane
        (escaped and quoted as before: its newline as `\\n`), no `cut short` line; the row stays
        short; `tab` then `end` scrolls the pane to the end of it. No screen holds the canary credential."""
        secret = canary()
        sandbox.set_secret("tracker_token", secret)
        sandbox.start_daemon()
        token = (sandbox.home / "approver.token").read_text().strip()
        body = long_body("line one\nline two " + MIDDLE)
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, f"call('create_issue', title='t', body={body!r})\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            detail = main(pilot).query_one(RequestDetail)
            await until(pilot, lambda: quoted(body) in text_of(detail), "the body in full")
            text = text_of(detail)
            assert "\\nline two " + MIDDLE in text and "more chars]…" not in text
            assert "cut short" not in text and "loading" not in text
            row = str(main(pilot).query_one(PendingTable).get_row_at(0)[6])
            assert len(row) <= 28 and MIDDLE not in row
            pane = main(pilot).query_one("#detail-pane", VerticalScroll)
            await until(pilot, lambda: pane.max_scroll_y > 0, "the pane to scroll (taller than it is)")
            await pilot.press("tab", "end")  # the person scrolls it from the keyboard
            assert pane.has_focus
            await until(pilot, lambda: 'END"' in screen_text(pilot.app), "the end of the body on screen")
            shots = [pilot.app.export_screenshot(), screen_text(pilot.app)]
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["category"]
            await a.finish()
        for shot in shots:
            assert secret not in shot and token not in shot
        assert secret not in daemon_logs(sandbox)

    async def test_a_failed_read_is_said(self) -> None:
        """When `approval.detail` is refused (the request settled meanwhile), the pane says the
        full values could not be read and why, and shows the cut value flagged."""
        app = offline_app()
        async with app.run_test(size=(150, 42)) as pilot:
            cut = dict(PENDING[0], request_id="r-0009", params={"title": clip("fix " + "x" * 150 + " end", 80)})
            app.post_message(LinkUp([cut], locked=False))
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            app.post_message(DetailFailed("r-0009", "request r-0009 is already settled (expired)"))
            await pilot.pause()
            detail = main(pilot).query_one(RequestDetail)
            text = await until(pilot, lambda: "could not be read" in text_of(detail) and text_of(detail),
                               "the failure to be said")
            assert "the full values could not be read (request r-0009 is already settled (expired))" in text
            assert " ! param title: cut short" in text


def screen_text(app: object) -> str:
    screen = app.screen  # type: ignore[attr-defined]
    return "\n".join(strip.text for strip in screen._compositor.render_strips())
