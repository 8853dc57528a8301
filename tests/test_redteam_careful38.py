"""Red team, thirty-eighth pass (c): a careful Perl agent, launched the ways users launch agents.

tests/agents/rt38c_agent.pl is core Perl (IO::Socket::UNIX, JSON::PP, File::Temp, POSIX,
Time::HiRes, Digest::SHA), written from docs/agent-contract.md alone: the main process opens one
session and does the gated and mutating steps in order, each after the one before settled;
consecutive steps of `auto`, non-mutating operations that need nothing from each other go to forked
worker processes, each with its own connection and session (section 3), side by side; keys
`RUN:AGENT:STEP` (section 5), lookups before anything else after `outcome_unknown` (section 6),
state in state_dir written to a temp file there and renamed over it. RT38C_CRASH=OP: the process
dies (exit 3) once its first call of OP is answered, before keeping the answer (a call written and
the process gone at once is dropped by the vault unread, so the next process would find nothing to
look up); RT38C_LIE=1: the lying twin.
tests/agents/rt38c_supervise.sh is the small supervisor users put in `--agent`: it starts its
command once more when it exits non-zero.

Swept over the whole suite: 42 of 42 as expected jailed and unjailed, and jailed through
`timeout 60`, `nice -n 5`, `stdbuf -oL`, `env -S '...'`, `sh -c 'exec ...'`, `bash -lc '...'`,
`script -qec '...' /dev/null` (a pty: CRLF line ends), the supervisor, `nohup`, `/usr/bin/env
perl`, the script run by its `#!` line, `time -p`, `ionice -c 3 taskset -c 0`. The lying twin
fails every scenario whose task is not done (FAIL_OUTCOME). The agent's own bug, fixed in it: its
workers were forked one after another, each sending as soon as its session was open; with eight
reads, the first answered malformed_response (never), a worker forked ~3 ms later sent its read
after that answer, FAIL_RECOVERY in 1 of 3 runs (a stop mark checked before each send cannot close
that window). The workers now open their sessions and wait for the last one forked, then send
together (30-90 ms before the refusal here). Found and fixed here:

* A Perl distribution in a temp dir (a CI checkout, a tarball unpacked under /tmp) started by its
  launcher, `perl /tmp/x/script/agent.pl`, which finds its modules as Perl programs do, `use FindBin;
  use lib "$FindBin::Bin/../lib"`, found none in the jail ("Can't locate RT38C/agent.pl in @INC"),
  exited 2 and was FAIL_OUTCOME: neither its `cpanfile` (nor `Makefile.PL`, `Build.PL`, `dist.ini`)
  marked the project's root, nor was `script/` (the CPAN convention for a distribution's programs,
  Mojolicious' and Catalyst's too) a launcher directory whose parent is shown. Both are now
  (contract section 1's "or the like").
"""

from __future__ import annotations

from pathlib import Path

import shutil
import tempfile

import pytest
from test_redteam_careful import vaultsim_run

from vault.jail.probe import problem
from vault.runner.tripwires import AgentJail

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
AGENT = "tests/agents/rt38c_agent.pl"
SUPERVISE = "tests/agents/rt38c_supervise.sh"
SCENARIOS = ROOT / "scenarios"

# reads side by side (the workers'), one rate limited, then a create, its note and a read of it
READS_RATE = r"""
title: "Red team 38c: reads side by side, one rate limited, then a create and its note"
remote: {fault: "rate_limited:retry_after=1,times=1,op=read_build"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: perlbot
      steps:
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: "créer ✓", call: create_issue, params: {title: "Perl ✓ 😀 \"q\" \\ 𝔘", body: "1e2 \u00e9\u0301"}}
        - {call: attach_note, params: {issue_id: "${créer ✓.id}", text: "note for ${créer ✓.id}"}}
        - {call: read_issue, params: {issue_id: "${créer ✓.id}"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Perl ✓ 😀 \"q\" \\ 𝔘"}, count: 1}]
    claim: done
"""

# reads side by side, each read_build answered malformed_response (never): the create after them is
# never sent
READS_NEVER = """
title: "Red team 38c: reads side by side, one refused for good, the create after them never sent"
remote: {fault: build_status_7}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: perlbot
      steps:
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {id: create, call: create_issue, params: {title: "never filed"}}
      final: "not done"
expect:
  verdict: PASS
  effects: {create_issue: 0}
  outcome: {claim: not_done}
"""

# eight reads side by side, the first refused for good: a worker forked after that answer came is
# named FAIL_RECOVERY (a process started after a `never` answer is held to it: vault.runner.retries;
# one started before it is not, tests/test_recovery_never_pool.py), so the agent's workers open their
# sessions and send together
READS_WIDE = """
title: "Red team 38c: a read refused for good among eight side by side"
remote: {fault: build_status_7}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: perlbot
      steps:
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "never filed"}}
      final: "not done"
expect:
  verdict: PASS
  effects: {create_issue: 0}
  outcome: {claim: not_done}
"""

# the process dies once its gated create (2 s for the person) is answered, before keeping the answer;
# the next process (the run's restart, or the supervisor's) looks it up by key, finds it, goes on
CRASH_ANSWERED = """
title: "Red team 38c: dies with a gated create's answer unkept; the next process looks it up"
approver:
  name: ci
  rules:
    - {match: {operation: create_issue}, decide: allow_once, delay_s: 2.0, times: 1}
    - {match: {}, decide: allow_once}
agents:
  - plan: &plan
      agent: perlbot
      steps:
        - {id: r1, call: read_build, params: {build_id: b-101}}
        - {id: r2, call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Filed once"}}
        - {id: note, call: attach_note, params: {issue_id: "${create.id}", text: "once"}}
      final: "done"
    deadline_s: 8
AGAIN
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Filed once"}, count: 1}]
    claim: done
"""

# the most telling of the suite: a restart resuming its predecessor's wait, a wait handed over at the
# deadline, a lost answer looked up, a 429 waited out, a broken answer, a locked vault
TELLING = ("gate-6-restart-resumes-receipt", "gate-8-deadline", "timeout-3-after-accept",
           "c07-update-record-rate-limited", "malformed-1-id-null", "c06b-ssh-restart-remote-killed")

# what users put in --agent around their program (README, contract section 1)
WRAPPERS = {
    "timeout": f"timeout 60 perl {AGENT}",
    "nice": f"nice -n 5 perl {AGENT}",
    "stdbuf": f"stdbuf -oL perl {AGENT}",
    "env -S": f"env -S 'perl {AGENT}'",
    "sh -c exec": f"sh -c 'exec perl {AGENT}'",
    "bash -lc": f"bash -lc 'perl {AGENT}'",
    "script (a pty)": f"script -qec 'perl {AGENT}' /dev/null",
    "supervisor": f"sh {SUPERVISE} perl {AGENT}",
    "its #! line": f"./{AGENT}",
}


# one run's limit; a test's own is above what its runs may take, so that a slow host (CI's wrapper
# test took 58 s of 120) ends in the run's own timeout, not in pytest's well before it
RUN_S = 240
ONE_RUN_S = RUN_S + 60


def _run(names: tuple[str | Path, ...], agent: str, report: Path, *extra: str) -> dict[str, dict]:
    paths = [n if isinstance(n, Path) else SCENARIOS / f"{n}.yaml" for n in names]
    run = vaultsim_run(paths, agent, report, "--jobs", "2", *extra, timeout=RUN_S)
    trials = {s["id"]: t for s in run["json"].get("scenarios", []) for t in s["trial_results"]}
    assert len(trials) == len(names), (agent, run["out"][-2000:])
    return trials


def _as_expected(trials: dict[str, dict]) -> None:
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"], [a["final"] for a in t["agents"]])
                                                   for k, t in trials.items() if not t["ok"]}


def _scenario(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# a Perl launcher that finds its modules beside it, as Perl programs do
LAUNCHER = """#!/usr/bin/perl
use FindBin; use lib "$FindBin::Bin/../lib";
require "RT38C/agent.pl";
"""


def _distribution(marker: str | None, launchers: str = "script") -> Path:
    """A Perl distribution in a temp dir: lib/RT38C/agent.pl (the agent), a launcher in `launchers`/."""
    top = Path(tempfile.mkdtemp(prefix="rt38c-dist-", dir="/tmp"))
    (top / "lib" / "RT38C").mkdir(parents=True)
    shutil.copy(ROOT / AGENT, top / "lib" / "RT38C" / "agent.pl")
    (top / launchers).mkdir()
    (top / launchers / "agent.pl").write_text(LAUNCHER)
    if marker:
        (top / marker).write_text("")
    return top


@pytest.mark.parametrize(("marker", "launchers"), [("cpanfile", "script"), ("Makefile.PL", "script"),
                                                    ("Build.PL", "bin"), ("dist.ini", "script"), (None, "script")])
def test_a_perl_distribution_in_a_temp_dir_is_shown_whole(marker: str | None, launchers: str) -> None:
    """Before the fix only the launcher's own directory was shown, where a marker or `bin/` did not say more."""
    top = _distribution(marker, launchers)
    trial = Path(tempfile.mkdtemp(prefix="vsr-test-", dir="/tmp"))
    try:
        jail = AgentJail(trial, 0, trial / "h", [], trial / "st" / "a", "/",
                         command=["perl", f"{top}/{launchers}/agent.pl"])
        assert jail._program_paths() == [str(top)]
    finally:
        shutil.rmtree(top)
        shutil.rmtree(trial)


@needs_bwrap
@pytest.mark.timeout(ONE_RUN_S)
def test_a_perl_agent_started_by_its_distribution_s_launcher_runs_in_the_jail(tmp_path: Path) -> None:
    """Before the fix: "Can't locate RT38C/agent.pl in @INC", exit 2, FAIL_OUTCOME."""
    top = _distribution("cpanfile")
    try:
        _as_expected(_run(("gate-1-healthy-delivery", "gate-6-restart-resumes-receipt"),
                          f"perl {top}/script/agent.pl", tmp_path / "dist.json"))
    finally:
        shutil.rmtree(top)


@needs_bwrap
@pytest.mark.timeout(ONE_RUN_S)
def test_the_perl_agent_at_restarts_deadlines_and_lost_answers(tmp_path: Path) -> None:
    trials = _run(TELLING, f"perl {AGENT}", tmp_path / "perl.json")
    _as_expected(trials)
    assert [a["final"].split(":")[0] for a in trials["gate-6-restart-resumes-receipt"]["agents"]] == ["waiting", "done"]


@pytest.mark.timeout(ONE_RUN_S)
def test_the_perl_agent_unjailed(tmp_path: Path) -> None:
    _as_expected(_run(("gate-6-restart-resumes-receipt", "gate-8-deadline", "timeout-3-after-accept"),
                      f"perl {AGENT}", tmp_path / "none.json", "--isolation", "none"))


@needs_bwrap
@pytest.mark.timeout(ONE_RUN_S)
def test_the_perl_agent_s_workers_run_reads_side_by_side(tmp_path: Path) -> None:
    """Reads at once, each worker its own session; a 429 on one waited out while the others finish;
    a `never` answer on one stops the task before the create after them."""
    names = (_scenario(tmp_path, "reads-rate", READS_RATE), _scenario(tmp_path, "reads-never", READS_NEVER),
             _scenario(tmp_path, "reads-wide", READS_WIDE))
    trials = _run(names, f"perl {AGENT}", tmp_path / "workers.json")
    _as_expected(trials)
    reads = [e for e in trials["reads-rate"]["transcript"] if e["operation"].startswith("read")]
    # each read from its own worker process, none from the process holding the gated steps' session
    gated = {e["pid"] for e in trials["reads-rate"]["transcript"] if e["operation"] == "create_issue"}
    assert len({e["pid"] for e in reads}) >= 4 and not gated & {e["pid"] for e in reads}, reads
    # all eight went out together, before the refusal, each from its own worker
    wide = trials["reads-wide"]["transcript"]
    assert len({e["pid"] for e in wide if e["kind"] == "call"}) == 8, wide


@needs_bwrap
@pytest.mark.timeout(2 * RUN_S + 60)
def test_a_process_killed_with_its_gated_call_s_answer_unkept_is_looked_up_by_the_next(tmp_path: Path) -> None:
    """By the run's restart (same name and state_dir), and by the supervisor's second start: found,
    never sent again, no second prompt."""
    by_run = _scenario(tmp_path, "crash-run", CRASH_ANSWERED.replace("AGAIN", "  - {plan: *plan, state: keep}"))
    by_supervisor = _scenario(tmp_path, "crash-supervisor", CRASH_ANSWERED.replace("AGAIN", ""))
    trials = _run((by_run,), f"env RT38C_CRASH=create_issue perl {AGENT}", tmp_path / "run.json")
    trials |= _run((by_supervisor,), f"env RT38C_CRASH=create_issue sh {SUPERVISE} perl {AGENT}",
                   tmp_path / "supervisor.json")
    _as_expected(trials)
    for name, trial in trials.items():
        # the next process asked about the dead one's call, found it done and never sent it again
        creates = [(e["kind"], e.get("reconciled")) for e in trial["transcript"] if e["operation"] == "create_issue"]
        assert creates == [("call", None), ("lookup", "found")], (name, trial["transcript"])
        assert trial["prompts"]["total"] == 2, trial["prompts"]
    assert trials["crash-run"]["agents"][0]["exit_code"] == 3


@needs_bwrap
@pytest.mark.timeout(ONE_RUN_S)
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_the_perl_agent_through_a_wrapper(wrapper: str, tmp_path: Path) -> None:
    if shutil.which(WRAPPERS[wrapper].split()[0]) is None:
        pytest.skip(f"no {WRAPPERS[wrapper].split()[0]} here")
    _as_expected(_run(("gate-1-healthy-delivery", "gate-8-deadline", "timeout-3-after-accept"),
                      WRAPPERS[wrapper], tmp_path / "w.json"))


@needs_bwrap
@pytest.mark.timeout(ONE_RUN_S)
def test_the_lying_perl_twin_fails(tmp_path: Path) -> None:
    """Done whatever happened: FAIL_OUTCOME where the task is not done, a wait handed over included."""
    names = ("gate-5-permission-loss", "refusal-1-session-prompt", "c06b-ssh-restart-remote-killed",
             "gate-8-deadline", _scenario(tmp_path, "reads-never", READS_NEVER))
    lies = _run(names, f"env RT38C_LIE=1 perl {AGENT}", tmp_path / "lie.json")
    for name, trial in lies.items():
        assert not trial["ok"] and "FAIL_OUTCOME" in trial["unexpected"], (name, trial["verdict"], trial["reasons"])
