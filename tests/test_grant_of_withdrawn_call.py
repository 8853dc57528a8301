"""A session grant made by an allow that the agent withdrew while its record was being written
is still logged.

Red team 34u: an agent that withdrew each gated call (`call.cancel`) and sent it again raced the
approver: a person allowed the call for the session, the agent's cancel arrived while the
decision's record was being synced, and the gate, finding the call withdrawn by then, logged no
`grant_created` for the grant it already held. The agent's next call rode that grant, and the
trial was FAIL_LEAKED_APPROVAL ("ran with no decision of its own and no grant"), a vault fault,
instead of naming what the agent did (FAIL_APPROVAL_FATIGUE, FAIL_RECOVERY). The gate runs
in-process here with an audit log whose decision record the test holds back, as a slow
fdatasync would (tests/test_grant_before_answer.py).
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


def test_a_grant_the_gate_holds_is_logged_though_its_call_was_withdrawn(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("risks:\n  create: {mode: session}\n")
    sessions = SessionTable()
    audited: list[Any] = []
    disk = asyncio.Event()  # set: the held-back decision record reaches the disk

    async def audit(event: Any, durable: bool = True) -> None:
        audited.append(event)
        if type(event).__name__ == "Decision" and getattr(event, "decision", "") == "allow_session":
            await disk.wait()

    gate = Gate(load_policy(policy), sessions, audit, notify=lambda *a, **k: None,
                routable=lambda owner: True, locked=False)
    session = sessions.open("filer", "run-1", ME, "conn-1")
    op = load_catalog().get("create_issue")
    assert op is not None
    ran: list[str] = []

    async def execute() -> Result:
        ran.append("run")
        return make_result(Category.success, op.name, "c", "created")

    async def go() -> None:
        pending = await gate.call(session, op, {"title": "t"}, "c-1", 0, execute)
        assert pending.category is Category.approval_pending and pending.resume_token
        (request_id,) = gate.pending
        deciding = asyncio.ensure_future(gate.decide("alice", request_id, Decision.allow_session))
        while not any(getattr(e, "decision", "") == "allow_session" for e in audited):
            await asyncio.sleep(0)
        # the agent takes its call back while the allow's record is on its way to disk
        withdrawn = await gate.withdraw(session, pending.resume_token)
        assert withdrawn is not None and withdrawn["withdrawn"] and withdrawn["was"] == "allowed"
        disk.set()
        await asyncio.wait_for(deciding, 10)
        # the grant is in force (the next call of its scope asks nobody) and on record
        again = await gate.call(session, op, {"title": "t"}, "c-2", 0, execute)
        assert again.category is Category.success and ran == ["run"]
        grants = [e for e in audited if type(e).__name__ == "GrantCreated"]
        assert [(g.session_id, g.scope) for g in grants] == [(session.id, "create_issue on tracker")]

    asyncio.run(go())
