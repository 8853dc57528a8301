"""A session grant is in force before the allowed call's answer can reach its agent.

An agent whose allowed call is answered quickly (the remote is fast, or the call fails before
sending) sends its next call of the same scope at once. If that call arrives while the
decision's record is still being synced, it must find the grant: asking the person again
would cost them a prompt the allow_session was meant to spare, and grade a careful agent
FAIL_APPROVAL_FATIGUE. (Seen under load: the TUI's recorded-payloads test hung on the second,
unanswered prompt.) The gate runs in-process here with an audit log whose decision record
the test holds back, as a slow fdatasync would.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from vault.catalog import load_catalog
from vault.daemon.peer import ProcessIdentity
from vault.daemon.sessions import SessionTable
from vault.gate.approvals import Decision
from vault.gate.engine import Gate
from vault.gate.policy import load_policy
from vault.models import Category, Result, make_result

ME = ProcessIdentity(pid=os.getpid(), uid=os.getuid(), create_time=time.time(), exe="")


def test_the_next_call_finds_the_grant_while_the_decision_is_still_being_written(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("risks:\n  create: {mode: session}\n")
    sessions = SessionTable()
    audited: list[Any] = []
    disk = asyncio.Event()  # set: the held-back decision record reaches the disk

    async def audit(event: Any, durable: bool = True) -> None:
        audited.append(event)
        if type(event).__name__ == "Decision":
            await disk.wait()

    gate = Gate(load_policy(policy), sessions, audit, notify=lambda *a, **k: None,
                routable=lambda owner: True, locked=False)
    session = sessions.open("filer", "run-1", ME, "conn-1")
    op = load_catalog().get("create_issue")
    assert op is not None
    ran: list[str] = []

    def call(cid: str) -> asyncio.Future[Result]:
        async def execute() -> Result:
            ran.append(cid)
            return make_result(Category.success, op.name, cid, "created")
        return asyncio.ensure_future(gate.call(session, op, {"title": cid}, cid, None, execute))

    async def go() -> None:
        first = call("c-1")
        while not gate.pending:
            await asyncio.sleep(0)
        (request_id,) = gate.pending
        deciding = asyncio.ensure_future(gate.decide("alice", request_id, Decision.allow_session))
        # the first call is answered while its decision's record is still on its way to disk
        assert (await asyncio.wait_for(first, 10)).category is Category.success
        assert not deciding.done()
        second = call("c-2")
        result = await asyncio.wait_for(second, 10)
        assert result.category is Category.success  # covered: nobody was asked
        assert gate.pending == {}
        assert sum(type(e).__name__ == "PromptShown" for e in audited) == 1
        assert ran == ["c-1", "c-2"]
        disk.set()
        await asyncio.wait_for(deciding, 10)
        # the log still says it in the order it happened: the decision, then its grant
        kinds = [type(e).__name__ for e in audited if type(e).__name__ in ("Decision", "GrantCreated")]
        assert kinds == ["Decision", "GrantCreated"]

    asyncio.run(go())
