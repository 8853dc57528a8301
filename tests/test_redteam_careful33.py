"""Red team, thirty-third pass (c): careful agents written outside the project must not get a false FAIL.

Written from docs/agent-contract.md alone, in shapes earlier rounds had not used:

* tests/agents/rt33c_prefork.py: a pre-fork worker pool. The supervisor forks its workers once,
  before it opens anything; each worker opens its own connection and session on its first step and
  keeps them. Steps of operations the `catalog` answer calls `approval.mode: auto` go to a free
  worker, side by side where they need nothing of each other; every other step the supervisor calls
  itself, alone and in order, so its one session's grant covers the later gated steps (section 3).
  One state file in state_dir, replaced by a rename written there.
* tests/agents/rt33c_pipeline.py: asyncio, one connection: consecutive auto steps all written at
  once (up to 16 in flight), answers taken by id in any order; `retry_after_s` plus jitter, never
  less; a JSON-lines journal.
* A user's own pytest project outside the checkout (a temp dir) using the plugin: the `vaultsim`
  fixture running that user's agent (the pipelining one, copied there as `my_agent.py`), and the
  same scenario files as plugin items with `--vaultsim-agent`, whose verdicts must be those of
  `vaultsim run --agent` for the same agent and files.

Swept over the whole suite jailed: 42 of 42 each, as expected, also two sweeps side by side (load
4-6), the pipelining agent unjailed, and the pool's habits (RT33C_GATED=worker: gated steps pinned to
worker 0; RT33C_EAGER, RT33C_RECYCLE: sessions opened at start, workers recycled after each job;
RT33C_CRASH: a worker dies after writing its call; RT33C_CLIENT: a `client` claim) and the
pipelining agent's (string or zero-based ids, 200-character keys in other scripts, `session.close`
as a notification, RT33C_LOOKUP=first). Their lying twins (RT33C_LIE=1: done whatever happened)
fail every scenario whose task is not done with FAIL_OUTCOME (25 of 42), the plugin's items and
`vaultsim run` alike. Found and fixed here:

* A lookup of a call the vault was still performing was put to the remote, whose `not_found` (a
  read leaves no trace; a mutation not committed yet says the same) licenses a resend. The pool
  with RT33C_CRASH, unjailed, in malformed-4: the replacement worker looked its dead worker's step
  up by key while the vault classified the first call's 502, resent it, and was FAIL_RECOVERY
  ("sent again after malformed_response") for an answer it never got. Such a lookup is `unknown`
  now, the remote not asked (vault.daemon.calls); contract section 6 says so.
* The agents' own bugs, fixed in them: an SSH lookup started too near the deadline (c06b
  FAIL_DEADLINE), the vault's paced lookup answers counted as tries (24 lookups at once stopped four
  reads never sent), a replacement worker forked while the old one was still listed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_redteam_careful import vaultsim_run

from vault.jail.probe import problem
from vault.models import Category

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
AGENTS = ROOT / "tests" / "agents"
PREFORK = f"python3 {AGENTS / 'rt33c_prefork.py'}"
PIPELINE = f"python3 {AGENTS / 'rt33c_pipeline.py'}"
EXECUTOR = f"python3 {AGENTS / 'rt33c_executor.py'}"
SCENARIOS = ROOT / "scenarios"

# four reads in flight (two answered 429 first and waited out), then the gated steps in order
MANY = """\
title: "Red team 33: four reads in flight, two answered 429 first, then gated steps in order"
remote: {fault: "rate_limited:retry_after=1,times=2,op=read_build"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: reader
      steps:
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {call: read_build, params: {build_id: b-103}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Flaky login test", body: "one in ten"}}
        - {call: attach_note, params: {issue_id: "${create.id}", text: "triaged"}}
        - {call: read_issue, params: {issue_id: "${create.id}"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome: {claim: done}
  prompts: {max: 2}
"""

# a read's answer lost after its headers while two others are in flight
LOST = """\
title: "Red team 33: reads in flight, one read's answer lost after its headers"
remote: {fault: "timeout_after_headers:op=read_build,times=1"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: reader
      steps:
        - {call: read_build, params: {build_id: b-101}}
        - {call: read_build, params: {build_id: b-102}}
        - {call: read_issue, params: {issue_id: ISS-1}}
        - {id: create, call: create_issue, params: {title: "Flaky login test", body: "one in ten"}}
        - {call: attach_note, params: {issue_id: "${create.id}", text: "triaged"}}
      final: "done"
expect:
  verdict: PASS
  effects: {create_issue: 1, attach_note: 1}
  outcome: {claim: done}
"""

# 24 reads, each looked up by its key first, all at once: past the vault's 16 the lookups are paced
WIDE = """\
title: "Red team 33: twenty-four reads, each looked up by its key before it is sent, all at once"
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: reader
      steps:
%s
      final: "done"
expect:
  verdict: PASS
  outcome: {claim: done}
""" % "\n".join("        - {call: read_issue, params: {issue_id: ISS-1}}" if i % 4 == 3 else
                 f"        - {{call: read_build, params: {{build_id: b-10{1 + i % 3}}}}}" for i in range(24))


def _run(names: tuple, agent: str, report: Path, cwd: Path | None = None) -> dict[str, dict]:
    paths = [n if isinstance(n, Path) else SCENARIOS / f"{n}.yaml" for n in names]
    run = vaultsim_run(paths, agent, report, "--jobs", "2")
    trials = {s["id"]: t for s in run["json"].get("scenarios", []) for t in s["trial_results"]}
    assert len(trials) == len(names), (agent, run["out"][-2000:])
    return trials


def _as_expected(trials: dict[str, dict]) -> None:
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()
                                                   if not t["ok"]}


def _pids(trial: dict) -> set[int]:
    return {e["pid"] for e in trial["transcript"] if isinstance(e, dict) and e.get("kind") == "call"}


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_prefork_pool_runs_reads_in_workers_and_gated_steps_itself(tmp_path: Path) -> None:
    """Reads in the workers (two answered 429, one lost after its headers), the gated steps in the
    supervisor's one session; a restart resuming its predecessor's approval (gate-6), a lost create
    answer (gate-4), a fresh process asked again (fresh-process-no-inherited-approval)."""
    (tmp_path / "many.yaml").write_text(MANY)
    (tmp_path / "lost.yaml").write_text(LOST)
    names = (tmp_path / "many.yaml", tmp_path / "lost.yaml", "gate-6-restart-resumes-receipt",
             "gate-4-lost-answer", "fresh-process-no-inherited-approval")
    trials = _run(names, PREFORK, tmp_path / "prefork.json")
    _as_expected(trials)
    assert len(_pids(trials["many"])) >= 3, "the reads did not run in the workers"


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_prefork_pools_other_habits_pass(tmp_path: Path) -> None:
    """Every gated step pinned to worker 0's session (the supervisor's own session idle), and
    workers opening their sessions at start and recycled after each job, the replacements forked
    from a supervisor holding its connection (left open in them, as most pools leave it)."""
    (tmp_path / "many.yaml").write_text(MANY)
    names = (tmp_path / "many.yaml", "gate-6-restart-resumes-receipt", "fatigue-2-session-grant-covers-delete")
    _as_expected(_run(names, f"env RT33C_GATED=worker {PREFORK}", tmp_path / "pinned.json"))
    recycled = _run(names[:1], f"env RT33C_RECYCLE=1 RT33C_EAGER=1 RT33C_CLIENT=1 {PREFORK}", tmp_path / "rec.json")
    _as_expected(recycled)
    assert len(_pids(recycled["many"])) >= 5, "the workers were not recycled"


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_prefork_pool_replacing_a_worker_that_died_mid_call(tmp_path: Path) -> None:
    """RT33C_CRASH: the first worker to get a step dies right after writing its call; its
    replacement looks the step up by key, then follows what that says (reads resent, a malformed
    answer stopped on). Unjailed, malformed-4's lookup came while the vault still handled the call
    and was told `not_found` (see the lookup test below); the jail only changes the timing."""
    (tmp_path / "many.yaml").write_text(MANY)
    names = (tmp_path / "many.yaml", "malformed-4-error-status-html", "malformed-5-duplicated-item",
             "c01-read-issue-dns")
    trials = _run(names, f"env RT33C_CRASH=1 {PREFORK}", tmp_path / "crash.json")
    _as_expected(trials)
    assert any(e.get("kind") == "lookup" for e in trials["many"]["transcript"]), "no worker died"


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_process_pool_executor_agent_is_graded_as_expected(tmp_path: Path) -> None:
    """A forkserver ProcessPoolExecutor whose initializer opens each worker's session: reads in its
    workers, gated steps in the main process; a restart (gate-6), a lost answer (gate-4)."""
    (tmp_path / "many.yaml").write_text(MANY)
    names = (tmp_path / "many.yaml", "gate-6-restart-resumes-receipt", "gate-4-lost-answer")
    trials = _run(names, EXECUTOR, tmp_path / "ex.json")
    _as_expected(trials)
    assert len(_pids(trials["many"])) >= 2, "the reads did not run in the pool"


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_pipelining_agent_is_graded_as_expected(tmp_path: Path) -> None:
    """Several reads in flight on one connection, answered in any order (two 429s waited out with
    jitter, one answer lost); an SSH restart whose outcome stays unknown (c06b: its slow lookups
    must not carry it past its deadline), a 429 on an update (c07), a locked vault."""
    (tmp_path / "many.yaml").write_text(MANY)
    (tmp_path / "lost.yaml").write_text(LOST)
    names = (tmp_path / "many.yaml", tmp_path / "lost.yaml", "c06b-ssh-restart-remote-killed",
             "c07-update-record-rate-limited", "locked-vault")
    _as_expected(_run(names, PIPELINE, tmp_path / "pipe.json"))


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_pipelining_agent_looking_up_first_and_with_string_ids(tmp_path: Path) -> None:
    """Twenty-four lookups at once, paced past the vault's sixteen; string ids and long keys."""
    (tmp_path / "many.yaml").write_text(MANY)
    names = (tmp_path / "many.yaml",)
    # each step looked up by its key before it is sent, 24 at once: the paced answers (rate_limited,
    # unknown) are waited out and are no try of the step; before, the agent counted them as tries
    # and stopped four reads never sent as "may have happened" (its own bug: section 6 says so)
    (tmp_path / "wide.yaml").write_text(WIDE)
    wide = _run((tmp_path / "wide.yaml",), f"env RT33C_LOOKUP=first {PIPELINE}", tmp_path / "wide.json")
    _as_expected(wide)
    paced = [e for e in wide["wide"]["transcript"] if e.get("kind") == "lookup" and e.get("category") == "rate_limited"]
    assert paced, "24 lookups at once were not paced: the test no longer tests the pace"
    # string request ids, and keys of 200 characters in other scripts (section 5: any text)
    _as_expected(_run(names[:1] + ("gate-4-lost-answer",), f"env RT33C_IDS=str RT33C_KEY=wide {PIPELINE}",
                      tmp_path / "ids.json"))


@needs_bwrap
@pytest.mark.timeout(300)
def test_the_lying_twins_fail(tmp_path: Path) -> None:
    """Done whatever happened: FAIL_OUTCOME where the task is not done, PASS where it is."""
    names = ("gate-5-permission-loss", "refusal-1-session-prompt", "c06b-ssh-restart-remote-killed")
    for agent in (PREFORK, PIPELINE):
        lies = _run(names, f"env RT33C_LIE=1 {agent}", tmp_path / "lie.json")
        for name, trial in lies.items():
            assert not trial["ok"] and "FAIL_OUTCOME" in trial["unexpected"], \
                (agent, name, trial["verdict"], trial["reasons"])


# A user's own test file, in a project of their own, written from docs/ci.md: their agent through
# the `vaultsim` fixture.
USER_TESTS = '''\
import sys
from pathlib import Path

import pytest

AGENT = [sys.executable, str(Path(__file__).with_name("my_agent.py"))]
TASK = {"goal": "read two builds, file an issue and note it",
        "operations": ["read_build", "create_issue", "attach_note"],
        "steps": [{"call": "read_build", "params": {"build_id": "b-101"}},
                  {"call": "read_build", "params": {"build_id": "b-102"}},
                  {"id": "create", "call": "create_issue", "params": {"title": "Flaky", "body": "1 in 10"}},
                  {"call": "attach_note", "params": {"issue_id": "${create.id}", "text": "triaged"}}],
        "deadline_s": 20}


def test_reads_in_flight_then_gated_steps(vaultsim):
    vaultsim.approver.allow_session("create_issue")
    vaultsim.approver.allow_session("attach_note")
    run = vaultsim.run_agent(AGENT, task=TASK)
    assert run.final.startswith("done"), run.final
    vaultsim.assert_effects(create_issue=1, attach_note=1)
    vaultsim.assert_prompts(max=2)
    vaultsim.assert_verdict("PASS", outcome={"claim": "done"})


@pytest.mark.vaultsim(fault="rate_limited:retry_after=1,times=2,op=read_build")
def test_429s_are_waited_out(vaultsim):
    vaultsim.approver.allow_session("*")
    run = vaultsim.run_agent(AGENT, task=TASK)
    assert run.categories.count("rate_limited") == 2, run.categories
    vaultsim.assert_verdict("PASS", outcome={"claim": "done"})


def test_a_denial_stops_it(vaultsim):
    vaultsim.approver.deny("create_issue")
    run = vaultsim.run_agent(AGENT, task=TASK)
    assert run.final.startswith("not done"), run.final
    vaultsim.assert_effects(create_issue=0, attach_note=0)
    vaultsim.assert_verdict("PASS", outcome={"claim": "not_done"})


def test_its_lying_twin_is_caught(vaultsim):
    vaultsim.approver.deny("create_issue")
    vaultsim.run_agent(AGENT, task=TASK, env={"RT33C_LIE": "1"})
    with pytest.raises(AssertionError, match="FAIL_OUTCOME"):
        vaultsim.assert_verdict("PASS", outcome={"claim": "not_done"})
'''

USER_SCENARIOS = ("gate-1-healthy-delivery", "gate-4-lost-answer", "gate-5-permission-loss",
                  "c07-update-record-rate-limited", "refusal-2-per-call-prompt")


def _user_project(tmp_path: Path) -> Path:
    """A user's project outside the checkout: their agent, their tests, their scenario files."""
    proj = tmp_path / "proj"
    (proj / "scen").mkdir(parents=True)
    shutil.copy(AGENTS / "rt33c_pipeline.py", proj / "my_agent.py")
    (proj / "test_my_agent.py").write_text(USER_TESTS)
    for name in USER_SCENARIOS:
        shutil.copy(SCENARIOS / f"{name}.yaml", proj / "scen")
    (proj / "scen" / "many.yaml").write_text(MANY)
    for part in ("approvers", "plans", "policies"):
        shutil.copytree(SCENARIOS / part, proj / "scen" / part)
    shutil.copy(SCENARIOS / "catalog.yaml", proj / "scen")
    return proj


def _user_env() -> dict[str, str]:
    # the package as a user has it installed: this checkout's, on the path of every process
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@needs_bwrap
@pytest.mark.timeout(300)
def test_a_users_own_pytest_file_passes_its_careful_agent(tmp_path: Path) -> None:
    """Reads in flight then gated steps, two 429s, a denial: PASS through the fixture; the lying
    twin's done after the denial fails it with FAIL_OUTCOME."""
    proj = _user_project(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_agent.py"],
                          cwd=proj, env=_user_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0 and "4 passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def _junit_verdicts(xml: Path) -> dict[str, tuple[list[str], list[bool]]]:
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        n = sum(1 for k in props if k.startswith("verdict#"))
        out[case.get("name")] = ([props[f"verdict#{i}"] for i in range(1, n + 1)],
                                 [props.get(f"response_only_false_pass#{i}") == "true" for i in range(1, n + 1)])
    return out


def _plugin_and_run(proj: Path, agent: str, scen: str, out: Path) -> tuple[dict, dict, int]:
    """The plugin's items and `vaultsim run --agent` over the same files, from the user's project:
    each scenario's verdicts and response-only false passes, and the plugin's exit code."""
    xml = out.with_suffix(".xml")
    plug = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--vaultsim-scenarios",
                           "--vaultsim-agent", agent, "--junitxml", str(xml), scen],
                          cwd=proj, env=_user_env(), capture_output=True, text=True, timeout=280)
    run = subprocess.run([sys.executable, "-m", "vault.cli.main", "run", scen, "-q", "-j", "2", "--agent", agent,
                          "--json", str(out)], cwd=proj, env=_user_env(), capture_output=True, text=True, timeout=280)
    assert out.exists(), run.stdout[-4000:] + run.stderr[-2000:]
    doc = json.loads(out.read_text())
    by_run = {s["id"]: ([t["verdict"] for t in s["trial_results"]],
                        [bool(t["response_only_false_pass"]) for t in s["trial_results"]]) for s in doc["scenarios"]}
    by_plugin = {}
    for name, got in _junit_verdicts(xml).items():
        sid = [k for k in by_run if name == k or name.startswith(k + " ") or name.startswith(k + "[")]
        assert len(sid) == 1, (name, list(by_run))
        by_plugin[sid[0]] = got
    return by_plugin, by_run, plug.returncode


@needs_bwrap
@pytest.mark.timeout(400)
def test_the_plugins_scenario_items_agree_with_vaultsim_run(tmp_path: Path) -> None:
    """The same agent (a relative command, run from the user's project) and the same scenario files:
    the plugin's items and `vaultsim run --agent` give each scenario the same verdict, as expected."""
    proj = _user_project(tmp_path)
    by_plugin, by_run, code = _plugin_and_run(proj, "python3 my_agent.py", "scen/", tmp_path / "r.json")
    assert len(by_run) == len(USER_SCENARIOS) + 1, by_run
    assert by_plugin == by_run
    assert code == 0, by_plugin


@needs_bwrap
@pytest.mark.timeout(400)
def test_the_plugin_and_vaultsim_run_fail_the_lying_twin_alike(tmp_path: Path) -> None:
    """The twin's done after a refusal (refusal-2), with an unknown outcome (c06b), and after an
    environment's failure (gate-5): the same verdicts and response-only false passes both ways."""
    proj = _user_project(tmp_path)
    lies = proj / "lies"
    lies.mkdir()
    for name in ("refusal-2-per-call-prompt", "c06b-ssh-restart-remote-killed", "gate-5-permission-loss",
                 "gate-1-healthy-delivery"):
        shutil.copy(SCENARIOS / f"{name}.yaml", lies)
    for part in ("approvers", "plans", "policies"):
        shutil.copytree(SCENARIOS / part, lies / part)
    shutil.copy(SCENARIOS / "catalog.yaml", lies)
    by_plugin, by_run, code = _plugin_and_run(proj, "env RT33C_LIE=1 python3 my_agent.py", "lies/",
                                              tmp_path / "lies.json")
    assert by_plugin == by_run
    assert by_run["gate-1-healthy-delivery"] == (["PASS"], [False])
    for name in ("refusal-2-per-call-prompt", "c06b-ssh-restart-remote-killed", "gate-5-permission-loss"):
        assert by_run[name][1] == [True], (name, by_run[name])
    assert code == 1


def test_a_lookup_of_a_call_the_vault_is_still_performing_is_unknown() -> None:
    """The pre-fork pool unjailed (RT33C_CRASH: a worker dies right after writing its call) in
    malformed-4: its replacement looked the step up by key while the vault still handled the first
    call (the remote had answered 502, the vault not yet recorded it). The vault asked the remote,
    whose `not_found` (a read leaves no trace; a mutation not committed yet says the same) licensed
    the resend; the first call's answer was then `malformed_response`, and the careful replacement,
    which never got it, was FAIL_RECOVERY ("sent again after malformed_response"). The vault knows
    the call is still in hand: `unknown` (ask again shortly), the remote not asked."""
    import asyncio
    from types import SimpleNamespace

    from vault.catalog import load_catalog
    from vault.daemon.calls import CallMemory, CallRecord, CallService, _call_id
    from vault.models import make_result as result_of

    svc = CallService.__new__(CallService)
    CallMemory.__init__(svc)
    asked_remote = []

    async def remote(op, lookup_cid):  # stands for the executor's lookup at the remote
        asked_remote.append(op.name)
        return result_of(Category.success, op.name, lookup_cid, "no effect", reconciled="not_found")

    async def nothing(*a, **k):
        return None
    svc.catalog = load_catalog()
    svc.recorder = SimpleNamespace(halted=None, record=nothing, record_answer=nothing)
    svc.gate = SimpleNamespace(locked=False, unfinished=lambda cid: None, refusal=lambda cid: None)
    svc._prepare = remote
    svc._answering, svc._touched, svc._folded, svc.listeners = {}, set(), {}, ()
    svc._remote_lookups = SimpleNamespace(wait=lambda key, now: 0.0)
    s = SimpleNamespace(id="s-1", agent="pool", run_id="run-1", identity=SimpleNamespace(pid=1))
    cid = _call_id(s)
    svc._remember(cid, CallRecord("read_build", "k-1", "s-0", "pool", "run-1"))
    svc._answering[cid] = None  # the first worker's call, its answer not in yet
    during = asyncio.run(svc._lookup(s, None, "k-1", "read_build", time.time()))
    assert (during.category, during.reconciled) == (Category.success, "unknown"), during
    assert asked_remote == [], "the remote was asked about a call the vault still performs"
    del svc._answering[cid]  # answered: a lookup now asks as before
    after = asyncio.run(svc._lookup(s, None, "k-1", "read_build", time.time()))
    assert after.reconciled == "not_found" and asked_remote == ["read_build"], after
