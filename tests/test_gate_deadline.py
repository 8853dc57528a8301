"""The approval deadline is the vault's clock's: a wait that reaches it answers approval_expired.

The gate's expiry timer runs on the event loop's monotonic clock and is set before the prompt's
audit write; the agent's wait runs to the deadline on the vault's (wall) clock. When the wait
ended first, the agent was told `approval_pending` with a deadline already past, and its call
never settled (`refusal-3-deadline-passes` ended FAIL_OUTCOME once under CI's load). Here the
vault's clock runs ahead of the loop's, so the wait always ends first, deterministically.
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
from vault.gate.engine import Gate
from vault.gate.policy import load_policy
from vault.models import Category, Result

POLICY = "default: {mode: per_call, deadline_s: 5.0}\nrisks:\n  read: {mode: auto}\n"


def _gate(tmp_path: Path, ahead_s: float) -> tuple[Gate, Any, list[Any]]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    sessions = SessionTable()
    started = time.time()
    # the vault's clock jumps ahead once the prompt is asked (a wall clock stepped forward)
    clock_calls = {"n": 0}

    def clock() -> float:
        clock_calls["n"] += 1
        return time.time() + (ahead_s if clock_calls["n"] > 1 else 0.0)

    audited: list[Any] = []

    async def audit(event: Any, durable: bool = True) -> None:
        audited.append(event)

    gate = Gate(load_policy(path), sessions, audit, notify=lambda *a, **k: None,
                routable=lambda owner: True, locked=False, clock=clock)
    me = ProcessIdentity(pid=os.getpid(), uid=os.getuid(), create_time=started, exe="")
    session = sessions.open("filer", "run-1", me, "conn-1")
    return gate, session, audited


def _call(gate: Gate, session: Any, wait_s: float | None) -> Result:
    op = load_catalog().get("create_issue")
    assert op is not None

    async def execute() -> Result:
        raise AssertionError("nothing may be sent without an approval")

    async def go() -> Result:
        return await gate.call(session, op, {"title": "t"}, "c-1", wait_s, execute)

    return asyncio.run(go())


def test_a_wait_that_reaches_the_deadline_is_told_expired(tmp_path: Path) -> None:
    # 5 s deadline, the vault's clock 4.8 s ahead: the wait ends 0.2 s in, long before the timer
    gate, session, _ = _gate(tmp_path, ahead_s=4.8)
    began = time.monotonic()
    result = _call(gate, session, wait_s=None)
    assert result.category is Category.approval_expired, result
    assert time.monotonic() - began < 4.0  # answered at the vault's deadline, not the timer's
    assert not gate.pending  # settled: an approver's late answer finds nothing to approve
    assert [ap.state.value for ap in gate.settled.values()] == ["expired"]


def test_a_shorter_wait_is_still_pending(tmp_path: Path) -> None:
    # wait_s shorter than the time left: the prompt stays open and the agent holds a receipt
    gate, session, _ = _gate(tmp_path, ahead_s=0.0)
    result = _call(gate, session, wait_s=0.05)
    assert result.category is Category.approval_pending, result
    assert result.resume_token
    assert len(gate.pending) == 1

