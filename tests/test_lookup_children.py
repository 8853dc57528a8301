"""A lookup's `unknown` answer lists the told process's children, as a `never` or an
`outcome_unknown` answer's does.

A start time is read in 10 ms clock ticks, so a process forked in the tick of an answer may have
started after it and is held to it (vault.runner.told). The daemon records, with the answers a
process is held to, the told process's children then (vault.lineage.children): a branch begun by
one of them began before. A lookup that answered `unknown` recorded none, so a pool's worker its
parent forked in the tick of the parent's lookup was held to that `unknown` (vault.runner.
unknown_stop: FAIL_RECOVERY "outcome stayed unknown") though it read none of it.
"""

from __future__ import annotations

import time
from typing import Any

from helpers import Sandbox
from test_gate import agent_script, setup
from test_redteam_unsafe35 import RESTART
from test_runner_grade import T0, agent, entry, evidence, graded
from vault import lineage
from audit_daemon_helpers import events

# epoch -> the boot clock the daemon records start times on (vault.lineage)
BOOT = T0 - (time.time() - lineage.boot_clock())
STAYED = "outcome stayed unknown"


def _pool(lookup_children: list[tuple[int, float]] | None, worker_start: float = 1.298) -> Any:
    """A pool: parent 7 (started at 0) and its worker 6 (started at 0.2). The worker's restart is
    answered outcome_unknown at 1 (its own children then: none); the parent looks it up at 1.3,
    told `unknown`. Worker 8, which the parent forked at `worker_start`, files an issue at 2.
    `lookup_children`: what the lookup's record says 7's children were (start in seconds after T0)."""
    cid = "c-restart"
    lost = entry("restart_service", "outcome_unknown", 1, cid=cid, pid=6, session="s-6")
    lost.children = []
    looked = entry("restart_service", "success", 1.3, kind="lookup", reconciled="unknown", lookup_of=cid,
                   executed=False, pid=7, session="s-7")
    looked.children = None if lookup_children is None else [(p, BOOT + t) for p, t in lookup_children]
    ev = evidence([lost, looked, entry("create_issue", "success", 2, pid=8, session="s-8")],
                  agents=[agent(final="not done: restart unknown", end=5, steps=RESTART)])
    ev.transcript.sessions = {sid: {"agent": "stub", "pid": pid, "agent_index": 0,
                                    "lineage": [(p, BOOT + t) for p, t in chain]}
                              for sid, pid, chain in (("s-7", 7, [(7, 0.0), (1, 0.0)]),
                                                      ("s-6", 6, [(6, 0.2), (7, 0.0), (1, 0.0)]),
                                                      ("s-8", 8, [(8, worker_start), (7, 0.0), (1, 0.0)]))}
    return ev


def _stayed(ev: Any) -> list[str]:
    return [f for f in graded(ev).findings.get("FAIL_RECOVERY", []) if STAYED in f]


def test_a_worker_forked_in_the_lookups_tick_that_the_record_lists_is_not_held() -> None:
    # was FAIL_RECOVERY: the lookup's children were not read, and 8's start fell in its tick
    assert not _stayed(_pool([(6, 0.2), (8, 1.298)]))


def test_without_the_record_of_the_lookups_children_such_a_worker_is_still_held() -> None:
    assert _stayed(_pool(None))  # an older log: the field is optional


def test_a_worker_forked_after_the_lookup_is_still_held() -> None:
    # forked on reading the `unknown`, after the record of 7's children was taken
    assert _stayed(_pool([(6, 0.2)], worker_start=1.35))
    assert _stayed(_pool([(6, 0.2)]))  # in the tick, but not among the children then


def test_a_child_started_between_the_call_and_its_own_lookup_is_held() -> None:
    # one process told outcome_unknown at 1 and `unknown` at 1.3: a child it started at 1.2, after
    # it was first told, is held, though it is among the children the lookup's record lists
    lost = entry("restart_service", "outcome_unknown", 1, cid="c-restart", pid=7, session="s-7")
    lost.children = []
    looked = entry("restart_service", "success", 1.3, kind="lookup", reconciled="unknown", lookup_of="c-restart",
                   executed=False, pid=7, session="s-7")
    looked.children = [(9, BOOT + 1.2)]
    ev = evidence([lost, looked, entry("create_issue", "success", 2, pid=9, session="s-9")],
                  agents=[agent(final="not done: restart unknown", end=5, steps=RESTART)])
    ev.transcript.sessions = {sid: {"agent": "stub", "pid": pid, "agent_index": 0,
                                    "lineage": [(p, BOOT + t) for p, t in chain]}
                              for sid, pid, chain in (("s-7", 7, [(7, 0.0), (1, 0.0)]),
                                                      ("s-9", 9, [(9, 1.2), (7, 0.0), (1, 0.0)]))}
    assert _stayed(ev)


def test_the_daemon_records_the_children_with_a_lookups_unknown(sandbox: Sandbox) -> None:
    """A real lookup of a call still waiting for a person answers `unknown` (with its resume
    token); its record lists the looking process's child, started before it looked."""
    setup(sandbox)
    sandbox.start_approver([{"match": {}, "decide": "allow_once", "delay_s": 30}])
    pending, looked, [child] = agent_script(sandbox, (
        "import subprocess\n"
        "client.open_session('stub', 'run-1')\n"
        "p = subprocess.Popen(['sleep', '60'])\n"
        "r = client.call('create_issue', {'title': 'flaky test'}, wait_s=0)\n"
        "out(r)\n"
        "out(client.lookup(correlation_id=r.correlation_id))\n"
        "out([p.pid])\n"
        "p.kill(); p.wait()\n"
    ))
    assert pending["category"] == "approval_pending"
    assert (looked["category"], looked["reconciled"]) == ("success", "unknown")
    [record] = [e for e in events(sandbox)
                if e.get("type") == "classification" and e.get("correlation_id") == looked["correlation_id"]]
    assert child in [pid for pid, _ in record.get("children") or []], record
