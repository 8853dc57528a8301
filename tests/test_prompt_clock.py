"""How long a person took over a prompt is measured on a steady clock, never the wall clock.

A wall clock stepped while a prompt waits (NTP, a person, a restored VM) made a decision taken in
3.5 s read as taking an hour, or no time at all: a rubber stamp by the fatigue figures, and the
audit log's decision record said the same. The gate runs in-process here with both of its clocks
under the test's hand; what is checked is what a user reads: the decision record's times, the
daemon's prompt statistics and the fatigue figures computed from them.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from vault.catalog import load_catalog
from vault.daemon.peer import ProcessIdentity
from vault.daemon.sessions import SessionTable
from vault.gate.approvals import Decision
from vault.gate.engine import Gate
from vault.gate.fatigue import SteadyWall
from vault.gate.policy import load_policy
from vault.models import Category, Result, make_result

ME = ProcessIdentity(pid=os.getpid(), uid=os.getuid(), create_time=time.time(), exe="")
HOUR = 3600.0


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.steady = 5_000.0


def _gate(tmp_path: Path, c: Clocks) -> tuple[Gate, Any, list[Any]]:
    path = tmp_path / "policy.yaml"
    path.write_text("risks:\n  create: {mode: per_call}\n")
    sessions = SessionTable()
    audited: list[Any] = []

    async def audit(event: Any, durable: bool = True) -> None:
        audited.append(event)

    gate = Gate(load_policy(path), sessions, audit, notify=lambda *a, **k: None,
                routable=lambda owner: True, locked=False, clock=lambda: c.wall, steady=lambda: c.steady)
    return gate, sessions.open("filer", "run-1", ME, "conn-1"), audited


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_stepped_wall_clock_does_not_change_how_long_a_person_took(tmp_path: Path, step: float) -> None:
    c = Clocks()
    gate, session, audited = _gate(tmp_path, c)
    op = load_catalog().get("create_issue")
    assert op is not None

    async def execute() -> Result:
        return make_result(Category.success, op.name, "c-1", "created")

    async def go() -> Result:
        task = asyncio.ensure_future(gate.call(session, op, {"title": "t"}, "c-1", None, execute))
        while not task.done() and not gate.pending:
            await asyncio.sleep(0)  # one loop turn: the call asks
        (request_id,) = gate.pending
        c.steady += 2.0
        c.wall += step  # stepped while the prompt is on screen
        gate.seen("alice", request_id, detail=True)
        c.steady += 1.5
        c.wall += 1.5
        await gate.decide("alice", request_id, Decision.allow_once)
        return await asyncio.wait_for(task, timeout=10)

    assert asyncio.run(go()).category is Category.success
    (record,) = [e for e in audited if type(e).__name__ == "Decision"]
    assert record.shown - record.asked == pytest.approx(2.0)
    assert record.decided - record.shown == pytest.approx(1.5)
    assert record.asked == pytest.approx(1_800_000_000.0)  # still a wall time people can read
    run = gate.stats.report("run-1")["runs"]["run-1"]
    assert run["time_to_decision_ms"]["max"] == pytest.approx(3500.0)
    fatigue = run["fatigue"]
    assert fatigue["latency_s"]["p50"] == pytest.approx(1.5)
    assert fatigue["rubber_stamps"] == 0  # read for 1.5 s, its detail opened: considered


def test_steady_wall_reads_the_wall_once() -> None:
    c = Clocks()
    stamp = SteadyWall(lambda: c.wall, lambda: c.steady)
    first = stamp()
    assert first == c.wall
    c.wall -= 86_400.0
    c.steady += 0.25
    assert stamp() == pytest.approx(first + 0.25)
