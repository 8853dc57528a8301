"""A session grant's TTL runs on a steady clock, never on the wall clock.

A wall clock stepped while a grant is live (NTP, a user, a restored VM) must neither end the
grant early nor keep it alive past its TTL; and a person who allows a session again after the
TTL passed, before the daemon's sweep ended the old grant, gets a new grant that covers calls.
The gate runs in-process here with both of its clocks under the test's hand.
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
from vault.gate.grants import GrantTable
from vault.gate.policy import load_policy
from vault.models import Category, Result, make_result

TTL_S = 60.0
POLICY = f"risks:\n  create: {{mode: session, ttl_s: {TTL_S}}}\n"
ME = ProcessIdentity(pid=os.getpid(), uid=os.getuid(), create_time=time.time(), exe="")


class Clocks:
    """The wall clock and the steady clock, each moved by the test alone."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.steady = 1_000.0


def test_the_table_reads_the_steady_clock_only() -> None:
    c = Clocks()
    table = GrantTable(lambda: c.wall, lambda: c.steady)
    g = table.add("s-1", ME, "create_issue", "create_issue on tracker", TTL_S)
    assert g.expires_at == c.wall + TTL_S  # the wall time people read
    c.wall += 86_400.0  # a day forward
    assert table.find("s-1", ME, "create_issue on tracker") is g
    assert table.expired() == []
    c.wall -= 2 * 86_400.0  # a day back
    c.steady += TTL_S
    assert table.find("s-1", ME, "create_issue on tracker") is None
    assert table.expired() == [g]


def _gate(tmp_path: Path, c: Clocks) -> tuple[Gate, Any, list[Any]]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    sessions = SessionTable()
    audited: list[Any] = []

    async def audit(event: Any, durable: bool = True) -> None:
        audited.append(event)

    gate = Gate(load_policy(path), sessions, audit, notify=lambda *a, **k: None,
                routable=lambda owner: True, locked=False, clock=lambda: c.wall)
    gate.grants.steady = lambda: c.steady
    session = sessions.open("filer", "run-1", ME, "conn-1")
    return gate, session, audited


def _prompts(audited: list[Any]) -> int:
    return sum(type(e).__name__ == "PromptShown" for e in audited)


async def _call(gate: Gate, session: Any, audited: list[Any],
                decision: Decision | None = None) -> tuple[Result, int]:
    """One create_issue; `decision` answers its prompt if it asks one. -> (result, prompts asked)."""
    op = load_catalog().get("create_issue")
    assert op is not None
    before = _prompts(audited)

    async def execute() -> Result:
        return make_result(Category.success, op.name, "c-1", "created")

    task = asyncio.ensure_future(gate.call(session, op, {"title": "t"}, "c-1", None, execute))
    while not task.done() and not gate.pending:
        await asyncio.sleep(0)  # one loop turn: the call either ends or asks
    if gate.pending:
        assert decision is not None, "the call asked for an approval"
        (request_id,) = gate.pending
        await gate.decide("alice", request_id, decision)
    result = await asyncio.wait_for(task, timeout=10)
    return result, _prompts(audited) - before


def test_a_stepped_wall_clock_neither_ends_nor_extends_a_grant(tmp_path: Path) -> None:
    c = Clocks()
    gate, session, audited = _gate(tmp_path, c)

    async def go() -> None:
        result, asked = await _call(gate, session, audited, Decision.allow_session)
        assert (result.category, asked) == (Category.success, 1)
        c.wall += 7 * 86_400.0  # a week forward: the grant still covers the next call
        await gate.sweep()
        assert (await _call(gate, session, audited))[1] == 0
        c.wall -= 14 * 86_400.0  # then back; the TTL passes on the steady clock
        c.steady += TTL_S + 1
        result, asked = await _call(gate, session, audited, Decision.deny)
        assert (result.category, asked) == (Category.approval_denied, 1)

    asyncio.run(go())


def test_allowing_again_after_the_ttl_before_the_sweep_grants_anew(tmp_path: Path) -> None:
    c = Clocks()
    gate, session, audited = _gate(tmp_path, c)

    async def go() -> None:
        assert (await _call(gate, session, audited, Decision.allow_session))[1] == 1
        c.steady += TTL_S + 1  # past the TTL; the daemon's sweep has not run
        result, asked = await _call(gate, session, audited, Decision.allow_session)
        assert (result.category, asked) == (Category.success, 1)
        assert (await _call(gate, session, audited))[1] == 0  # the new grant covers the next call
        (live,) = gate.grants.all()
        ended = [e for e in audited if type(e).__name__ == "GrantEnded"]
        assert [e.reason for e in ended] == ["ttl"]
        assert ended[0].grant_id != live.id

    asyncio.run(go())
