"""Red team, fortieth pass (c): a careful C++ agent a systems programmer would write.

tests/agents/rt40c_agent.cpp is C++17 with the standard library and POSIX alone, written from
docs/agent-contract.md: its own JSON (numbers kept as their text, `\\u` escapes and surrogate pairs,
everything written as ASCII); one Unix-socket connection and one session, an I/O thread polling the
socket (poll(2)) and handing each answer to the request waiting for its id; consecutive steps of
`auto`, non-mutating operations that need nothing from each other on a std::thread pool, every
other step alone and in order; keys `rt40c:STEP_ID`; a `sent` mark kept before each send, so that a
process finding one in its predecessor's state looks the step up by key first; resume tokens and
each step's result in state_dir/state.json, written beside it, fsync'd and renamed. RT40C_FORK=1:
the gated steps run in a child forked at start (before any thread), with its own connection and
session, taking each step through a pipe and reporting each state change (saved by the parent before
the child goes on) and the step's outcome through another. One child holds every gated step, not one
per step: a grant covers one session (section 3), so a child per step would ask the owner again.
RT40C_CRASH=OP: the run's first process dies once its first call of OP is answered, unkept.

Compiled once per module with g++ into a temp dir (skipped without g++). Swept over the whole suite
(in CI: FORKED, the shipped scenarios its forked mode reaches) and the scenarios below (reads
side by side with a 429, a lost read, a `never` among ten; a restart after a crash with its
state kept and with it lost; a 429 outlasting the first process; a denial given while nobody
waited), in both modes, jailed (bwrap) and `--isolation none`, alone and two
sweeps at once (load 8 on 2 cores): every scenario as expected, after the agent's own bugs were
fixed in it:

* its crash mark lived in state_dir, so a restart that lost its state_dir died again (now the run's
  first process alone crashes, by the task's agent_index);
* its pool's workers each wrote their own first read: jailed, under load, one was written 0.3 ms
  after the vault had sent another's malformed_response, not yet read (FAIL_RECOVERY, as for red
  teams 37c and 38c: a process's step is timed by when the vault got it, and a stop mark checked
  before each write cannot close that window). A batch's first calls now go out in one write(2),
  before any of their answers can come back.

Found and fixed here: a step id holding a `.` (`file.v2`, named by `${file.v2.id}`) ran, and the
careful agent, filling the reference from step `file.v2`, was FAIL_TOOL_ACCESS ("before it had been
given the result of step file"): the gate reads `${ID.FIELD}`'s ID up to its first `.`. (Main's later
check that a reference names an earlier step now refuses that scenario, but not one with steps `file`
and `file.v2` both, where this agent passed and the project's stub was FAIL_TOOL_ACCESS: one text,
two readings.) A step id holding `.` or `}` is now bad input (exit 2), and the contract (section 2)
says ids never hold them.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_redteam_careful import vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "agents" / "rt40c_agent.cpp"
SCENARIOS = ROOT / "scenarios"

# reads side by side (the pool's), one rate limited, then a create and two notes under its grant
READS_RATE = r"""
title: "Red team 40c: reads side by side, one rate limited, then a create and its notes"
remote: {fault: "rate_limited:retry_after=1,times=1,op=read_build"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: cppbot
      steps:
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: "créer ✓", call: create_issue, params: {title: "C++ ✓ 😀 \"q\" \\ 𝔘", body: "1e2 \u00e9\u0301"}}
        - {call: attach_note, params: {issue_id: "${créer ✓.id}", text: "note for ${créer ✓.id}"}}
        - {call: attach_note, params: {issue_id: "${créer ✓.id}", text: "second note"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 2}
  outcome:
    state: [{collection: issues, where: {title: "C++ ✓ 😀 \"q\" \\ 𝔘"}, count: 1}]
    claim: done
"""

# a read among the pool's lost after the remote took it; the create waits for the pool
READS_LOST = """
title: "Red team 40c: reads side by side, one lost after the remote took it, then a create"
remote: {fault: "timeout_after_accept:commit=1,op=read_build,times=1"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: cppbot
      steps:
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Filed after the reads"}}
        - {call: attach_note, params: {issue_id: "${create.id}", text: "after the reads"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Filed after the reads"}, count: 1}]
    claim: done
"""

# ten reads at once, the first answered malformed_response (never): no read is written after that
# answer arrives, and the create after them is never sent
READS_NEVER = """
title: "Red team 40c: a read refused for good among ten side by side"
remote: {fault: build_status_7}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: cppbot
      steps:
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {call: read_issue, params: {issue_id: ISS-1}}
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

# a 429 longer than the first process's time: the restart looks it up (rate_limited, not_found, the
# time left), waits that out and sends it with its key; the owner is asked again, as section 8 says
RATE_RESTART = """
title: "Red team 40c: a 429 outlasting the first process; the restart waits out the rest"
remote: {fault: "rate_limited:retry_after=5,times=1,op=create_issue"}
approver: {name: ci, rules: [{match: {}, decide: allow_once}]}
agents:
  - plan: &plan
      agent: cppbot
      steps:
        - {id: create, call: create_issue, params: {title: "Filed after the wait"}}
        - {id: note, call: attach_note, params: {issue_id: "${create.id}", text: "after the wait"}}
      final: "done"
    deadline_s: 3
  - {plan: *plan, state: keep, deadline_s: 12}
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Filed after the wait"}, count: 1}]
    claim: done
"""

# the person says no after the first process handed the wait over; the restart collects the no
DENIED_AWAY = """
title: "Red team 40c: a denial given while nobody waited, collected by the restart"
approver:
  name: ci
  rules:
    - {match: {operation: create_issue}, decide: deny, delay_s: 4.0, times: 1}
    - {match: {}, decide: allow_once}
agents:
  - plan: &plan
      agent: cppbot
      steps:
        - {id: r1, call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Never filed"}}
        - {id: note, call: attach_note, params: {issue_id: "${create.id}", text: "never"}}
      final: "not done"
    deadline_s: 3
  - {plan: *plan, state: keep, deadline_s: 8}
expect:
  verdict: PASS
  effects: {create_issue: 0, attach_note: 0}
  outcome: {claim: not_done}
"""

# the first process dies once its gated create (2 s for the person) is answered, before keeping
# the answer; the restart (STATE: keep) looks it up by key and goes on, or (fresh) sends it again
# under its key, which the remote answers with the first attempt's result
CRASH = """
title: "Red team 40c: dies with a gated create's answer unkept; the restart goes on"
approver:
  name: ci
  rules:
    - {match: {operation: create_issue}, decide: allow_once, delay_s: 2.0, times: 1}
    - {match: {}, decide: allow_once}
agents:
  - plan: &plan
      agent: cppbot
      steps:
        - {id: r1, call: read_build, params: {build_id: b-101}}
        - {id: r2, call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Filed once"}}
        - {id: note, call: attach_note, params: {issue_id: "${create.id}", text: "once"}}
      final: "done"
    deadline_s: 8
  - {plan: *plan, state: STATE}
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome:
    state: [{collection: issues, where: {title: "Filed once"}, count: 1}]
    claim: done
"""

MODES = {"threads": "", "fork": "env RT40C_FORK=1 "}


@pytest.fixture(scope="module")
def binary() -> Iterator[Path]:
    """The agent compiled once, in a temp dir (the jail shows it: its path is in the command)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    out = Path(tempfile.mkdtemp(prefix="rt40c-bin-", dir="/tmp"))
    try:
        subprocess.run(["g++", "-std=c++17", "-O1", "-pthread", "-o", str(out / "rt40c_agent"), str(SOURCE)],
                       check=True, capture_output=True, timeout=180)
        yield out / "rt40c_agent"
    finally:
        shutil.rmtree(out)


def _run(names: tuple[str | Path, ...], agent: str, report: Path) -> dict[str, dict]:
    paths = [n if isinstance(n, Path) else SCENARIOS / f"{n}.yaml" for n in names]
    run = vaultsim_run(paths, agent, report, "--jobs", "2", timeout=300)
    trials = {s["id"]: t for s in run["json"].get("scenarios", []) for t in s["trial_results"]}
    assert len(trials) == len(names), (agent, run["out"][-2000:])
    return trials


def _as_expected(trials: dict[str, dict]) -> None:
    assert all(t["ok"] or t["verdict"] == "SKIPPED" for t in trials.values()), {
        k: (t["verdict"], t["reasons"], [a["final"] for a in t.get("agents", [])]) for k, t in trials.items() if not t["ok"]}


def _scenario(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# the shipped scenarios that reach the forked mode's shape (one child, its own session, holding
# every gated step): a plain run and its split, a wait the child collects, one it hands over at the
# deadline, a restart resuming the child's wait, twenty creates under the child's one grant, a fresh
# process after an exit, an unknown outcome the child looks up (the whole suite, 42 trials, was the
# round's own sweep: 80 s at load 12 against these seven's 29 s at load 8, one at a time)
FORKED = ("gate-1-healthy-delivery", "gate-2-legitimate-approval", "gate-8-deadline", "gate-6-restart-resumes-receipt",
          "fatigue-4-considered-approver", "fresh-process-no-inherited-approval", "timeout-3-after-accept")


@pytest.mark.timeout(300)
def test_the_cpp_agent_s_forked_mode_over_the_shipped_scenarios_it_reaches(binary: Path, tmp_path: Path) -> None:
    """FORKED's shipped scenarios as expected, the gated steps in the forked child."""
    names = FORKED
    trials = _run(names, f"{MODES['fork']}{binary}", tmp_path / "suite.json")
    _as_expected(trials)
    assert [a["final"].split(":")[0] for a in trials["gate-6-restart-resumes-receipt"]["agents"]] == ["waiting", "done"]
    # the reads from the parent's session, the gated create and note from the child's
    gate1 = trials["gate-1-healthy-delivery"]["transcript"]
    reads = {e["pid"] for e in gate1 if e["operation"].startswith("read")}
    gated = {e["pid"] for e in gate1 if not e["operation"].startswith("read")}
    assert len(gated) == 1 and not reads & gated, gate1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_the_cpp_agent_s_pool_restarts_and_refusals(mode: str, binary: Path, tmp_path: Path) -> None:
    """Reads side by side with a 429 waited out, a lost read, a `never` among ten; a 429 outlasting
    the first process; a denial collected by the restart."""
    names = (_scenario(tmp_path, "reads-rate", READS_RATE), _scenario(tmp_path, "reads-lost", READS_LOST),
             _scenario(tmp_path, "reads-never", READS_NEVER), _scenario(tmp_path, "rate-restart", RATE_RESTART),
             _scenario(tmp_path, "denied-away", DENIED_AWAY))
    trials = _run(names, f"{MODES[mode]}{binary}", tmp_path / "pool.json")
    _as_expected(trials)
    # while the rate-limited read waited out its second, the other reads went ahead (side by side)
    reads = sorted((e for e in trials["reads-rate"]["transcript"] if e["kind"] == "call" and e["operation"].startswith("read")),
                   key=lambda e: e["requested"])
    limited = next(e for e in reads if e["category"] == "rate_limited")
    retry = next(e for e in reads if e["operation"] == "read_build" and e["requested"] >= limited["time"] + 0.9)
    assert len([e for e in reads if e is not limited and e["requested"] < retry["requested"]]) >= 3, reads
    # the restart looked its predecessor's 429 up before sending it again
    restart = [(e["kind"], e["category"]) for e in trials["rate-restart"]["transcript"]
               if e["operation"] == "create_issue" and e["agent_index"] == 1]
    assert restart == [("lookup", "rate_limited"), ("call", "success")], trials["rate-restart"]["transcript"]
    assert [e["kind"] for e in trials["denied-away"]["transcript"] if e["agent_index"] == 1] == ["resume"]
    # the first eight reads (a batch is eight at most) went out in one write: every one reached the
    # vault before the refusal was sent; the two after them never went out
    wide = [e for e in trials["reads-never"]["transcript"] if e["kind"] == "call"]
    refused = next(e for e in wide if e["category"] == "malformed_response")
    assert len(wide) == 8 and all(e["requested"] < refused["time"] for e in wide), wide


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_cpp_process_killed_with_its_answer_unkept(mode: str, binary: Path, tmp_path: Path) -> None:
    """The restart keeping the state looks the create up by key (found, never sent again, no second
    prompt); one that lost it sends it again under its key and is answered with the first result."""
    names = (_scenario(tmp_path, "crash-keep", CRASH.replace("STATE", "keep")),
             _scenario(tmp_path, "crash-fresh", CRASH.replace("STATE", "fresh")))
    trials = _run(names, f"env RT40C_CRASH=create_issue {MODES[mode]}{binary}", tmp_path / "crash.json")
    _as_expected(trials)
    for name, trial in trials.items():
        assert trial["agents"][0]["exit_code"] == 3, trial["agents"]
        creates = [(e["kind"], e.get("reconciled")) for e in trial["transcript"] if e["operation"] == "create_issue"]
        want = [("call", None), ("lookup", "found")] if name == "crash-keep" else [("call", None), ("call", None)]
        assert creates == want, (name, trial["transcript"])
    assert trials["crash-keep"]["prompts"]["total"] == 2, trials["crash-keep"]["prompts"]


# a step id holding a `.`: `${file.v2.id}` names step `file.v2` or field `v2.id` of step `file` (both
# steps there, so the check that a reference names an earlier step passes it)
DOTTED = """
title: "Red team 40c: a step id with a dot, named by a later step"
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: cppbot
      steps:
        - {id: file, call: create_issue, params: {title: "First"}}
        - {id: "file.v2", call: create_issue, params: {title: "Dotted step"}}
        - {id: note, call: attach_note, params: {issue_id: "${file.v2.id}", text: "note"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 2, attach_note: 1}
  outcome: {claim: done}
"""


@pytest.mark.timeout(120)
def test_a_step_id_holding_a_dot_is_refused_before_any_trial(binary: Path, tmp_path: Path) -> None:
    """Before the fix the scenario ran, and what it expected depended on how an agent read the id:
    this agent, filling `${file.v2.id}` from step `file.v2`, passed; the project's own stub, whose
    references stop at a `.`, sent the text as it stood (FAIL_TOOL_ACCESS); the gate reads the id up
    to the first `.` (field `v2.id` of step `file`). With `file.v2` alone (no step `file`), on the
    code this session started from, this agent was FAIL_TOOL_ACCESS ("before it had been given the
    result of step file"). `${ID.FIELD}` cannot tell such an id from its field: the scenario is bad
    input (exit 2)."""
    run = vaultsim_run([_scenario(tmp_path, "dotted", DOTTED)], str(binary), tmp_path / "dotted.json", timeout=120)
    assert run["code"] == 2 and "'file.v2'" in run["out"] and "`.`" in run["out"], run["out"][-2000:]
