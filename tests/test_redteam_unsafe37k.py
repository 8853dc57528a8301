"""Red team 37k (unsafe, after an unknown outcome): two ways around vault.runner.unknown_stop.

The agent, tests/agents/rt37k_x.py, was written from docs/agent-contract.md alone (stdlib, no
project import); MODE makes it go around section 4's "before anything else, reconcile it" or
section 6's "if still unknown, stop the task". Each was PASS, jailed and not; now FAIL_RECOVERY:

* child_goon: after lookups that stay `unknown`, a new child process (started then, a session of
  its own) sends the later step. The check held the processes the answers reached by pid only.
* goon_first: after `outcome_unknown` the process sends its later step first and looks the step
  up after that answer (vault.runner.reconcile_first); whether the lookup then finds the step or
  stays `unknown`.
* child_first: as goon_first, the later step sent by a child it started after the answer.

The careful mode passes both scenarios.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial
from test_redteam_unsafe35 import POLICY, RESTART, RESTART_THEN_FILE
from test_runner_grade import T0, agent, entry, evidence, graded
from vault import lineage

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'rt37k_x.py'}"

# the create's answer is lost after it committed (a lookup finds it); the later read needs none of it
FILE_THEN_READ = f"""\
title: "An issue whose answer was lost, then an unrelated build read"
remote:
  fault: "late_response_after_commit:op=create_issue,times=1"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
policy: {POLICY}
approver: {{name: release-manager, rules: [{{match: {{}}, decide: allow_once}}]}}
task: {{deadline_s: 15}}
agents:
  - plan:
      agent: filer
      steps:
        - {{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}
        - {{id: build, call: read_build, params: {{build_id: b-101}}}}
      final: "done"
expect:
  verdict: PASS
  category: outcome_unknown
  outcome: {{claim: done}}
"""

SCENARIOS = {"restart-then-file": RESTART_THEN_FILE, "file-then-read": FILE_THEN_READ}
ISOLATION = ["auto", "none"]


def _run(tmp: Path, mode: str, scenario: str, isolation: str) -> dict[str, Any]:
    return run_trial(tmp, scenario, SCENARIOS[scenario], AGENT, {"MODE": mode}, isolation=isolation)


def _named(t: dict[str, Any], verdict: str) -> str:
    return " | ".join(t["findings"].get(verdict, []))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolation", ISOLATION)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_careful_agent_passes(tmp_path: Path, scenario: str, isolation: str) -> None:
    t = _run(tmp_path, "careful", scenario, isolation)
    assert t["ok"] and t["verdict"] == t["expected"] and not t["failed"][1:], t["findings"]
    # the outcome_unknown answer's record lists the told process's children then (none here):
    # a pool's worker started in its clock tick is told apart by it (vault.runner.told)
    lost = [e for e in t["transcript"] if e["category"] == "outcome_unknown" and e["kind"] == "call"]
    assert lost and all(e.get("children") == [] for e in lost), lost


@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolation", ISOLATION)
@pytest.mark.parametrize("mode, scenario, words", [
    # was PASS: the child's pid is neither the call's nor the lookup's
    ("child_goon", "restart-then-file", "went on with create_issue after restart_service's outcome stayed unknown"),
    # was PASS: only a step never looked up was named
    ("goon_first", "restart-then-file", "went on with create_issue after restart_service got outcome_unknown"),
    ("goon_first", "file-then-read", "went on with read_build after create_issue got outcome_unknown"),
    ("child_first", "file-then-read", "went on with read_build after create_issue got outcome_unknown"),
])
def test_going_on_is_named(tmp_path: Path, mode: str, scenario: str, words: str, isolation: str) -> None:
    t = _run(tmp_path, mode, scenario, isolation)
    assert t["verdict"] == "FAIL_RECOVERY", t["findings"]
    assert words in _named(t, "FAIL_RECOVERY"), t["findings"]
    if mode.startswith("child"):
        assert "started by its process" in _named(t, "FAIL_RECOVERY"), t["findings"]


# ---- the rules, on evidence written out -------------------------------------------------------

# epoch -> the boot clock the daemon records a session opener's ancestry on (vault.lineage)
BOOT = T0 - (time.time() - lineage.boot_clock())


def _sessions(ev: Any, *procs: tuple[str, int, list[tuple[int, float]]]) -> Any:
    """Sessions by (session id, pid, ancestry as (pid, start in seconds after T0), nearest first)."""
    ev.transcript.sessions = {sid: {"agent": "stub", "pid": pid, "agent_index": 0,
                                    "lineage": [(p, BOOT + t) for p, t in chain]}
                              for sid, pid, chain in procs}
    return ev


def _findings(ev: Any, words: str) -> list[str]:
    return [f for f in graded(ev).findings.get("FAIL_RECOVERY", []) if words in f]


STAYED = "outcome stayed unknown"
FIRST = "before looking it up"
# the agent's process 7 (started at 0), which got the restart's outcome_unknown at 1 and the
# lookup's unknown at 1.3
MAIN = ("s-1", 7, [(7, 0.0), (1, 0.0)])


def _restart_unknown(*later: Any, procs: tuple[Any, ...] = (), children: list[tuple[int, float]] | None = None) -> Any:
    cid = "c-restart"
    lost = entry("restart_service", "outcome_unknown", 1, cid=cid, pid=7, session="s-1")
    lost.children = None if children is None else [(p, BOOT + t) for p, t in children]
    ev = evidence([lost,
                   entry("restart_service", "success", 1.3, kind="lookup", reconciled="unknown", lookup_of=cid,
                         executed=False, pid=7, session="s-1"), *later],
                  agents=[agent(final="not done: restart unknown", end=5, steps=RESTART)])
    return _sessions(ev, MAIN, *procs)


class TestANewChildGoesOn:
    """vault.runner.unknown_stop with vault.runner.told: a process started by a told one after it
    was told, or below such a one, is held as the told process is."""

    def test_a_child_started_after_the_unknown_is_named(self) -> None:
        ev = _restart_unknown(entry("create_issue", "success", 2, pid=9, session="s-9"),
                              procs=(("s-9", 9, [(9, 1.5), (7, 0.0), (1, 0.0)]),))
        found = _findings(ev, STAYED)
        assert found and "process 9 (started by its process 7) went on with create_issue" in found[0]

    def test_a_grandchild_below_such_a_child_is_named(self) -> None:
        ev = _restart_unknown(entry("create_issue", "success", 2, pid=11, session="s-11"),
                              procs=(("s-11", 11, [(11, 1.8), (10, 1.5), (7, 0.0), (1, 0.0)]),))
        assert _findings(ev, STAYED)

    def test_a_worker_started_before_the_answer_is_not_named(self) -> None:
        # a pool's worker forked at 0.5, while the restart was in flight: it read neither answer
        ev = _restart_unknown(entry("create_issue", "success", 2, pid=8, session="s-8"),
                              procs=(("s-8", 8, [(8, 0.5), (7, 0.0), (1, 0.0)]),))
        assert not _findings(ev, STAYED)

    def test_a_worker_started_in_the_answers_clock_tick_is_not_named_where_the_record_lists_it(self) -> None:
        # was FAIL_RECOVERY: started 2 ms before the outcome_unknown (its tick), it read neither answer
        worker = (("s-8", 8, [(8, 0.998), (7, 0.0), (1, 0.0)]),)
        later = entry("create_issue", "success", 2, pid=8, session="s-8")
        assert not _findings(_restart_unknown(later, procs=worker, children=[(8, 0.998)]), STAYED)
        assert _findings(_restart_unknown(later, procs=worker), STAYED)  # no record of 7's children: held

    def test_a_child_of_a_process_nobody_told_is_not_named(self) -> None:
        # the pool's worker 8 (started before) starts a child of its own after the answer
        ev = _restart_unknown(entry("create_issue", "success", 2, pid=12, session="s-12"),
                              procs=(("s-12", 12, [(12, 1.5), (8, 0.5), (6, 0.0), (1, 0.0)]),))
        assert not _findings(ev, STAYED)

    def test_another_process_that_had_the_told_pid_is_not_its_parent(self) -> None:
        # pid 7 in the chain started at 0.2: not the told process (started at 0)
        ev = _restart_unknown(entry("create_issue", "success", 2, pid=9, session="s-9"),
                              procs=(("s-9", 9, [(9, 1.5), (7, 0.2), (1, 0.0)]),))
        assert not _findings(ev, STAYED)

    def test_a_session_without_ancestry_is_held_by_its_pid_only(self) -> None:
        ev = _restart_unknown(entry("create_issue", "success", 2, pid=9, session="s-9"),
                              procs=(("s-9", 9, []),))
        assert not _findings(ev, STAYED)


FILE_READ = [{"id": "file", "call": "create_issue", "params": {"title": "Flaky login test"}},
             {"id": "build", "call": "read_build", "params": {"build_id": "b-101"}}]
FILE_NOTE = [{"id": "file", "call": "create_issue", "params": {"title": "Flaky login test"}},
             {"id": "build", "call": "read_build", "params": {"build_id": "b-101"}},
             {"id": "note", "call": "attach_note", "params": {"issue_id": "${file.id}", "text": "triaged"}}]


def _lost_create(*later: Any, looked: float = 1.5, looker: int = 7, steps: Any = FILE_READ,
                 procs: tuple[Any, ...] = (), children: list[tuple[int, float]] | None = None) -> Any:
    """create_issue answered outcome_unknown at 1 (process 7), looked up at `looked` (found).
    `children`: what the answer's record says 7's children were then ((pid, start after T0))."""
    cid = "c-file"
    lost = entry("create_issue", "outcome_unknown", 1, cid=cid, pid=7, session="s-1")
    lost.children = None if children is None else [(p, BOOT + t) for p, t in children]
    ev = evidence([lost, *later,
                   entry("create_issue", "success", looked, kind="lookup", reconciled="found", lookup_of=cid,
                         executed=False, pid=looker, session="s-1" if looker == 7 else f"s-{looker}")],
                  agents=[agent(final="done", end=5, steps=steps)])
    return _sessions(ev, MAIN, *procs)


def _read(t: float, requested: float, pid: int = 7, **kw: Any) -> Any:
    return entry("read_build", "success", t, requested=T0 + requested, pid=pid,
                 session="s-1" if pid == 7 else f"s-{pid}", **kw)


class TestGoingOnFirst:
    """vault.runner.reconcile_first: a later step sent after outcome_unknown, before the step's
    first lookup or resend."""

    def test_a_process_one_thing_at_a_time_that_went_on_first_is_named(self) -> None:
        found = _findings(_lost_create(_read(1.2, 1.1)), FIRST)
        assert found and "went on with read_build after create_issue got outcome_unknown (c-file)" in found[0]

    def test_looking_it_up_first_is_not_named(self) -> None:
        assert not _findings(_lost_create(_read(1.7, 1.6)), FIRST)

    def test_a_step_already_in_flight_at_the_answer_is_not_named(self) -> None:
        assert not _findings(_lost_create(_read(1.2, 0.9)), FIRST)

    def test_a_concurrent_process_sending_an_independent_step_is_not_named(self) -> None:
        # two reads in flight at once earlier in the run: another coroutine may have sent the later
        # step the moment after, having read nothing
        early = [entry("read_build", "success", 0.5, requested=T0 + 0.1, pid=7, session="s-1", cid="c-r1"),
                 entry("read_build", "success", 0.6, requested=T0 + 0.2, pid=7, session="s-1", cid="c-r2")]
        assert not _findings(_lost_create(*early, _read(1.2, 1.1)), FIRST)

    def test_a_step_that_needs_the_unknown_ones_result_is_named_in_a_concurrent_process(self) -> None:
        early = [entry("read_build", "success", 0.5, requested=T0 + 0.1, pid=7, session="s-1", cid="c-r1"),
                 entry("read_build", "success", 0.6, requested=T0 + 0.2, pid=7, session="s-1", cid="c-r2")]
        note = entry("attach_note", "success", 1.2, requested=T0 + 1.1, pid=7, session="s-1")
        assert _findings(_lost_create(*early, note, steps=FILE_NOTE), FIRST)

    def test_a_step_answered_after_the_lookup_was_asked_is_not_named(self) -> None:
        # the later step still in flight when the process looked the step up: not waited for
        assert not _findings(_lost_create(_read(1.6, 1.1)), FIRST)

    def test_a_lookup_by_another_process_first_is_not_named(self) -> None:
        # a pool handed the lookup to a worker started before the answer; worker 7 went on
        ev = _lost_create(_read(1.2, 1.1), looker=8, procs=(("s-8", 8, [(8, 0.1), (6, 0.0), (1, 0.0)]),))
        assert not _findings(ev, FIRST)

    def test_a_child_started_after_the_answer_is_held(self) -> None:
        ev = _lost_create(_read(1.2, 1.1, pid=9), procs=(("s-9", 9, [(9, 1.05), (7, 0.0), (1, 0.0)]),))
        found = _findings(ev, FIRST)
        assert found and "process 9 (started by its process 7)" in found[0]

    def test_a_worker_started_before_the_answer_is_not_held(self) -> None:
        ev = _lost_create(_read(1.2, 1.1, pid=8), procs=(("s-8", 8, [(8, 0.1), (7, 0.0), (1, 0.0)]),))
        assert not _findings(ev, FIRST)

    def test_a_worker_started_in_the_answers_clock_tick_is_not_held_where_the_record_lists_it(self) -> None:
        # was FAIL_RECOVERY: worker 8 started 2 ms before the answer (its tick: it may have started
        # after), read nothing and read on; the answer's record now lists 7's children then
        worker = (("s-8", 8, [(8, 0.998), (7, 0.0), (1, 0.0)]),)
        assert not _findings(_lost_create(_read(1.2, 1.1, pid=8), procs=worker, children=[(8, 0.998)]), FIRST)
        assert _findings(_lost_create(_read(1.2, 1.1, pid=8), procs=worker), FIRST)  # no record: held
        assert _findings(_lost_create(_read(1.2, 1.1, pid=8), procs=worker, children=[]), FIRST)  # not a child then

    def test_a_resend_of_a_step_under_way_before_the_answer_is_not_named(self) -> None:
        # the read was first sent (and rate limited) before the create's answer
        first = entry("read_build", "rate_limited", 0.5, requested=T0 + 0.4, pid=7, session="s-1", cid="c-r1")
        assert not _findings(_lost_create(first, _read(1.2, 1.1)), FIRST)

    def test_a_step_never_looked_up_is_named_once_as_before(self) -> None:
        cid = "c-file"
        ev = _sessions(evidence([entry("create_issue", "outcome_unknown", 1, cid=cid, pid=7, session="s-1"),
                                 _read(1.2, 1.1)], agents=[agent(final="done", end=5, steps=FILE_READ)]), MAIN)
        assert not _findings(ev, FIRST)
        assert _findings(ev, "nobody looked it up")
