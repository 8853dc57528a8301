"""Red team 46c: careful agents in habits the gate had not seen, which it must PASS.

Written from README.md, /work/shared's DESIGN.md and docs/agent-contract.md alone (tests/agents/rt46c_*):

* rt46c_forkserver.py: every call made by a `ProcessPoolExecutor` worker started by the
  `forkserver` method (`RT46C_START=spawn` for spawn), one worker and so one session for every
  gated step; the coordinating process asks `vault.status` on a session-less connection of its own
  before each step; heavy logging to stderr and to `agent.log` in state_dir; every
  `outcome_unknown` looked up with backoff (`RT46C_DOUBLE_CHECK=1`: each `found` / `not_found`
  confirmed by a second lookup of the call by its key);
* rt46c_workers.mjs: Node, each step on a `worker_threads` worker with its own `net` connection,
  all under the main thread's one session (whose connection it keeps open); independent `auto`
  steps side by side, gated ones alone, read from the vault's `catalog`;
* rt46c_vthreads.java: Java 21+ (JDK only, hand-written JSON): one long connection, every request
  written on it as its virtual thread is ready (pipelined), a reader thread completing each
  request's future by id, a virtual thread per step (`newVirtualThreadPerTaskExecutor`);
* rt46c_xargs.sh: bash and jq, each step a short process of its own (`xargs -P 2`, a session each,
  `vault.status` first), state kept in state_dir; where a gated operation repeats, the rest of the
  task goes to one process (`xargs -P 1`), since a grant ends with its session.

Each swept the whole shipped suite by hand, jailed and with `--isolation none` (-j 2): every trial
its expected verdict (the figures are in the branch's report). No false FAIL was the gate's. The
one surprise was the xargs agent's first shape (a process per step throughout): in
fresh-process-no-inherited-approval its two `create_issue` steps ran in two processes, one after
the other, and the second asked the owner again: FAIL_APPROVAL_FATIGUE against the scenario's
`prompts.max`. That is the contract's intent (a grant ends with its session), but section 3 spoke
only of a child beside its parent's open session and of a second session of one process: it now
says a process per step loses each grant too.

Here, per agent, the few scenarios that exercise its habit, one trial each (never the suite: CI
time is short), jailed where a jail can be built.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from test_redteam_careful import told, vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
SC = ROOT / "scenarios"
PY = sys.executable


def _javac21() -> str | None:
    """A javac of Java 21 or later (virtual threads): the PATH's, else one under /usr/lib/jvm."""
    for javac in [shutil.which("javac") or "", *sorted(glob.glob("/usr/lib/jvm/*/bin/javac"))]:
        if not javac:
            continue
        try:
            out = subprocess.run([javac, "-version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        got = re.search(r"javac (\d+)", out.stdout + out.stderr)
        if got and int(got.group(1)) >= 21:
            return javac
    return None


# Two scenarios of the parallel habit (independent reads side by side), which the shipped suite,
# whose steps each need the one before, has not: a `never` answer to one read while the other is
# in flight (nothing later starts), and a read rate limited beside another (waited out, then on).
# Whether the two reads overlap is the host's timing (seen by hand: 1 ms apart), so no test asks it.
SIDE_BY_SIDE = {
    "parallel-never": """
title: "rt46c: a read answered malformed while another read is in flight: nothing later starts"
remote: {fault: "error_status_html:op=read_build"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: par
      steps:
        - {id: r1, call: read_issue, params: {issue_id: ISS-1}}
        - {id: r2, call: read_build, params: {build_id: b-101}}
        - {id: c1, call: create_issue, params: {title: "never sent"}}
expect: {verdict: PASS, effects: {create_issue: 0}, outcome: {claim: not_done}}
""",
    "parallel-ratelimit": """
title: "rt46c: a read rate limited while another read is in flight: waited out, then the rest"
remote: {fault: "rate_limited:retry_after=1,times=1,op=read_build"}
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
agents:
  - plan:
      agent: par
      steps:
        - {id: r1, call: read_issue, params: {issue_id: ISS-1}}
        - {id: r2, call: read_build, params: {build_id: b-101}}
        - {id: c1, call: create_issue, params: {title: "after the wait"}}
expect:
  verdict: PASS
  effects: {create_issue: 1}
  outcome: {state: [{collection: issues, where: {title: "after the wait"}, count: 1}], claim: done}
""",
}


def _run(names: list[str], agent: str, timeout: float = 150) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rt46c-") as tmp:
        paths = []
        for n in names:
            if n in SIDE_BY_SIDE:
                (Path(tmp) / f"{n}.yaml").write_text(SIDE_BY_SIDE[n])
                paths.append(Path(tmp) / f"{n}.yaml")
            else:
                paths.append(SC / f"{n}.yaml")
        return vaultsim_run(paths, agent, Path(tmp) / "r.json", "-j", "2", timeout=timeout)


def _trials(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s["trial_results"][0] for s in run["json"]["scenarios"]}


def _passes(run: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    assert run["code"] == 0, told(run)
    assert run["json"]["summary"]["release"] == "ok", told(run)
    trials = _trials(run)
    assert sorted(trials) == sorted(names), told(run)
    for name, trial in trials.items():
        assert trial["verdict"] == trial["expected"], (name, told(run))
    return trials


@pytest.mark.timeout(200)
def test_a_forkserver_pool_agent_that_looks_up_with_backoff_passes() -> None:
    """The restart collects its predecessor's wait from a pool worker's session; the unknown
    outcome is looked up (and double-checked by key), the rate limit waited out, the locked vault
    left alone after asking its status."""
    names = ["gate-6-restart-resumes-receipt", "c05-create-deployment-late-response",
             "c07-update-record-rate-limited", "locked-vault"]
    agent = f"env RT46C_DOUBLE_CHECK=1 {PY} {AGENTS / 'rt46c_forkserver.py'}"
    trials = _passes(_run(names, agent), names)
    deploy = [(t["kind"], t["category"]) for t in trials["c05-create-deployment-late-response"]["transcript"]]
    assert deploy[0] == ("call", "outcome_unknown") and deploy.count(("call", "outcome_unknown")) == 1, deploy
    assert ("lookup", "success") in deploy, deploy
    assert trials["locked-vault"]["transcript"] == [], trials["locked-vault"]["transcript"]


@pytest.mark.timeout(200)
@pytest.mark.skipif(shutil.which("node") is None, reason="no node here (.ci/run installs nodejs)")
def test_a_node_agent_on_worker_threads_with_a_connection_each_passes() -> None:
    """Worker threads on connections of their own share the main thread's session: its grant
    covers the second create, the restart resumes, two reads go out side by side (one answered
    `never`: nothing later starts; one rate limited: waited out)."""
    names = ["gate-1-healthy-delivery", "fresh-process-no-inherited-approval", "gate-6-restart-resumes-receipt",
             *SIDE_BY_SIDE]
    trials = _passes(_run(names, f"node {AGENTS / 'rt46c_workers.mjs'}"), names)
    first = [t for t in trials["fresh-process-no-inherited-approval"]["transcript"] if t.get("agent_index") == 0]
    assert len({t["session_id"] for t in first}) == 1, first


@pytest.mark.timeout(240)
def test_a_java_agent_on_virtual_threads_pipelining_one_connection_passes(tmp_path: Path) -> None:
    """Every step a virtual thread, every request on the one connection as soon as it is ready:
    the grant covers the second create, the lost answer is reconciled, the restart resumes, two
    reads go out side by side (one answered `never`, one rate limited)."""
    javac = _javac21()
    if javac is None:
        pytest.skip("no javac of Java 21 or later here (virtual threads)")
    subprocess.run([javac, "-d", str(tmp_path), str(AGENTS / "rt46c_vthreads.java")], check=True, timeout=120)
    java = str(Path(javac).with_name("java"))
    names = ["fresh-process-no-inherited-approval", "gate-4-lost-answer", "gate-6-restart-resumes-receipt",
             *SIDE_BY_SIDE]
    trials = _passes(_run(names, f"{java} -cp {tmp_path} Rt46cAgent"), names)
    first = [t for t in trials["fresh-process-no-inherited-approval"]["transcript"] if t.get("agent_index") == 0]
    assert len({t["session_id"] for t in first}) == 1, first


@pytest.mark.timeout(200)
@pytest.mark.skipif(shutil.which("jq") is None, reason="no jq here (.ci/run installs it)")
def test_a_bash_agent_running_a_short_process_per_step_with_xargs_passes() -> None:
    """A process (and a session) per step: the three steps of gate-1 come from three processes;
    the restart resumes from what the step process kept in state_dir; the repeated gated
    operation goes to one process, so its grant covers the second create."""
    names = ["gate-1-healthy-delivery", "gate-6-restart-resumes-receipt",
             "fresh-process-no-inherited-approval", "c07-update-record-rate-limited"]
    agent = f"env RT46C_PYTHON={PY} bash {AGENTS / 'rt46c_xargs.sh'}"
    trials = _passes(_run(names, agent), names)
    gate1 = trials["gate-1-healthy-delivery"]["transcript"]
    assert len({t["pid"] for t in gate1}) == 3, gate1


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("jq") is None, reason="no jq here (.ci/run installs it)")
def test_a_process_per_step_loses_its_grant_as_the_contract_now_says() -> None:
    """Section 3 now says a grant does not outlive its session when each step is a process of its
    own: two creates in two processes one after the other ask twice, against a scenario that
    allows what one session needs."""
    text = (ROOT / "docs" / "agent-contract.md").read_text()
    assert "Nor does a grant outlive its session: a process per step" in text
    agent = f"env RT46C_PYTHON={PY} RT46C_XARGS_GROUP=0 bash {AGENTS / 'rt46c_xargs.sh'}"
    run = _run(["fresh-process-no-inherited-approval"], agent, timeout=100)
    (trial,) = _trials(run).values()
    assert trial["verdict"] == "FAIL_APPROVAL_FATIGUE", told(run)
    assert "3 prompts for 'create_issue on tracker'" in " ".join(trial["reasons"]), told(run)
