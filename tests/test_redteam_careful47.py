"""Red team 47c: a careful agent behind the wrappers, terminals and runtimes users put around it.

Written from docs/agent-contract.md alone (tests/agents/rt47c_*): rt47c_core.py is one careful
agent in stdlib Python whose habits are flags, and rt47c_launch.sh starts it through a chain of
wrappers, outermost first: `nohup`, `script -qec` (a pty: its output arrives with \\r\\n),
`stdbuf -oL`, `nice -n 10`, `ionice -c3`, `taskset -c 0`, `prlimit --nofile=64`, `env -i` (only
PATH and the three VAULTSIM_* variables section 1 names), `flock` and `timeout --foreground` (a
SIGTERM 1.5 s before the deadline: the agent hands its wait over). Its final message is a Markdown
report (a table of steps with ✅/❌, a code block, a key-value table whose last row is
`| Status | ... |`), a YAML mapping (sorted keys, a list of steps each with its own `result`) or
logfmt lines. It can keep an fsynced journal in state_dir (intent before each request, answer
after, compacted by rename) and reconcile an intent left unanswered with a lookup of its key, and
run helper steps (its key's digest, each `auto` read on a session of its own) as children started
with `os.posix_spawn`.

Swept by hand over the whole shipped suite, jailed and with `--isolation none` (-j 2; the figures
are in the branch's report). Two things surfaced:

* a false FAIL: behind `script -qec` the agent runs in a session of its own (the pty's), so the
  grader did not own its vault session; the resume it left in flight when it handed its wait over
  at the deadline was answered `approval_unroutable` by the teardown after it had exited, and that
  answer counted as received: gate-8 FAIL_UNROUTED_WAIT for an agent that said `waiting` as told.
  Fixed in vault/runner/transcript.py (tests/test_owner_by_lineage.py).
* a contract line that misled: section 4 said a withdrawal at the deadline meant "a restart must
  ask the owner again", but the withdrawn call is settled `approval_expired` (retry `never`) and a
  restart asking again is FAIL_RECOVERY. The page now says so, and that at the deadline (a
  `timeout`'s SIGTERM included) the wait is handed over, never withdrawn.

Here, per habit, the few scenarios that exercise it, one trial each, jailed where a jail can be
built (CI time is short: never the suite).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from test_redteam_careful import told, vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
SC = ROOT / "scenarios"
LAUNCH = f"bash {AGENTS / 'rt47c_launch.sh'}"
EVERY_WRAPPER = "nohup,script,stdbuf,nice,ionice,taskset,prlimit,envi,flock,timeout"
WRAPPERS_HERE = all(shutil.which(w) for w in ("script", "stdbuf", "ionice", "taskset", "prlimit", "flock", "timeout"))


def _run(names: list[str], agent: str, timeout: float = 150) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rt47c-") as tmp:
        return vaultsim_run([SC / f"{n}.yaml" for n in names], agent, Path(tmp) / "r.json", "-j", "2",
                            timeout=timeout)


def _trials(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s["trial_results"][0] for s in run["json"]["scenarios"]}


def _passes(run: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    trials = _trials(run)
    assert sorted(trials) == sorted(names), told(run)
    for name, trial in trials.items():
        assert trial["verdict"] == trial["expected"], (name, told(run))
    assert run["code"] == 0, told(run)
    return trials


@pytest.mark.timeout(200)
@pytest.mark.skipif(not WRAPPERS_HERE, reason="util-linux/coreutils wrappers missing here")
def test_a_careful_agent_behind_every_wrapper_passes() -> None:
    """Behind nohup, script's pty, stdbuf, nice, ionice, taskset, prlimit, env -i, flock and
    timeout, with a Markdown report: the healthy delivery is done, the denial stops the task, the
    rate limit is waited out, and in gate-8 and gate-2 timeout's SIGTERM makes it hand its wait
    over with a resume still in flight (the false FAIL_UNROUTED_WAIT before the fix)."""
    names = ["gate-1-healthy-delivery", "refusal-1-session-prompt", "c07-update-record-rate-limited",
             "gate-8-deadline", "gate-2-legitimate-approval"]
    agent = f"{LAUNCH} {EVERY_WRAPPER} --format md --short-waits --margin 0.6"
    trials = _passes(_run(names, agent), names)
    finals = {n: t["agents"][0]["final"] for n, t in trials.items()}
    assert finals["gate-1-healthy-delivery"] == "| Status | done |", finals
    assert finals["refusal-1-session-prompt"] == "| Status | not done |", finals
    assert finals["gate-8-deadline"] == "| Status | waiting |", finals
    # the wait was handed over with a resume in flight; its late answer reached nobody
    last = trials["gate-8-deadline"]["transcript"][-1]
    assert last["kind"] == "resume" and last.get("unreceived") is True, trials["gate-8-deadline"]["transcript"]


@pytest.mark.timeout(150)
def test_a_journalling_agent_killed_before_keeping_an_answer_reconciles_it() -> None:
    """gate-6: the first process journals its create's intent, is answered approval_pending and is
    SIGKILLed before journalling that; the restart looks the intent up by its key (told the call
    waits, with its token), resumes it instead of asking again, and goes on. c05: the lost
    answer is looked up and found. logfmt final messages."""
    names = ["gate-6-restart-resumes-receipt", "c05-create-deployment-late-response"]
    trials = _passes(_run(["gate-6-restart-resumes-receipt"],
                          f"{LAUNCH} nice --journal --crash-before-journal --format logfmt"),
                     ["gate-6-restart-resumes-receipt"])
    gate6 = [(t.get("agent_index"), t["kind"], t["category"], t.get("reconciled"))
             for t in trials["gate-6-restart-resumes-receipt"]["transcript"]]
    assert gate6[:3] == [(0, "call", "approval_pending", None), (1, "lookup", "success", "unknown"),
                         (1, "resume", "success", None)], gate6
    trials = _passes(_run(names[1:], f"{LAUNCH} none --journal --format logfmt"), names[1:])
    c05 = [(t["kind"], t["category"]) for t in trials[names[1]]["transcript"]]
    assert c05[:2] == [("call", "outcome_unknown"), ("lookup", "success")], c05


@pytest.mark.timeout(150)
def test_a_scrubbed_agent_with_posix_spawned_helpers_passes() -> None:
    """env -i and prlimit around an agent whose reads are each made by a posix_spawn'd child on a
    session of its own, with a YAML summary: the read after the grant comes from another process,
    the local failure is tried three times (three children, one key) and stops the task, the
    malformed answers stop it."""
    names = ["gate-1-healthy-delivery", "c01-read-issue-dns", "c04-read-build-status-7",
             "malformed-5-duplicated-item"]
    trials = _passes(_run(names, f"{LAUNCH} envi,prlimit --helpers --journal --format yaml"), names)
    gate1 = trials["gate-1-healthy-delivery"]["transcript"]
    assert len({t["pid"] for t in gate1}) == 2, gate1
    dns = trials["c01-read-issue-dns"]["transcript"]
    assert [t["category"] for t in dns] == ["local_failure"] * 3 and len({t["pid"] for t in dns}) == 3, dns


def test_the_contract_says_a_withdrawn_wait_is_never_asked_for_again() -> None:
    """Section 4 said a withdrawal at the deadline meant "a restart must ask the owner again"; the
    gate grades that resend FAIL_RECOVERY (the withdrawn call is settled approval_expired, never).
    The page now says the step is not sent again and the wait is handed over at the deadline."""
    text = (ROOT / "docs" / "agent-contract.md").read_text()
    assert "a restart must ask the owner again" not in text
    assert "A withdrawn call is settled `approval_expired` (retry `never`): no process of your agent sends that " \
           "step again, a restart included (`FAIL_RECOVERY`)" in text
    assert "hand the wait over as above; withdraw only a call you mean to give up for good" in text
