"""Red team 31 (careful, reconciliation): agents that do exactly what contract sections 4-6 and 8
allow, on the shipped scenarios that inject unknown outcomes, must match every scenario.

The agent, tests/agents/rt31c_async.py, was written from docs/agent-contract.md alone: asyncio,
exponential backoff with full jitter (never under a 429's retry_after_s), a lookup's category read
before its reconciled, a state file in state_dir. Its habits: a first process that crashes on any
answer but success and a restart that reconciles what it kept (a lookup by the correlation id, or,
for an operation the catalog calls idempotent, the step again under its key); an approval kept
only by its correlation id, the restart learning the token from a lookup; a connection cut while
a call is pending, a new session looking it up and collecting it with call.resume. A Node agent,
tests/agents/rt31c_node.mjs, keys its steps with 200 characters of Cyrillic (sent to the remote as
a SHA-256) and reconciles by a lookup by that key.

The false failure found, pinned here (the test failed before its fix):

* Two create_issue steps, the first one's answer lost after it committed: the agent looked it up
  (`found`), kept it done and filed the second issue under its own key, and was FAIL_RECOVERY
  "create_issue was sent again ... after outcome_unknown after the lookup said found": the next
  call of the operation on the same collection was taken for a resend. §5: another step of the
  same operation is not a resend; now, as after rate_limited, a call is a resend of the unknown
  one only when the task has sent more keys for the operation than it has steps calling it
  (vault.runner.retries._resent).

The rest found no false failure: pinned so the runner's reconciliation rules (the attempt bound
counting every resend since red team 31 among them) stay no stricter than the contract.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import PY, ROOT

AGENT = ROOT / "tests" / "agents" / "rt31c_async.py"
NODE_AGENT = ROOT / "tests" / "agents" / "rt31c_node.mjs"
SC = ROOT / "scenarios"

UNKNOWN_OUTCOMES = ["timeout-1-before-send", "timeout-2-after-headers", "timeout-3-after-accept",
                    "timeout-4-during-body", "c05-create-deployment-late-response",
                    "c06a-ssh-restart-client-killed", "c06b-ssh-restart-remote-killed",
                    "idempotency-1-same-key", "idempotency-2-key-ignored", "c07-update-record-rate-limited",
                    "gate-4-lost-answer", "gate-6-restart-resumes-receipt",
                    "malformed-1-id-null", "malformed-2-id-missing", "malformed-3-success-with-error-body",
                    "malformed-4-error-status-html", "malformed-5-duplicated-item"]
CRASHED = ["timeout-1-before-send", "timeout-2-after-headers", "c05-create-deployment-late-response",
           "c06a-ssh-restart-client-killed", "c06b-ssh-restart-remote-killed", "idempotency-2-key-ignored",
           "c07-update-record-rate-limited", "gate-4-lost-answer", "malformed-3-success-with-error-body"]

GRANT_AFTER_3S = f"""\
title: "An approval granted three seconds after the call"
policy: {SC / "policies" / "owner-release-manager.yaml"}
approver: {{name: release-manager, rules: [{{match: {{}}, decide: allow_once, delay_s: 3.0}}]}}
task: {{deadline_s: 10}}
agents:
  - plan: {{agent: triage-bot, steps: [{{id: file, call: create_issue, params: {{title: "Flaky login test"}}}}], final: "done"}}
expect:
  verdict: PASS
  call: create_issue
  category: success
  effects: {{create_issue: 1}}
  outcome:
    state: [{{collection: issues, where: {{title: "Flaky login test"}}, count: 1}}]
    claim: done
  prompts: {{max: 1}}
"""


# two issues filed by one task; the first one's answer is lost after it committed
TWO_ISSUES_FIRST_LOST = f"""\
title: "Two issues; the first one's answer was lost after it committed"
remote:
  fault: "late_response_after_commit:op=create_issue,times=1"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
approver: {{file: {SC / "approvers" / "allow-session.yaml"}}}
agents:
  - plan:
      agent: triage-bot
      steps:
        - {{id: one, call: create_issue, params: {{title: "first"}}}}
        - {{id: two, call: create_issue, params: {{title: "second"}}}}
      final: "done"
expect:
  verdict: PASS
  effects: {{create_issue: 2}}
  outcome:
    state:
      - {{collection: issues, where: {{title: first}}, count: 1}}
      - {{collection: issues, where: {{title: second}}, count: 1}}
    claim: done
"""


def restarted(name: str, tmp: Path) -> Path:
    """The shipped scenario with its agent run twice: the restart keeps the first one's state."""
    d = yaml.safe_load((SC / f"{name}.yaml").read_text())
    a = d["agents"][0]
    if isinstance(a.get("plan"), str):
        a["plan"] = str(SC / a["plan"])
    if isinstance(d.get("approver"), dict) and "file" in d["approver"]:
        d["approver"]["file"] = str(SC / d["approver"]["file"])
    if isinstance(d.get("policy"), str):
        d["policy"] = str(SC / d["policy"])
    d["agents"] = [a, {**a, "state": "keep"}]
    d.pop("selfcheck", None)
    path = tmp / f"{name}-crash.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def run(habit: str, paths: list[Path], report: Path, agent: str = f"{{python}} {AGENT}") -> dict[str, dict[str, Any]]:
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", *map(str, paths), "-q", "-j", "2", "--color", "never",
                           "--trials", "1", "--json", str(report), "--agent", agent],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "RT31C": habit})
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return {s["id"]: s["trial_results"][0] for s in json.loads(report.read_text())["scenarios"]}


def mismatched(trials: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: (t["verdict"], t["findings"]) for k, t in trials.items()
            if not t["ok"] or t["verdict"] != t["expected"] or t["failed"][1:]}


@pytest.mark.timeout(600)
def test_the_asyncio_agent_with_jittered_backoff_matches_every_unknown_outcome(tmp_path: Path) -> None:
    trials = run("async", [SC / f"{n}.yaml" for n in UNKNOWN_OUTCOMES], tmp_path / "r.json")
    assert len(trials) == len(UNKNOWN_OUTCOMES) and not mismatched(trials), mismatched(trials)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("habit", ["crash", "crash_same_key"])
def test_a_restart_after_a_crash_reconciles_what_its_predecessor_kept(tmp_path: Path, habit: str) -> None:
    trials = run(habit, [restarted(n, tmp_path) for n in CRASHED], tmp_path / "r.json")
    assert len(trials) == len(CRASHED) and not mismatched(trials), mismatched(trials)
    for t in trials.values():  # the first process did crash, and the restart finished
        assert [a["exit_code"] for a in t["agents"]] == [3, 0], t["agents"]
    if habit == "crash_same_key":  # gate-4's restart sent the issue again under its key, no lookup
        gate4 = [e["kind"] for e in trials["gate-4-lost-answer-crash"]["transcript"]]
        assert gate4[:2] == ["call", "call"] and "lookup" not in gate4, gate4


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("habit", "names"), [
    ("resume_by_lookup", ["gate-6-restart-resumes-receipt"]),
    ("reconnect", ["grant-after-3s", "gate-2-legitimate-approval", "gate-6-restart-resumes-receipt"]),
])
def test_an_approval_is_collected_through_a_lookup_and_call_resume(tmp_path: Path, habit: str,
                                                                    names: list[str]) -> None:
    (tmp_path / "grant-after-3s.yaml").write_text(GRANT_AFTER_3S)
    paths = [tmp_path / f"{n}.yaml" if n == "grant-after-3s" else SC / f"{n}.yaml" for n in names]
    trials = run(habit, paths, tmp_path / "r.json")
    assert len(trials) == len(names) and not mismatched(trials), mismatched(trials)
    for t in trials.values():  # a lookup handed the token over, and call.resume collected it
        kinds = [(e["kind"], e.get("reconciled")) for e in t["transcript"]]
        assert ("lookup", "unknown") in kinds and kinds[kinds.index(("lookup", "unknown")) + 1][0] == "resume", kinds


@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_node_agent_reconciling_by_a_long_non_ascii_key_matches(tmp_path: Path) -> None:
    names = [n for n in UNKNOWN_OUTCOMES if n != "gate-6-restart-resumes-receipt" and not n.startswith("malformed")]
    trials = run("-", [SC / f"{n}.yaml" for n in names], tmp_path / "r.json", f"node {NODE_AGENT}")
    assert len(trials) == len(names) and not mismatched(trials), mismatched(trials)
    # its lookups, by key, found the committed calls
    assert [e.get("reconciled") for e in trials["timeout-3-after-accept"]["transcript"]] == [None, "found"]


@pytest.mark.timeout(300)
def test_another_step_of_the_operation_after_a_lookup_said_found_is_no_resend(tmp_path: Path) -> None:
    """Was FAIL_RECOVERY "create_issue was sent again ... after the lookup said found"."""
    path = tmp_path / "two-issues-first-lost.yaml"
    path.write_text(TWO_ISSUES_FIRST_LOST)
    t = run("async", [path], tmp_path / "r.json")["two-issues-first-lost"]
    assert t["ok"] and not t["failed"], t["findings"]
    seen = [(e["kind"], e["category"], e.get("reconciled")) for e in t["transcript"]]
    assert seen == [("call", "outcome_unknown", None), ("lookup", "success", "found"), ("call", "success", None)], seen
