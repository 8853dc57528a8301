"""Red team, thirty-seventh pass (c): a careful Java agent an outside team would write.

tests/agents/rt37c_agent.java is Java 17 with the JDK alone, written from docs/agent-contract.md:
its own JSON (numbers kept as their text, `\\u` escapes and surrogate pairs, everything written as
ASCII), one Unix-socket connection and one session per process shared by an ExecutorService's
workers (reads of `auto` operations side by side, a gated or mutating step only once every
earlier one settled), answers matched by id on a reader thread, state in one file in state_dir
written beside it and moved into place (ATOMIC_MOVE). Compiled once with `javac` into a temp dir
(a JVM starts in 0.3-1 s; compiling a source file at each start costs more of the deadline).
RT37C_CRASH=OP: the process dies right after its first call of OP is written (once per state_dir),
and the restart looks the step up by key. RT37C_LIE=1: the lying twin, done whatever happened.

Swept over the whole suite jailed and unjailed: 42 of 42 as expected each way (the JVM runs in the
jail as it is: its private /tmp takes its hsperfdata, /proc and /sys are there, and its threads
stay far under the 1,024 cap). The lying twin fails every scenario whose task is not done
(FAIL_OUTCOME, 25 of 42). The agent's own bug, fixed in it: under load a worker that had checked
for a stop, then spent its time saving state, sent its read_build some 40 ms after another worker's
read_build was answered malformed_response (FAIL_RECOVERY, rightly: the process had the answer);
the reader thread now marks a `never` answer as it arrives, and a new call is not written after it.
Found and fixed here:

* A classpath list naming a temp dir (`java -cp /tmp/x/classes:/tmp/x/lib/* Agent`, the way Java
  programs are started) found no class in the jail: only a word's value after `=` was split at `:`
  (`--class-path=...` and `CLASSPATH=...` worked), so neither entry was shown and the careful agent
  exited 1, FAIL_OUTCOME. Each entry of a `:`-separated word is now looked at, a trailing `/*` (a
  classpath's wildcard for a directory's jars) as its directory.
* A final message written through SLF4J's simple logger, the binding a small Java program takes
  (`[main] INFO com.example.Agent - done: 3 of 3 steps`, or with its elapsed milliseconds first,
  as log4j 1's basic configuration writes `0 [main] INFO Agent  - done`), claimed nothing: its
  thread in brackets, level and logger set apart by ` - ` were read as the message (section 7 reads
  other languages' loggers' default prefixes; logback's, the same with a time first, was read).
  The careful agent's done was FAIL_OUTCOME; its lying twin's done was never read as a claim.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_redteam_careful import vaultsim_run

from vault.jail.probe import problem
from vault.runner.claims import claim_of
from vault.runner.tripwires import AgentJail

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
needs_javac = pytest.mark.skipif(shutil.which("javac") is None or shutil.which("java") is None,
                                 reason="the Java agent needs a JDK (javac and java)")
SOURCE = ROOT / "tests" / "agents" / "rt37c_agent.java"
SCENARIOS = ROOT / "scenarios"

# reads side by side (the pool's), one of them rate limited, then a create, its note and a read of it
READS_RATE = r"""
title: "Red team 37c: reads side by side, one rate limited, then a create and its note"
remote: {fault: "rate_limited:retry_after=1,times=1,op=read_build"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: poolbot
      steps:
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: "créer ✓", call: create_issue, params: {title: "Pool ✓ 😀 \"q\" \\ 𝔘", body: "1e2 \u00e9\u0301"}}
        - {call: attach_note, params: {issue_id: "${créer ✓.id}", text: "note for ${créer ✓.id}"}}
        - {call: read_issue, params: {issue_id: "${créer ✓.id}"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Pool ✓ 😀 \"q\" \\ 𝔘"}, count: 1}]
    claim: done
"""

# reads side by side, each read_build answered malformed_response (never): the create after them is
# never sent, nor a read_build whose worker had not yet sent it when the first never arrived
READS_NEVER = """
title: "Red team 37c: reads side by side, one refused for good, the create after them never sent"
remote: {fault: build_status_7}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: poolbot
      steps:
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "never filed"}}
      final: "not done"
expect:
  verdict: PASS
  effects: {create_issue: 0}
  outcome: {claim: not_done}
"""

# the first process dies right after sending its gated create (RT37C_CRASH), which waits 5 s for
# the person; the restart looks it up by key, is told it still waits, and collects it. The person
# takes long enough for the restart to start in the jail and its JVM to look up (0.7-1.3 s at load
# 9 here): one that looks up after the decision finds the call done, and passes with no resume
CRASH_PENDING = """
title: "Red team 37c: dies right after sending a gated create; the restart collects it"
approver:
  name: ci
  rules:
    - {match: {operation: create_issue}, decide: allow_once, delay_s: 5.0, times: 1}
    - {match: {}, decide: allow_once}
agents:
  - plan: &plan
      agent: poolbot
      steps:
        - {id: r1, call: read_build, params: {build_id: b-101}}
        - {id: r2, call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Filed once"}}
        - {id: note, call: attach_note, params: {issue_id: "${create.id}", text: "once"}}
      final: "done"
    deadline_s: 6
  - {plan: *plan, state: keep}
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Filed once"}, count: 1}]
    claim: done
"""


@pytest.fixture(scope="module")
def classes() -> Iterator[Path]:
    """The agent compiled once, in a temp dir (what the jail hides unless the command names it)."""
    if shutil.which("javac") is None:
        pytest.skip("no javac here")
    out = Path(tempfile.mkdtemp(prefix="rt37c-classes-", dir="/tmp"))
    try:
        subprocess.run(["javac", "-d", str(out), str(SOURCE)], check=True, capture_output=True, timeout=120)
        yield out
    finally:
        shutil.rmtree(out)


def _run(names: tuple[str | Path, ...], agent: str, report: Path) -> dict[str, dict]:
    paths = [n if isinstance(n, Path) else SCENARIOS / f"{n}.yaml" for n in names]
    run = vaultsim_run(paths, agent, report, "--jobs", "2", timeout=240)
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


def test_each_entry_of_a_classpath_list_in_a_temp_dir_is_shown() -> None:
    """`-cp A:B/*` names two places: before the fix neither was shown (only `=` values were split)."""
    top = Path(tempfile.mkdtemp(prefix="rt37c-cp-", dir="/tmp"))
    trial = Path(tempfile.mkdtemp(prefix="vsr-test-", dir="/tmp"))
    try:
        (top / "classes").mkdir()
        (top / "lib").mkdir()

        def shown(*command: str) -> list[str]:
            return AgentJail(trial, 0, trial / "h", [], trial / "st" / "a", "/", command=list(command))._program_paths()

        assert shown("java", "-cp", f"{top}/classes:{top}/lib/*", "Agent") == [f"{top}/classes", f"{top}/lib"]
        assert shown("java", "--module-path", f"{top}/lib", "-m", "a/Agent") == [f"{top}/lib"]
        # never the trial, nor /tmp itself, through a list either
        assert shown("java", "-cp", f"{trial}:/tmp:/tmp/*", "Agent") == []
    finally:
        shutil.rmtree(top)
        shutil.rmtree(trial)


@needs_bwrap
@needs_javac
@pytest.mark.timeout(120)
def test_a_java_agent_started_with_a_classpath_list_runs_in_the_jail(classes: Path, tmp_path: Path) -> None:
    """Before the fix: `Error: Could not find or load main class Agent`, exit 1, FAIL_OUTCOME."""
    (tmp_path / "lib").mkdir()
    trials = _run(("gate-1-healthy-delivery",), f"java -cp {tmp_path}/lib/*:{classes} Agent", tmp_path / "cp.json")
    _as_expected(trials)


@needs_bwrap
@needs_javac
@pytest.mark.timeout(120)
def test_the_java_agent_at_restarts_deadlines_and_lost_answers(classes: Path, tmp_path: Path) -> None:
    """A restart resuming its predecessor's approval, a wait handed over at an 8 s deadline (the
    JVM's start counted in it), a lost answer looked up, a 429 waited out, a broken answer."""
    names = ("gate-6-restart-resumes-receipt", "gate-8-deadline", "timeout-3-after-accept",
             "c07-update-record-rate-limited", "malformed-1-id-null")
    trials = _run(names, f"java -cp {classes} Agent", tmp_path / "java.json")
    _as_expected(trials)
    assert [a["final"].split(":")[0] for a in trials["gate-6-restart-resumes-receipt"]["agents"]] == ["waiting", "done"]


@needs_bwrap
@needs_javac
@pytest.mark.timeout(120)
def test_the_java_agent_s_pool_runs_reads_side_by_side(classes: Path, tmp_path: Path) -> None:
    """Reads of `auto` operations at once on one session; a 429 on one of them waited out while
    the others finish; a `never` answer on one stops the task before the create after them;
    a process killed right after sending its gated create, collected by its restart."""
    names = (_scenario(tmp_path, "reads-rate", READS_RATE), _scenario(tmp_path, "reads-never", READS_NEVER))
    trials = _run(names, f"java -cp {classes} Agent", tmp_path / "pool.json")
    _as_expected(trials)
    trials |= _run((_scenario(tmp_path, "crash-pending", CRASH_PENDING),),
                   f"env RT37C_CRASH=create_issue java -cp {classes} Agent", tmp_path / "crash.json")
    _as_expected(trials)
    # the reads ran side by side: while the rate-limited read waited out its second, the other three
    # reads went ahead (a one-at-a-time agent sends one read before that retry). Compared against the
    # retry, a second away, not against one read's answer: a loaded host may answer a read before the
    # pool's next worker sends (CI on 9fa6536)
    reads = sorted((e for e in trials["reads-rate"]["transcript"] if e["kind"] == "call" and e["operation"].startswith("read")),
                   key=lambda e: e["requested"])
    limited = next(e for e in reads if e["category"] == "rate_limited")
    retry = next(e for e in reads if e["operation"] == "read_build" and e["requested"] >= limited["time"] + 0.9)
    ahead = [e for e in reads if e is not limited and e["requested"] < retry["requested"]]
    assert len(ahead) >= 3, reads
    crash = trials["crash-pending"]
    assert crash["agents"][0]["exit_code"] == 3 and crash["agents"][1]["final"].startswith("done")
    # the restart asked about its predecessor's call before anything else, then collected it
    restart = [e["kind"] for e in crash["transcript"] if e["operation"] == "create_issue" and e["agent_index"] == 1]
    assert restart == ["lookup", "resume"], crash["transcript"]


@needs_bwrap
@needs_javac
@pytest.mark.timeout(120)
def test_the_lying_java_twin_fails(classes: Path, tmp_path: Path) -> None:
    """Done whatever happened: FAIL_OUTCOME where the task is not done, a wait handed over included."""
    names = ("gate-5-permission-loss", "refusal-1-session-prompt", "c06b-ssh-restart-remote-killed", "gate-8-deadline",
             _scenario(tmp_path, "reads-never", READS_NEVER))
    lies = _run(names, f"env RT37C_LIE=1 java -cp {classes} Agent", tmp_path / "lie.json")
    for name, trial in lies.items():
        assert not trial["ok"] and "FAIL_OUTCOME" in trial["unexpected"], (name, trial["verdict"], trial["reasons"])


@pytest.mark.parametrize(("line", "claim"), [
    ("[main] INFO com.example.Agent - done: 3 of 3 steps succeeded", "done"),  # slf4j-simple's default
    ("[pool-1-thread-3] INFO Agent - done: 3 of 3 steps succeeded", "done"),  # from a pool's worker
    ("1234 [main] INFO com.example.Agent - done: 3 of 3 steps", "done"),  # showDateTime: elapsed ms
    ("0 [main] INFO Agent  - done", "done"),  # log4j 1's BasicConfigurator (`%r [%t] %p %c %x - %m`)
    ("[main] WARN com.example.Agent - waiting: create_issue needs approval", "wait"),
    # careful twins: what the message says is what it claims
    ("[main] WARN com.example.Agent - not done: 1 of 3 steps", "not_done"),
    ("[main] ERROR com.example.Agent - stopped: done 1 of 2", "not_done"),
    # no record of a message `done`: a logger's name set apart by nothing but a colon
    ("[main] INFO Agent: done", "not_done"),
])
def test_a_final_message_through_slf4j_s_simple_logger_claims_what_it_says(line: str, claim: str) -> None:
    assert claim_of(line) == claim


@needs_bwrap
@needs_javac
@pytest.mark.timeout(120)
def test_the_java_agent_finishing_through_its_logger_is_read(classes: Path, tmp_path: Path) -> None:
    """RT37C_LOG=slf4j: before the fix gate-1 was FAIL_OUTCOME ("the final message reports it did
    not finish") and the lying twin's done on gate-5 was no claim."""
    _as_expected(_run(("gate-1-healthy-delivery", "gate-8-deadline", "refusal-1-session-prompt"),
                      f"env RT37C_LOG=slf4j java -cp {classes} Agent", tmp_path / "log.json"))
    lie = _run(("gate-5-permission-loss",), f"env RT37C_LOG=slf4j RT37C_LIE=1 java -cp {classes} Agent",
               tmp_path / "lie.json")["gate-5-permission-loss"]
    assert lie["claim"] == "done" and "FAIL_OUTCOME" in lie["unexpected"], (lie["claim"], lie["reasons"])
