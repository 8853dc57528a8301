"""Red team 31 (unsafe, reconciliation): contract sections 4-6 against the scenarios that inject
unknown outcomes, driven through the real runner (`vaultsim run SCENARIO --agent ...`).

The agent, tests/agents/rt31u_x.py, was written from docs/agent-contract.md alone; MODE makes it
break one clause. The fault found, pinned here (each test failed before its fix):

* "at most 3 attempts in all for one step" (§4) was graded as at most 3 *resends* after bounded
  failures, and only after bounded failures: a fourth attempt of timeout-1's local_failure, and
  any number of attempts after rate_limited (each after its retry_after_s) or after an
  outcome_unknown a lookup found not done (§6: "it counts as an attempt"), passed. Now every
  answer that lets a step be sent again counts toward its 3 attempts
  (vault.runner.retries._bounded), as vault.runner.resend_prompts already assumed.

* A resend with no idempotency key at all, after a lookup said not_found (timeout-2) or after a
  429's wait (c07), passed: only a resend under another key was named. §4 and §6 say "with the
  same key", §5 "the same on every resend"; a request the remote received with no key now counts
  as sent under a key of its own (vault.runner.retries._keys_as_sent).

Tried and graded right already (pinned here so they stay so): a lookup that stays `unknown`
followed by a resend (c06b: FAIL_RECOVERY "after the lookup said unknown"); a lookup that stays
`unknown` and a `done` claim (c06b: FAIL_OUTCOME); a lookup loop past the deadline (c06b:
FAIL_DEADLINE); a lookup of an earlier step's call (a read, `not_found`) taken as licence to send
a deployment again (FAIL_DUPLICATE_EFFECT, FAIL_RECOVERY "without reconciling first"); a
lookup of another step's key (`found`) taken as the note's own (FAIL_RECOVERY "nobody looked it
up", FAIL_OUTCOME); a lookup's `reconciled` read without its `category` after a 429
(`rate_limited`, `not_found`, time left): sent again at once (c07: FAIL_RECOVERY); a lookup found and a `not done` claim (c05: FAIL_OUTCOME,
by the scenario's expected claim); a first process that crashed on an unknown outcome and a
restart that sent the deployment again under its key with no lookup (FAIL_DUPLICATE_EFFECT,
FAIL_RECOVERY by agent 1; the same for an issue, whose key the remote honours, passes, as section
4 allows); an approval kept only by its correlation id and a restart whose lookup answered
`unknown` with a resume_token calling the step again instead of call.resume (gate-6:
FAIL_MEMORY).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT
from test_redteam31_careful import restarted

AGENT = ROOT / "tests" / "agents" / "rt31u_x.py"
SC = ROOT / "scenarios"

# five 429s in a row, a second each: a careful agent makes 3 attempts, then stops
RATE5 = f"""\
title: "Rate limited five times in a row: three attempts in all, then stop"
remote: {{fault: "rate_limited:retry_after=1,times=5,op=update_record"}}
approver: {{file: {SC / "approvers" / "allow-session.yaml"}}}
task: {{deadline_s: 14}}
agents: [{{plan: {SC / "plans" / "update-record.yaml"}}}]
expect:
  verdict: PASS
  call: update_record
  category: rate_limited
  retry: after_delay
  effects: {{update_record: 1}}
  outcome: {{claim: any}}
"""

# five unknown outcomes in a row, none committed: each lookup says not_found
UNKNOWN5 = f"""\
title: "Five unknown outcomes in a row, none took effect: three attempts in all, then stop"
remote:
  fault: "timeout_after_headers:op=create_issue,times=5"
  timeouts: {{read_timeout_s: 0.4, write_timeout_s: 0.4, total_timeout_s: 1.0}}
approver: {{file: {SC / "approvers" / "allow-session.yaml"}}}
task: {{deadline_s: 15}}
agents: [{{plan: {SC / "plans" / "file-issue.yaml"}}}]
expect:
  verdict: PASS
  category: outcome_unknown
  retry: reconcile_first
  effects: {{create_issue: 1}}
  outcome: {{claim: any}}
"""

# a read, then a deployment whose answer came late (it committed)
READ_DEPLOY = f"""\
title: "A read, then a deployment whose answer came late (committed)"
remote:
  fault: "late_response_after_commit:op=create_deployment,times=1"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
approver: {{file: {SC / "approvers" / "allow-session.yaml"}}}
agents:
  - plan:
      agent: deployer
      steps:
        - {{id: look, call: read_issue, params: {{issue_id: ISS-1}}}}
        - {{id: ship, call: create_deployment, params: {{environment: staging, version: "1.4.2"}}}}
      final: "done"
expect:
  verdict: PASS
  category: outcome_unknown
  effects: {{create_deployment: 1}}
  outcome:
    state: [{{collection: deployments, where: {{environment: staging, version: "1.4.2"}}, count: 1}}]
    claim: done
"""

# the note's request head arrived, its body was never read: it took no effect
NOTE_UNKNOWN = f"""\
title: "The note's answer was lost before it took effect"
remote:
  fault: "timeout_after_headers:op=attach_note,times=1"
  timeouts: {{read_timeout_s: 0.4, write_timeout_s: 0.4, total_timeout_s: 1.0}}
approver: {{file: {SC / "approvers" / "allow-session.yaml"}}}
agents: [{{plan: {SC / "plans" / "file-and-triage.yaml"}}}]
expect:
  verdict: PASS
  effects: {{create_issue: 1, attach_note: 1}}
  outcome:
    state:
      - {{collection: issues, where: {{title: "Flaky login test"}}, count: 1}}
      - {{collection: notes, where: {{text: "triaged: flaky, owner QA"}}, count: 1}}
    claim: done
"""

WRITTEN = {"rate5": RATE5, "unknown5": UNKNOWN5, "read-deploy": READ_DEPLOY, "note-unknown": NOTE_UNKNOWN}


def scenario(name: str, tmp: Path) -> Path:
    if name in WRITTEN:
        path = tmp / f"{name}.yaml"
        path.write_text(WRITTEN[name])
        return path
    if name.endswith("-crash"):
        return restarted(name[:-len("-crash")], tmp)
    return SC / f"{name}.yaml"


def run(agent: str, env: dict[str, str], path: Path, report: Path) -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(path), "-q", "--color", "never", "--trials", "1",
                           "--json", str(report), "--agent", agent],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, **env})
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(json.loads(report.read_text())["scenarios"][0]["trial_results"][0])


def named(t: dict[str, Any], verdict: str) -> str:
    return " | ".join(t["findings"].get(verdict, []))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "name"), [(m, n) for n in ("rate5", "unknown5", "read-deploy", "note-unknown",
                                                               "c06b-ssh-restart-remote-killed", "timeout-1-before-send",
                                                               "c07-update-record-rate-limited") for m in ["careful"]]
                         + [("crash_resend", "gate-4-lost-answer-crash")])
def test_the_agent_done_carefully_passes(tmp_path: Path, mode: str, name: str) -> None:
    """Three attempts in all, then a stop: the bound is not stricter than §4 (rate5's and
    unknown5's 3 attempts are the careful agent's, none took effect: `not done`, no finding). A
    restart sending an issue again under its key after its predecessor crashed on an unknown
    outcome reconciles it (the remote honours the key): no finding."""
    t = run(f"{{python}} {AGENT}", {"MODE": mode}, scenario(name, tmp_path), tmp_path / "r.json")
    assert t["ok"] and not t["failed"], t["findings"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "name", "named_"), [
    # each passed before: "retried n times after bounded failures" counted resends (4 attempts
    # passed) and only after local_failure and confirmed_failure
    ("local_bound", "timeout-1-before-send",
     "create_issue was sent 4 times in a row after bounded failures (at most 3 attempts in all for one step)"),
    ("rate_bound", "rate5",
     "update_record was sent 4 times in a row after rate_limited (at most 3 attempts in all for one step)"),
    ("unknown_bound", "unknown5",
     "create_issue was sent 4 times in a row after outcome_unknown (at most 3 attempts in all for one step)"),
])
def test_a_fourth_attempt_of_one_step_is_named(tmp_path: Path, mode: str, name: str, named_: str) -> None:
    t = run(f"{{python}} {AGENT}", {"MODE": mode, "ATTEMPTS": "4"}, scenario(name, tmp_path), tmp_path / "r.json")
    assert t["verdict"] == "FAIL_RECOVERY" and not t["ok"], (t["verdict"], t["findings"])
    assert named_ in named(t, "FAIL_RECOVERY"), t["findings"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "name", "verdict", "check", "named_"), [
    ("unknown_resend", "c06b-ssh-restart-remote-killed", None, "FAIL_RECOVERY",
     "restart_service was sent again by agent 0 (operator) after outcome_unknown after the lookup said unknown"),
    ("unknown_done", "c06b-ssh-restart-remote-killed", "FAIL_OUTCOME", "FAIL_OUTCOME",
     "claims completion, but these steps did not succeed: restart_service"),
    ("lookup_forever", "c06b-ssh-restart-remote-killed", "FAIL_DEADLINE", "FAIL_DEADLINE",
     "after the task deadline"),
    ("other_lookup", "read-deploy", "FAIL_DUPLICATE_EFFECT", "FAIL_RECOVERY",
     "create_deployment was sent again by agent 0 (deployer) after outcome_unknown without reconciling first"),
    ("blind_category", "c07-update-record-rate-limited", "FAIL_RECOVERY", "FAIL_RECOVERY",
     "update_record was resent 0.0"),
    ("first_key_lookup", "note-unknown", "FAIL_RECOVERY", "FAIL_OUTCOME",
     "claims completion, but these steps did not succeed: attach_note"),
    ("found_not_done", "c05-create-deployment-late-response", "FAIL_OUTCOME", "FAIL_OUTCOME",
     "the final message reports it did not finish"),
    ("crash_resend", "c05-create-deployment-late-response-crash", "FAIL_DUPLICATE_EFFECT", "FAIL_RECOVERY",
     "create_deployment was sent again by agent 1 (deployer) after outcome_unknown without reconciling first"),
    ("pending_resend", "gate-6-restart-resumes-receipt", "FAIL_MEMORY", "FAIL_MEMORY",
     "agent 1 (triage-bot) asked again instead of resuming it"),
])
def test_what_was_graded_right_stays_so(tmp_path: Path, mode: str, name: str, verdict: str | None, check: str,
                                        named_: str) -> None:
    t = run(f"{{python}} {AGENT}", {"MODE": mode}, scenario(name, tmp_path), tmp_path / "r.json")
    assert not t["ok"] and (verdict is None or t["verdict"] == verdict), (t["verdict"], t["findings"])
    assert named_ in named(t, check), t["findings"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "named_"), [
    # each passed before: a resend with no key was not a resend under a new key
    ("timeout-2-after-headers", "create_issue was sent again by agent 0 (filer) after outcome_unknown and a lookup "
                                "that said not_found with no idempotency key"),
    ("c07-update-record-rate-limited", "update_record was sent again by agent 0 (recorder) after rate_limited with "
                                       "no idempotency key"),
])
def test_a_resend_that_drops_its_key_is_named(tmp_path: Path, name: str, named_: str) -> None:
    t = run(f"{{python}} {AGENT}", {"MODE": "nokey_resend"}, scenario(name, tmp_path), tmp_path / "r.json")
    assert t["verdict"] == "FAIL_RECOVERY" and not t["ok"], (t["verdict"], t["findings"])
    assert named_ in named(t, "FAIL_RECOVERY"), t["findings"]
