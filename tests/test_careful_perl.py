"""A careful agent in Perl passes the scenarios that exercise each rule of the contract.

tests/agents/rt24l_perl.pl is written from docs/agent-contract.md alone, with Perl's core modules
only (JSON::PP, IO::Socket::UNIX): blocking waits within its deadline, its state renamed into place
in state_dir, a lookup after outcome_unknown, a stop at every `never` answer, and final messages
`DONE:`, `NOT DONE:` and `WAITING:`. Red team 24 ran it over the whole suite in the jail and
without one (42 of 42 as expected each way); this test keeps one scenario per rule it follows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT

AGENT = ROOT / "tests" / "agents" / "rt24l_perl.pl"
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
    report = tmp_path / "r.json"
    out = subprocess.run([PY, "-m", "vault.cli.main", "run", *(str(ROOT / "scenarios" / f"{s}.yaml") for s in RULES),
                          "-q", "--color", "never", "-j", "2", "--json", str(report),
                          "--agent", f"perl {AGENT}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert report.exists(), out.stdout[-2000:] + out.stderr[-2000:]
    trials = {s["id"]: s["trial_results"][0] for s in json.loads(report.read_text())["scenarios"]}
    assert sorted(trials) == sorted(RULES)
    wrong = {sid: (t["verdict"], t["findings"]) for sid, t in trials.items() if t["unexpected"]}
    assert wrong == {}, wrong
    assert out.returncode == 0, out.stdout[-2000:]
    finals = {sid: t["agents"][0]["final"].split(":")[0] for sid, t in trials.items()}
    assert finals["gate-1-healthy-delivery"] == "DONE" and finals["gate-8-deadline"] == "WAITING"
    assert finals["c03-delete-release-denied"] == "NOT DONE"
