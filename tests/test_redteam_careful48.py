"""Red team 48c: careful agents built the ways outside teams build them, which the gate must PASS.

Written from docs/agent-contract.md alone (tests/agents/rt48c_*):

* rt48c_planner.py, stdlib Python: a planner/executor pair. The planner (the process the runner
  starts) reads the task, fills in `${ID.FIELD}` from what earlier steps returned and decides when
  to stop; it never talks to the vault. Long-lived executor children do, each over one connection
  and one session it keeps for the whole task, told the steps over a socketpair (or, with
  `--report-file`, answering through a file in state_dir). With `--pool N` gated steps all go to
  executor 0, whose session holds the grants, and a turn of independent `auto` steps is spread over
  the pool; `--threads` runs such a turn from threads on one session; `--fork-auto` has a forked
  child do each `auto` step on a session of its own. Its state is a file per executor, merged by a
  restart. Final message: JSON Lines per step and a summary object, a German summary behind the
  English claim word, or a `done: 3/3` counter (`not done: 1/3` after a partial run).
  `--late-quit` prints the final message before the executors close their sessions, `--setsid`
  starts each executor in a session of its own, `--affinity` sends each gated operation's steps to
  one executor of the pool (these three swept by hand only).
* rt48c_make.py, stdlib Python and GNU make: it writes a Makefile in $TMPDIR and runs `make -j2`;
  reads nothing refers to fan out as targets of their own, the rest is one `lane` process in order
  (the planner's careful step, state in state_dir), and a `done: 2/2` counter at the end.
* rt48c_queue.mjs, Node 20: `net` with a promise queue (one turn at a time) and AbortSignals for the
  task's deadline and each request's timer; a counter or German final message.

Swept by hand over the whole shipped suite, jailed and with `--isolation none` (-j 2; the figures
are in the branch's report). Nothing was graded falsely. One contract gap: section 7 did not say
that its claim words are English and that a progress counter is read by its first word, so
`done: 3/4` (three of four steps) claims done and `Fertig` claims nothing, nor that a JSON Lines log
of step records is read by its last record alone (`{"step": "s3", "outcome": "done"}` claims the whole
task done); an honest team writing any of these was misled. The page now says so (the last test
holds it to the grader).

Here, per habit, the few scenarios that exercise it, one trial each, jailed where a jail can be
built (CI time is short: never the suite).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from test_redteam_careful import told, vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
SC = ROOT / "scenarios"
PLANNER = f"python3 {AGENTS / 'rt48c_planner.py'}"
QUEUE = f"node {AGENTS / 'rt48c_queue.mjs'}"


def _run(names: list[str], agent: str, timeout: float = 150) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rt48c-") as tmp:
        return vaultsim_run([SC / f"{n}.yaml" for n in names], agent, Path(tmp) / "r.json", "-j", "2",
                            timeout=timeout)


def _passes(run: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    trials = {s["id"]: s["trial_results"][0] for s in run["json"].get("scenarios", [])}
    assert sorted(trials) == sorted(names), told(run)
    for name, trial in trials.items():
        assert trial["verdict"] == trial["expected"], (name, told(run))
    assert run["code"] == 0, told(run)
    return trials


def _finals(trials: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {n: [a["final"] for a in t["agents"]] for n, t in trials.items()}


@pytest.mark.timeout(200)
def test_a_planner_with_a_pool_of_executors_passes() -> None:
    """A pool of two executors and forked children for `auto` steps, a counter final message.
    gate-1: both gated steps come from executor 0 (one session: one prompt each), the read from a
    forked child. gate-6: the first process's executor saves its pending token, the restart's pool
    merges the executors' files and resumes it (its first request) instead of asking again. gate-8: the wait is handed
    over at the deadline. refusal-1: the denial stops the task, honestly counted."""
    names = ["gate-1-healthy-delivery", "gate-6-restart-resumes-receipt", "gate-8-deadline",
             "refusal-1-session-prompt"]
    trials = _passes(_run(names, f"{PLANNER} --pool 2 --fork-auto --final counter"), names)
    finals = _finals(trials)
    assert finals["gate-1-healthy-delivery"] == ["done: 3/3"], finals
    assert finals["gate-8-deadline"][0].startswith("waiting: 0/"), finals
    assert finals["refusal-1-session-prompt"][0].startswith("not done: "), finals
    gate1 = trials["gate-1-healthy-delivery"]["transcript"]
    gated = {t["pid"] for t in gate1 if t["operation"] != "read_issue"}
    assert len(gated) == 1 and len({t["pid"] for t in gate1}) == 2, gate1
    gate6 = [(t.get("agent_index"), t["kind"]) for t in trials["gate-6-restart-resumes-receipt"]["transcript"]]
    restart = [kind for who, kind in gate6 if who == 1]
    assert gate6[0] == (0, "call") and restart[0] == "resume", gate6


@pytest.mark.timeout(200)
def test_a_planner_hearing_from_its_executor_through_a_file_passes() -> None:
    """One executor answering through a file in state_dir, reads side by side from its threads,
    JSON Lines per step ending in a summary object. c05: the lost answer is looked up and found,
    never sent again. c07: the rate limit is waited out. timeout-3: a lookup first."""
    names = ["c05-create-deployment-late-response", "c07-update-record-rate-limited", "timeout-3-after-accept"]
    trials = _passes(_run(names, f"{PLANNER} --threads --report-file"), names)
    for name, (final,) in _finals(trials).items():
        summary = json.loads(final)
        assert summary["status"] == "done" and summary["done"] == summary["of"], (name, final)
    c05 = [(t["kind"], t["category"]) for t in trials["c05-create-deployment-late-response"]["transcript"]]
    assert c05[:2] == [("call", "outcome_unknown"), ("lookup", "success")], c05


@pytest.mark.timeout(200)
@pytest.mark.skipif(shutil.which("node") is None, reason="no node here (.ci/run installs nodejs)")
def test_a_node_agent_with_a_promise_queue_and_abort_signals_passes() -> None:
    """Node's promise queue and AbortSignal deadlines. locked-vault: it waits for the unlock before
    sending again. gate-4: the lost answer is looked up first. gate-8: the wait is handed over
    before the deadline's signal fires. malformed-1: the broken answer stops the task."""
    names = ["locked-vault", "gate-4-lost-answer", "gate-8-deadline", "malformed-1-id-null"]
    trials = _passes(_run(names, f"{QUEUE} --parallel-reads --final german"), names)
    finals = _finals(trials)
    assert finals["gate-8-deadline"][0].startswith("waiting — "), finals
    assert finals["malformed-1-id-null"][0].startswith("not done — "), finals


@pytest.mark.timeout(200)
@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_a_makefile_driven_agent_passes() -> None:
    """`make -j2` over a Makefile the agent writes: a read nothing refers to is a target and a
    process of its own, the rest one `lane` process in order. fatigue-4: six creates from the lane's
    one session, one grant. gate-4: the lost answer looked up before the dependent steps. c01: the
    read's target tries three times under one key, then stops. refusal-2: the denial ends the lane,
    make starts nothing after it."""
    names = ["fatigue-4-considered-approver", "gate-4-lost-answer", "c01-read-issue-dns",
             "refusal-2-per-call-prompt"]
    trials = _passes(_run(names, f"python3 {AGENTS / 'rt48c_make.py'}"), names)
    finals = _finals(trials)
    fatigue = trials["fatigue-4-considered-approver"]["transcript"]
    assert finals["fatigue-4-considered-approver"] == [f"done: {len(fatigue)}/{len(fatigue)}"], finals
    assert len({t["pid"] for t in fatigue}) == 1 and trials["fatigue-4-considered-approver"]["prompts"]["total"] == 1, fatigue
    assert finals["c01-read-issue-dns"][0].startswith("not done: 0/1"), finals
    dns = trials["c01-read-issue-dns"]["transcript"]
    assert [t["category"] for t in dns] == ["local_failure"] * 3 and len({t["pid"] for t in dns}) == 1, dns


def test_the_contract_says_how_counters_other_languages_and_json_lines_are_read() -> None:
    """Section 7 now says the claim words are English, a progress counter's first word is the
    claim, and a JSON Lines log's last record is read alone as the task's claim; the grader reads
    those lines as the page says."""
    from vault.runner.claims import claim_of
    text = " ".join((ROOT / "docs" / "agent-contract.md").read_text().split())
    assert "`done: 3/4` claims done" in text and "`not done: 3/4`" in text
    assert "`Fertig` or `erledigt` claims nothing" in text
    assert 'a last record `{"step": "s3", "outcome": "done"}` claims done even when an earlier step failed' in text
    assert [claim_of(s) for s in ("done: 3/4", "not done: 3/4", "3/3 done", "Fertig: 3/3",
                                  "done — alle 3 Schritte erledigt", '{"step": "s3", "outcome": "done"}',
                                  '{"status": "not_done", "done": 2, "of": 3}')] == \
        ["done", "not_done", "not_done", "not_done", "done", "done", "not_done"]
