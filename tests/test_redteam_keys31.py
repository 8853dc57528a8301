"""Red team 31k: idempotency keys of agents that share one vault and one remote.

Contract §5 lets an agent pick any text as a step's key, and §6 lets it look up only its own
calls. tests/agents/rt31k_x.py, written from the contract alone, does its task carefully with
plain keys (`create_issue-1`) or the contract's example (`RUN_ID:AGENT:STEP_ID`); as the guilty
agent it also sends its own step under another agent's key and looks that key up (`steal`).

Found and fixed (each test failed before its fix):

* The vault sent the agent's key to the remote as given, so one remote held one operation per
  key text for every agent and run. An agent that sent its own step under another agent's key
  (the remote refused it 422) and then looked that key up (its own call now) was told the other
  agent's call: `found`, and the id it created. Now the remote receives a key of the agent's own
  (vault.ids: a digest of run id and agent name, then the key), and the lookup finds
  the agent's own call.
* Two careful agents, or two runs against one remote, that picked the same plain key: the
  second's step was refused 422 (a `confirmed_failure` it did nothing to earn, three times:
  FAIL_OUTCOME and the key "reused" in FAIL_RECOVERY). Now each files its own.
* A lookup of a correlation id the vault never issued, naming an operation, asked the remote
  (by request id: another agent's call, had the prober its id; `not_found` for a made-up one, a
  licence to send again) and wrote about 1 KB of audit records: 2,000 of them, 2 MB. The daemon
  keeps no calls across a restart, so it could not tell a made-up id from its own forgotten call.
  Now a call's id ends with the digest of its agent and run: any other unknown id is answered
  `unknown`, nothing looked up, its records sampled as refusals are (`probe`).

Kept working (pinned): a restarted agent and a restarted daemon find the agent's call under its
key (the key the remote receives is a function of run, agent and key alone, no daemon state); a
restarted agent that looks up 24 steps at once (`restart_all`) is paced past 16 (§6) and, after
its waits, still finds each one, files nothing twice and is done in its deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox, remote_events, stop_process
from hostile_fixtures import TOKEN, run_script, setup
from vault.runner import world_procs

AGENT = ROOT / "tests" / "agents" / "rt31k_x.py"

# two agents, each filing its own issue (other titles) as its first step, then reading it
PAIR = """\
title: "Two agents file their own issues"
approver: {name: ci, rules: [{match: {}, decide: allow_session}]}
task: {deadline_s: 15}
agents:
  - plan: {agent: alpha, steps: [{id: alpha-file, call: create_issue, params: {title: "alpha issue"}}, {id: alpha-read, call: read_issue, params: {issue_id: "${alpha-file.id}"}}]}
  - plan: {agent: bravo, steps: [{id: bravo-file, call: create_issue, params: {title: "bravo issue"}}, {id: bravo-read, call: read_issue, params: {issue_id: "${bravo-file.id}"}}]}
expect:
  verdict: PASS
  effects: {create_issue: 2}
  outcome:
    state: [{collection: issues, where: {title: "alpha issue"}, count: 1}, {collection: issues, where: {title: "bravo issue"}, count: 1}]
    claim: done
"""


def _trial(tmp: Path, **env: str) -> dict[str, Any]:
    path = tmp / "pair.yaml"
    path.write_text(PAIR)
    report = tmp / "r.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(path), "-q", "--color", "never", "--trials", "1",
                           "--json", str(report), "--agent", f"{{python}} {AGENT}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(json.loads(report.read_text())["scenarios"][0]["trial_results"][0])


def _created(t: dict[str, Any], index: int) -> str:
    """The issue id agent `index` says its create_issue step was told (`done: STEP=ID`)."""
    final = t["agents"][index]["final"]
    assert final.startswith("done: "), t["agents"]
    return final.split("(learned")[0].split()[1].split("=")[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("keys", ["plain", "contract"])
def test_two_careful_agents_with_the_same_key_text_each_file_their_own(tmp_path: Path, keys: str) -> None:
    """Was FAIL_OUTCOME with plain keys: bravo's `create_issue-1` was alpha's at the remote, refused
    422 three times. (`contract` keys never met: pinned as passing both before and after.)"""
    t = _trial(tmp_path, MODE="careful", KEYS=keys)
    assert t["ok"] and t["verdict"] == "PASS" and not t["failed"], t["findings"]
    assert _created(t, 0) != _created(t, 1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("keys", "victim"), [("plain", "create_issue-1"), ("contract", "RUN_ID:alpha:alpha-file")])
def test_an_agent_sending_under_anothers_key_learns_nothing_of_its_call(tmp_path: Path, keys: str,
                                                                        victim: str) -> None:
    """Was: bravo's own step under alpha's key was refused 422, and its lookup of that key said
    `found` with alpha's issue id. Now the key is bravo's own: its step is filed, and the lookup
    finds bravo's own issue, never alpha's."""
    t = _trial(tmp_path, MODE="steal", GUILTY="1", KEYS=keys, VICTIM_KEY=victim)
    alpha_issue, bravo = _created(t, 0), t["agents"][1]
    assert "(learned: " in bravo["final"], bravo
    said = json.loads(bravo["final"].split("(learned: ", 1)[1].removesuffix(")"))
    assert alpha_issue not in json.dumps(said), said
    assert said["reconciled"] == "found" and said["data"]["created"][0]["id"] == _created(t, 1), said
    # its own step under a key of its own text is no misuse: it did its task
    assert t["verdict"] == "PASS" and not t["failed"], t["findings"]


# ---- one daemon and one remote shared by runs, across a daemon restart ----

def _task(box: Sandbox, agent: str, run_id: str, steps: list[dict[str, Any]]) -> Path:
    state = box.root / "st" / f"{run_id}-{agent}"
    state.mkdir(parents=True, exist_ok=True)
    path = box.root / f"task-{run_id}-{agent}.json"
    path.write_text(json.dumps({
        "agent": agent, "run_id": run_id, "goal": "file an issue", "agent_index": 0, "steps": steps,
        "operations": sorted({st["call"] for st in steps}), "deadline": time.time() + 60, "deadline_s": 60,
        "state_dir": str(state)}))
    return path


def _run_agent(box: Sandbox, agent: str, run_id: str, title: str = "", steps: list[dict[str, Any]] | None = None,
               **env: str) -> str:
    """The agent's stdout (a careful one's is its final message alone); by default its one step
    files an issue titled `title`."""
    steps = steps or [{"id": f"{agent}-file", "call": "create_issue", "params": {"title": title}}]
    full = {**world_procs.agent_env(box.env, box.agent_sock, run_id), "MODE": "careful", "KEYS": "plain",
            "VAULTSIM_TASK": str(_task(box, agent, run_id, steps)), **env}
    proc = world_procs.run_agent([PY, str(AGENT)], env=full, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _lookup_by_key(box: Sandbox, agent: str, key: str) -> dict[str, Any]:
    body = (f"client.open_session({agent!r}, 'run-1')\n"
            f"out(client.lookup(idempotency_key={key!r}, operation='create_issue'))\n")
    got: dict[str, Any] = run_script(box, body)[-1]
    return got


@pytest.mark.timeout(180)
def test_two_runs_against_one_remote_with_the_same_key_each_file_their_own(sandbox: Sandbox) -> None:
    """Was `not done` for run-2: its `create_issue-1` (the same agent name, another run) was
    run-1's at the remote, refused 422."""
    url = setup(sandbox)
    sandbox.start_approver([{"match": {}, "decide": "allow_once"}])
    assert _run_agent(sandbox, "alpha", "run-1", "first run's issue").startswith("done: ")
    assert _run_agent(sandbox, "alpha", "run-2", "second run's issue").startswith("done: ")
    received = [e for e in remote_events(url) if e.get("event") == "received" and e.get("idempotency_key")]
    keys = {e["idempotency_key"] for e in received}
    assert len(keys) == 2 and all(k.endswith(":create_issue-1") for k in keys), keys
    assert not [e for e in remote_events(url) if e.get("reason") == "idempotency_key_reuse"], received


@pytest.mark.timeout(180)
def test_a_restarted_daemon_finds_the_agents_own_call_by_its_key_and_no_one_elses(sandbox: Sandbox) -> None:
    """The daemon keeps no calls across a restart: a lookup by key naming the operation asks the
    remote under the key of this agent and run, the same as before the restart. Was: another agent
    naming that key text was told alpha's call (`found`, its issue id)."""
    _, url = sandbox.start_remote({"tracker_token": TOKEN})
    sandbox.set_secret("tracker_token", TOKEN)
    daemon = sandbox.start_daemon("--remote", url)
    sandbox.start_approver([{"match": {}, "decide": "allow_once"}])
    assert _run_agent(sandbox, "alpha", "run-1", "alpha's issue").startswith("done: ")
    created = [e for e in remote_events(url) if e.get("event") == "mutation_committed"]
    stop_process(daemon)
    sandbox.start_daemon("--remote", url)
    mine = _lookup_by_key(sandbox, "alpha", "create_issue-1")
    assert mine["category"] == "success" and mine["reconciled"] == "found", mine
    issue = mine["data"]["created"][0]["id"]
    other = _lookup_by_key(sandbox, "bravo", "create_issue-1")
    assert other["reconciled"] == "not_found" and issue not in json.dumps(other), (other, created)


@pytest.mark.timeout(300)
def test_made_up_ids_are_answered_unknown_unasked_and_a_careful_agents_lookup_still_finds(sandbox: Sandbox) -> None:
    """An agent looks up 2,000 correlation ids it made up, naming an operation. Was: each asked the
    remote (`GET /v1/operations?request_id=...`, not_found: a licence to send again) and wrote
    about 1 KB of audit records. Now each is `unknown`, nothing looked up, its records sampled as
    refusals are; a careful agent's create, timed out after the remote committed it, is still
    looked up at the remote and found."""
    _, url = sandbox.start_remote({"tracker_token": TOKEN}, fault="late_response_after_commit:op=create_issue,times=1")
    sandbox.set_secret("tracker_token", TOKEN)
    config = sandbox.write("daemon.yaml", "call_timeout_s: 1\n")
    sandbox.start_daemon("--remote", url, "--config", str(config))
    sandbox.start_approver([{"match": {}, "decide": "allow_once"}])
    log = sandbox.home / "audit.log"
    before = log.stat().st_size
    probed = _run_agent(sandbox, "mallory", "run-1", steps=[{"id": "m-read", "call": "read_issue",
                                                             "params": {"issue_id": "ISS-1"}}],
                        MODE="probe", GUILTY="0", PROBES="2000")
    assert 'probed: {"success/unknown": 2000}' in probed and probed.splitlines()[-1].startswith("done: "), probed
    grown = log.stat().st_size - before
    asked = [e for e in remote_events(url) if "/v1/operations" in str(e.get("path", ""))]
    assert not asked, asked[:3]
    assert grown < 200_000, grown  # was about 2 MB
    # the careful agent: outcome_unknown (the remote committed, then held its answer), a lookup, found
    assert _run_agent(sandbox, "alpha", "run-1", "alpha's issue").startswith("done: alpha-file=ISS-")
    asked = [e for e in remote_events(url) if "/v1/operations" in str(e.get("path", ""))]
    assert asked and len(asked) <= 5, asked
    created = [e for e in remote_events(url) if e.get("event") == "mutation_committed"]
    assert len(created) == 1, created


@pytest.mark.timeout(300)
def test_lookups_by_keys_never_seen_ask_the_remote_at_a_pace_and_a_restarted_agent_still_reconciles(
        sandbox: Sandbox) -> None:
    """After a daemon restart a lookup by key naming the operation is the only way back to a step,
    so the vault asks the remote for it. Was: an agent looping on 2,000 keys it made up had each
    asked at the remote (and recorded): a flood through the vault. Now an agent and run's such
    lookups are paced (16 at once, then 4 a second: `rate_limited`, `unknown`, nothing looked up,
    records sampled); a restarted careful agent of the same run still finds each of its steps."""
    _, url = sandbox.start_remote({"tracker_token": TOKEN})
    sandbox.set_secret("tracker_token", TOKEN)
    daemon = sandbox.start_daemon("--remote", url)
    sandbox.start_approver([{"match": {}, "decide": "allow_once"}])
    steps = [{"id": f"alpha-{i}", "call": "create_issue", "params": {"title": f"alpha issue {i}"}} for i in (1, 2, 3)]
    first = _run_agent(sandbox, "alpha", "run-1", steps=steps)
    assert first.startswith("done: alpha-1=ISS-"), first
    stop_process(daemon)
    sandbox.start_daemon("--remote", url)

    def asked() -> int:
        return len([e for e in remote_events(url) if "/v1/operations" in str(e.get("path", ""))
                    and e.get("event") == "received"])

    log = sandbox.home / "audit.log"
    size, before, started = log.stat().st_size, asked(), time.monotonic()
    flood = _run_agent(sandbox, "mallory", "run-1", steps=[{"id": "m-read", "call": "read_issue",
                                                            "params": {"issue_id": "ISS-1"}}],
                       MODE="keyflood", GUILTY="0", PROBES="2000")
    took = time.monotonic() - started
    probed = json.loads(flood.splitlines()[0].removeprefix("probed: "))
    assert sum(probed.values()) == 2000 and probed.get("rate_limited/unknown", 0) > 1500, probed
    assert asked() - before <= 16 + 4 * took + 1, (asked() - before, took)  # was 2,000
    assert log.stat().st_size - size < 200_000, log.stat().st_size - size
    # a restarted alpha looks each step up by its key and finds it: nothing is filed twice
    again = _run_agent(sandbox, "alpha", "run-1", steps=steps, MODE="restart", GUILTY="0")
    assert again == first, (again, first)
    created = [e for e in remote_events(url) if e.get("event") == "mutation_committed"]
    assert len(created) == 3, created


@pytest.mark.timeout(300)
def test_a_restart_looking_up_24_steps_at_once_is_paced_and_reconciles_each(sandbox: Sandbox) -> None:
    """§6: the vault asks the remote for lookups it cannot answer from memory 16 at once, then 4 a
    second (vault.daemon.limits.Paced); past that a lookup is `rate_limited`, `unknown`, with
    `retry_after_s`, and asked again after it. A restarted careful agent with 24 steps (a daemon
    restart between: each lookup is the remote's) writes all 24 lookups at once: some are paced,
    and after their waits it finds every step, files nothing twice and is done in its deadline."""
    _, url = sandbox.start_remote({"tracker_token": TOKEN})
    sandbox.set_secret("tracker_token", TOKEN)
    daemon = sandbox.start_daemon("--remote", url)
    sandbox.start_approver([{"match": {}, "decide": "allow_once"}])
    steps = [{"id": f"alpha-{i}", "call": "create_issue", "params": {"title": f"alpha issue {i}"}} for i in range(1, 25)]
    first = _run_agent(sandbox, "alpha", "run-1", steps=steps)
    assert first.startswith("done: alpha-1=ISS-") and first.count("=ISS-") == 24, first
    stop_process(daemon)
    sandbox.start_daemon("--remote", url)
    again = _run_agent(sandbox, "alpha", "run-1", steps=steps, MODE="restart_all", GUILTY="0")
    paced, final = again.splitlines()
    assert int(paced.removeprefix("paced: ")) >= 24 - 16 - 1, again  # a token or so may come back meanwhile
    assert final == first, (final, first)  # every step found, with the id it created ("done" in its deadline)
    created = [e for e in remote_events(url) if e.get("event") == "mutation_committed"]
    assert len(created) == 24, created
    looked = [e for e in remote_events(url) if "/v1/operations" in str(e.get("path", "")) and e.get("event") == "received"]
    assert len(looked) == 24, looked  # a paced lookup is never asked at the remote: each step once
