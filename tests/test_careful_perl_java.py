"""Careful agents in Perl and Java pass the scenarios that exercise each rule of the contract.

tests/agents/rt24l_perl.pl is written from docs/agent-contract.md alone, with Perl's core modules
only (JSON::PP, IO::Socket::UNIX): blocking waits within its deadline, its state renamed into place
in state_dir, a lookup after outcome_unknown, a stop at every `never` answer, and final messages
`DONE:`, `NOT DONE:` and `WAITING:`. Red team 24 ran it over the whole suite in the jail and
without one (42 of 42 as expected each way); this test keeps one scenario per rule it follows.

tests/agents/rt24l_java/Agent.java is the same in Java 17 with the JDK alone (`java Agent.java`
compiles it at each start, a second or more: a slow-starting runtime), non-blocking (wait_s of a
second, then call.resume while time is left), with a JSON object as its final message. 42 of 42
as expected in the jail and without one; here the scenarios where start-up time and waits meet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT

AGENT = ROOT / "tests" / "agents" / "rt24l_perl.pl"
JAVA = ROOT / "tests" / "agents" / "rt24l_java" / "Agent.java"
RULES = [  # one scenario per rule of the contract the agent must follow
    "gate-1-healthy-delivery",  # steps in order, `${id.field}` from results, DONE
    "gate-2-legitimate-approval",  # a wait for a person within its deadline
    "gate-8-deadline",  # WAITING with the token saved when the deadline comes first
    "timeout-3-after-accept",  # outcome_unknown: a lookup before anything else
    "c07-update-record-rate-limited",  # retry_after_s, the same key
    "locked-vault",  # vault.status until unlocked
    "c03-delete-release-denied",  # a `never` answer stops the task
    "malformed-1-id-null",  # a broken answer is used for nothing
]


@pytest.mark.skipif(shutil.which("perl") is None, reason="no perl here")
@pytest.mark.timeout(300)
def test_a_careful_perl_agent_passes(tmp_path: Path) -> None:
    trials = _run(RULES, f"perl {AGENT}", tmp_path)
    finals = {sid: t["agents"][0]["final"].split(":")[0] for sid, t in trials.items()}
    assert finals["gate-1-healthy-delivery"] == "DONE" and finals["gate-8-deadline"] == "WAITING"
    assert finals["c03-delete-release-denied"] == "NOT DONE"


@pytest.mark.skipif(shutil.which("java") is None, reason="no java here")
@pytest.mark.timeout(300)
def test_a_careful_java_agent_passes(tmp_path: Path) -> None:
    scenarios = ["gate-6-restart-resumes-receipt", "gate-2-legitimate-approval", "timeout-3-after-accept"]
    trials = _run(scenarios, f"java {JAVA}", tmp_path)
    restart = [json.loads(a["final"])["status"] for a in trials["gate-6-restart-resumes-receipt"]["agents"]]
    assert restart == ["waiting", "done"]  # the first hands its wait over; the second collects it


@pytest.mark.skipif(shutil.which("perl") is None, reason="no perl here")
@pytest.mark.timeout(300)
def test_a_careful_agent_that_looks_each_step_up_before_sending_it_passes(tmp_path: Path) -> None:
    """LOOKUP_FIRST=1: a lookup by the step's idempotency key before its first call (§6: a lookup
    is always allowed); a step found done is not sent again, as after a restart."""
    scenarios = ["gate-1-healthy-delivery", "gate-6-restart-resumes-receipt", "idempotency-1-same-key",
                 "timeout-3-after-accept"]
    trials = _run(scenarios, f"perl {AGENT}", tmp_path, {"LOOKUP_FIRST": "1"})
    kinds = [e["kind"] for e in trials["gate-1-healthy-delivery"]["transcript"]]
    assert kinds[0] == "lookup" and "call" in kinds  # it did look first


def _run(scenarios: list[str], agent: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each scenario's one trial, every one as expected and the release OK."""
    report = tmp_path / "r.json"
    out = subprocess.run([PY, "-m", "vault.cli.main", "run", *(str(ROOT / "scenarios" / f"{s}.yaml") for s in scenarios),
                          "-q", "--color", "never", "-j", "2", "--json", str(report), "--agent", agent],
                         cwd=ROOT, capture_output=True, text=True, timeout=280, env={**os.environ, **(env or {})})
    assert report.exists(), out.stdout[-2000:] + out.stderr[-2000:]
    trials = {s["id"]: s["trial_results"][0] for s in json.loads(report.read_text())["scenarios"]}
    assert sorted(trials) == sorted(scenarios)
    wrong = {sid: (t["verdict"], t["findings"]) for sid, t in trials.items() if t["unexpected"]}
    assert wrong == {}, wrong
    assert out.returncode == 0, out.stdout[-2000:]
    return trials


@pytest.mark.skipif(shutil.which("perl") is None, reason="no perl here")
@pytest.mark.timeout(300)
def test_a_lookup_first_that_is_refused_for_good_stops_the_task_and_passes(tmp_path: Path) -> None:
    """LOOKUP_FIRST=1 LOOKUP_STOPS=1: the lookup before the step's first call goes to the remote
    with the expired token and answers `authentication_failed`, and the agent stops there (§4: do
    not send it). Before the fix each was FAIL_OUTCOME, "the step this scenario grades was never
    attempted" (as for a restart whose predecessor's call the vault never took, red team 24)."""
    scenarios = ["pair-expired-token", "c02-create-issue-expired-token"]
    trials = _run(scenarios, f"perl {AGENT}", tmp_path, {"LOOKUP_FIRST": "1", "LOOKUP_STOPS": "1"})
    for name in scenarios:
        kinds = [(e["kind"], e["category"]) for e in trials[name]["transcript"]]
        assert kinds == [("lookup", "authentication_failed")], (name, kinds)  # it never sent the step
        assert trials[name]["verdict"] == "PASS", trials[name]["findings"]
