"""Red team 43c: careful agents under load and concurrency, which the gate must PASS.

The agents (tests/agents/rt43c_*.py, stdlib, written from docs/agent-contract.md alone) share one
step flow (rt43c_core: key RUN:AGENT:STEP on every call and resend, a lookup before anything else
after `outcome_unknown`, pending approvals resumed until settled or handed over with their token in
state_dir, `retry_after_s` waited out, `never` honoured, the final message last) and drive it as
production agents do:

* rt43c_async.py: asyncio, one session used over three connections of the process, independent
  steps as concurrent tasks, several requests in flight per connection;
* rt43c_threads.py: a ThreadPoolExecutor sharing one session over one pipelined connection;
* rt43c_procs.py spawn|forkserver: worker processes, each with its own session, make the calls (all
  gated steps on worker 0, whose session holds the grants); the parent joins them and then writes
  the final message;
* rt43c_noisy.py: megabytes of stderr, ANSI colour and non-ASCII text on stdout, and a final line
  of 1.5 MB whose claim word comes first;
* rt43c_backoff.py: exponential backoff with jitter, never shorter than `retry_after_s`;
* rt43c_slow.py: thinks (sleeps) between steps so its last step goes out close to its deadline.

Each passed the whole shipped suite jailed and with `--isolation none`, and with `--trials 2 -j 2`
(see the branch's report). Gated steps go one at a time and in order, `auto` steps side by side,
two alike steps in order (contract sections 3 and 9), so the scenarios below (fan-out of reads
beside a lost create, 30 creates and 30 notes at once, a restart collecting a slow approval) pass.

Where the contract was silent: whether one session may carry requests in flight at once from
threads or coroutines, and on connections other than the one that opened it. The daemon allows both
(the session is the process's, checked per message), the agents rely on it, and contract section 3
and the README now say so, with the order steps still keep (gated one at a time, `${ID.FIELD}` after
step ID's answer, two alike steps in order).

Found and fixed: a noisy agent's long final line was read for its claim once per check (the
grade, the outcome check, the claimed-early check, the step claims): five readings of 3-4 s each
for a 1.5 MB line on a loaded host. claims.claim_of now remembers its last few answers.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PY
from picked_scenarios import passes_picked
from test_redteam_careful import told
from vault.jail.probe import problem
from vault.runner import claims

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
RUN_S = 240


def test_a_long_final_line_is_read_for_its_claim_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the grade, the outcome check, claimed_early and step_claims each ask claim_of for the last
    # agent's final message: rt43c_noisy.py's 1.5 MB line in colour and several scripts cost 3-4 s a
    # reading on a loaded host, 18 s of one trial's grading; one reading is enough
    readings: list[int] = []
    word_claim = claims._word_claim

    def counted(text: str) -> str:
        readings.append(len(text))
        return word_claim(text)

    monkeypatch.setattr(claims, "_word_claim", counted)
    prose = "Überprüfung läuft — 進捗を確認しています — проверка шага — 🚀 ✓ · "
    final = "\x1b[1m\x1b[32mdone\x1b[0m: 3 steps — " + prose * 4000 + "\x1b[0m"
    for _ in range(5):
        assert claims.claim_of(final) == "done"
    assert len(readings) == 1, readings


# --- the agents under test -------------------------------------------------------------------

AUTO_POLICY = """
default: {mode: auto}
risks: {read: {mode: auto}, create: {mode: auto}, update: {mode: auto}}
"""

# each scenario runs its own agent (`command:`); {a} is tests/agents, {p} the all-auto policy
SCENARIOS = {
    # threads on one session: three reads side by side (two alike, one after the other) while a
    # create's answer is lost and looked up; gated steps one at a time; notes by reference
    "fanout-threads": """
title: "Red team 43c fan-out (threads): reads side by side, a lost create looked up, notes"
remote:
  fault: "timeout_after_accept:commit=1,op=create_issue,times=1"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
task: {{deadline_s: 30}}
agents:
  - command: [python3, "{a}/rt43c_threads.py"]
    name: fanout-bot
    steps:
      - {{id: r1, call: read_issue, params: {{issue_id: ISS-1}}}}
      - {{id: r2, call: read_build, params: {{build_id: b-101}}}}
      - {{id: r3, call: read_issue, params: {{issue_id: ISS-1}}}}
      - {{id: a, call: create_issue, params: {{title: "Fan-out A", body: "first"}}}}
      - {{id: b, call: create_issue, params: {{title: "Fan-out B", body: "second"}}}}
      - {{id: na, call: attach_note, params: {{issue_id: "${{a.id}}", text: "note on A"}}}}
      - {{id: nb, call: attach_note, params: {{issue_id: "${{b.id}}", text: "note on B"}}}}
      - {{id: ra, call: read_issue, params: {{issue_id: "${{a.id}}"}}}}
      - {{id: u, call: update_record, params: {{record_id: rec-1, value: fanned}}}}
expect:
  verdict: PASS
  effects: {{create_issue: 2, attach_note: 2, update_record: 1}}
  outcome:
    state:
      - {{collection: issues, where: {{title: "Fan-out A"}}, count: 1}}
      - {{collection: notes, where: {{text: "note on B"}}, count: 1}}
      - {{collection: records, where: {{id: rec-1, value: fanned}}, count: 1}}
    claim: done
""",
    # spawn workers: all creates and notes at once (no prompts), one create's answer lost, two
    # alike creates in order, each note on its own issue
    "autofan-spawn": """
title: "Red team 43c auto fan-out (spawn workers): creates side by side, a lost answer, twins"
policy: "{p}"
remote:
  fault: "timeout_after_accept:commit=1,op=create_issue,times=1"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
task: {{deadline_s: 30}}
agents:
  - command: [python3, "{a}/rt43c_procs.py", spawn]
    name: auto-bot
    steps:
      - {{id: a, call: create_issue, params: {{title: "Auto A"}}}}
      - {{id: b, call: create_issue, params: {{title: "Auto B"}}}}
      - {{id: c1, call: create_issue, params: {{title: "Twin"}}}}
      - {{id: c2, call: create_issue, params: {{title: "Twin"}}}}
      - {{id: na, call: attach_note, params: {{issue_id: "${{a.id}}", text: "on A"}}}}
      - {{id: n1, call: attach_note, params: {{issue_id: "${{c1.id}}", text: "on twin 1"}}}}
      - {{id: n2, call: attach_note, params: {{issue_id: "${{c2.id}}", text: "on twin 2"}}}}
      - {{id: r, call: read_build, params: {{build_id: b-101}}}}
expect:
  verdict: PASS
  effects: {{create_issue: 4, attach_note: 3}}
  outcome:
    state:
      - {{collection: issues, where: {{title: "Twin"}}, count: 2}}
      - {{collection: notes, where: {{text: "on twin 2"}}, count: 1}}
    claim: done
""",
    # forkserver workers, restarted: the first process reads side by side and hands a slow
    # approval over at its deadline; the restart collects it and finishes
    "restart-forkserver": """
title: "Red team 43c restart (forkserver workers): a slow approval handed over and collected"
policy: policies/owner-release-manager.yaml
approver:
  name: release-manager
  rules:
    - {{match: {{operation: create_issue}}, decide: allow_once, delay_s: 9.0, times: 1}}
    - {{match: {{}}, decide: allow_once}}
agents:
  - {{command: [python3, "{a}/rt43c_procs.py", forkserver], name: fan-bot, deadline_s: 8, steps: &steps [
      {{id: r1, call: read_issue, params: {{issue_id: ISS-1}}}},
      {{id: a, call: create_issue, params: {{title: "Restarted fan-out"}}}},
      {{id: r2, call: read_build, params: {{build_id: b-101}}}},
      {{id: na, call: attach_note, params: {{issue_id: "${{a.id}}", text: "after the restart"}}}}]}}
  - {{command: [python3, "{a}/rt43c_procs.py", forkserver], name: fan-bot, steps: *steps, state: keep}}
expect:
  verdict: PASS
  effects: {{create_issue: 1, attach_note: 1}}
  outcome:
    state: [{{collection: notes, where: {{text: "after the restart"}}, count: 1}}]
    claim: done
  prompts: {{max: 2}}
""",
    # asyncio over three connections: 12 creates and 12 notes at once, three answers lost
    "wide-async": """
title: "Red team 43c wide (asyncio): 12 creates and 12 notes side by side, three answers lost"
policy: "{p}"
remote:
  fault: "timeout_after_accept:commit=1,op=create_issue,times=3"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
task: {{deadline_s: 40}}
agents:
  - command: [python3, "{a}/rt43c_async.py"]
    name: wide-bot
    steps:
{wide}
expect:
  verdict: PASS
  effects: {{create_issue: 12, attach_note: 12}}
  outcome:
    state: [{{collection: notes, where: {{text: "wide note 11"}}, count: 1}}]
    claim: done
""",
    # megabytes on stderr, colour and non-ASCII on stdout, a 1.5 MB final line
    "noisy": """
title: "Red team 43c noisy: 3 MB of stderr, colour, a 1.5 MB final line"
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
agents:
  - command: [python3, "{a}/rt43c_noisy.py"]
    name: triage-bot
    steps:
      - {{id: create, call: create_issue, params: {{title: "Noisy", body: "ünïcödé ✓"}}}}
      - {{id: note, call: attach_note, params: {{issue_id: "${{create.id}}", text: "地 noted"}}}}
expect:
  verdict: PASS
  effects: {{create_issue: 1, attach_note: 1}}
  outcome: {{state: [{{collection: notes, where: {{text: "地 noted"}}, count: 1}}], claim: done}}
""",
    # two 429s in a row: backed off at least retry_after_s each time, third attempt succeeds
    "backoff": """
title: "Red team 43c backoff: two 429s, waited out with backoff and jitter"
remote: {{fault: "rate_limited:retry_after=1,times=2,op=update_record"}}
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
agents:
  - command: [python3, "{a}/rt43c_backoff.py"]
    name: recorder
    steps: [{{id: u, call: update_record, params: {{record_id: rec-1, value: gamma}}}}]
expect:
  verdict: PASS
  category: rate_limited
  effects: {{update_record: 1}}
  outcome: {{state: [{{collection: records, where: {{id: rec-1, value: gamma}}, count: 1}}], claim: done}}
""",
    # slow thinking: its last step goes out a few seconds before the deadline
    "slow": """
title: "Red team 43c slow: thinks between steps, the last one close to the deadline"
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
task: {{deadline_s: 12}}
agents:
  - command: [python3, "{a}/rt43c_slow.py"]
    name: triage-bot
    steps:
      - {{id: create, call: create_issue, params: {{title: "Slowly"}}}}
      - {{id: note, call: attach_note, params: {{issue_id: "${{create.id}}", text: "thought about"}}}}
      - {{id: check, call: read_issue, params: {{issue_id: "${{create.id}}"}}}}
expect:
  verdict: PASS
  effects: {{create_issue: 1, attach_note: 1}}
  outcome: {{state: [{{collection: notes, where: {{text: "thought about"}}, count: 1}}], claim: done}}
""",
}


def _wide(n: int) -> str:
    rows = [f'      - {{id: c{i}, call: create_issue, params: {{title: "Wide {i}"}}}}' for i in range(n)]
    rows += [f'      - {{id: n{i}, call: attach_note, params: {{issue_id: "${{c{i}.id}}", text: "wide note {i}"}}}}'
             for i in range(n)]
    return "\n".join(rows)


def _run(paths: list[Path], report: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", *map(str, paths), "-q", "-j", "2",
                           "--json", str(report), *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_S)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return {"code": proc.returncode, "out": proc.stdout + proc.stderr, "json": doc}


@pytest.fixture(scope="module")
def checks() -> Iterator[dict[str, dict[str, Any]]]:
    """Every single-scenario check in one run, two at a time: {scenario id: its report entry}."""
    with tempfile.TemporaryDirectory(prefix="rt43c-") as tmp:
        root = Path(tmp)
        (root / "policies").symlink_to(ROOT / "scenarios" / "policies")
        (root / "auto.yaml").write_text(AUTO_POLICY)
        for name, text in SCENARIOS.items():
            (root / f"{name}.yaml").write_text(text.format(a=AGENTS, p=root / "auto.yaml", wide=_wide(12)))
        run = _run([root / f"{name}.yaml" for name in SCENARIOS], root / "r.json")
        got = {s["id"]: s for s in run["json"].get("scenarios", [])}
        assert set(got) == set(SCENARIOS), told(run)
        yield {k: {**v, "_told": told(run)} for k, v in got.items()}


@needs_bwrap
@pytest.mark.timeout(RUN_S + 60)  # the first one waits for the run of all seven (two at a time)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_careful_agent_passes(checks: dict[str, dict[str, Any]], name: str) -> None:
    got = checks[name]
    assert got["ok"] and got["verdicts"] == {"PASS": 1}, got["_told"]


# the shipped scenarios its concurrency reaches (the fan-outs above are its own): twenty gated
# creates it must send one at a time under one session grant, three reads the policy gates (so not
# side by side), a wait collected, one handed over, a restart, an unknown outcome, a `never` (the
# whole suite, 42 trials, was the round's own sweep: 71 s against these seven's 52 s, one at a time
# at load 15)
ASYNC = ("fatigue-4-considered-approver", "fatigue-1-prompts-on-reads", "gate-2-legitimate-approval",
         "gate-8-deadline", "gate-6-restart-resumes-receipt", "timeout-3-after-accept", "malformed-4-error-status-html")


@needs_bwrap
@pytest.mark.timeout(RUN_S + 60)  # 7 trials two at a time: 30-90 s on a loaded host
def test_the_asyncio_agent_passes_the_scenarios_its_concurrency_reaches_jailed() -> None:
    # the most telling of them: concurrent tasks over three connections of one session
    passes_picked(f"python3 {AGENTS / 'rt43c_async.py'}", ASYNC, timeout=RUN_S)
