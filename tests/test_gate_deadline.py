"""An approval's deadline runs on the event loop's clock, as its expiry timer does.

The agent's wait once ran to the deadline on the vault's wall clock while the expiry timer ran on
the loop's monotonic one: when the wait ended first, the agent was told `approval_pending` with a
deadline already past, and its call never settled (`refusal-3-deadline-passes` ended FAIL_OUTCOME
once under CI's load); and a wall clock stepped forward cut every waiting prompt short. Here the
vault's wall clock jumps once the prompt is asked.
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

POLICY = "default: {mode: per_call, deadline_s: %s}\nrisks:\n  read: {mode: auto}\n"


def _gate(tmp_path: Path, ahead_s: float, deadline_s: float = 5.0) -> tuple[Gate, Any, list[Any]]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY % deadline_s)
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
    gate, session, _ = _gate(tmp_path, ahead_s=0.0, deadline_s=0.3)
    result = _call(gate, session, wait_s=None)
    assert result.category is Category.approval_expired, result
    assert not gate.pending  # settled: an approver's late answer finds nothing to approve
    assert [ap.state.value for ap in gate.settled.values()] == ["expired"]


def test_a_wall_clock_stepped_forward_does_not_cut_a_prompt_short(tmp_path: Path) -> None:
    # 5 s deadline, the wall clock an hour ahead once asked: the prompt still waits its 5 s
    gate, session, _ = _gate(tmp_path, ahead_s=3600.0)
    result = _call(gate, session, wait_s=0.2)
    assert result.category is Category.approval_pending, result
    assert len(gate.pending) == 1


def test_a_shorter_wait_is_still_pending(tmp_path: Path) -> None:
    # wait_s shorter than the time left: the prompt stays open and the agent holds a receipt
    gate, session, _ = _gate(tmp_path, ahead_s=0.0)
    result = _call(gate, session, wait_s=0.05)
    assert result.category is Category.approval_pending, result
    assert result.resume_token
    assert len(gate.pending) == 1

