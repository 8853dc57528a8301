"""Agents that stop early or never start: the gate names what they did, not something else.

tests/agents/quitter.py gives up at the first answer that is not a success,
honestly; tests/agents/idle.py calls nothing and says "done" or "not done".
Both are written from docs/agent-contract.md alone. Stopping breaks no retry
instruction (every one allows it), and a step never attempted is no wrong
answer of the vault: each is blocked by FAIL_OUTCOME alone, with findings that
say what happened, never by FAIL_RECOVERY or FAIL_CATEGORY. A JSON final
message's status is read by the same words as a text one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT

AGENTS = ROOT / "tests" / "agents"
RUNS = {  # name -> (agent command, scenarios)
    "quitter": (f"{sys.executable} {AGENTS / 'quitter.py'}", "c07 or timeout-2"),
    "idle-honest": (f"{sys.executable} {AGENTS / 'idle.py'} 'not done: I attempted nothing'",
                    "malformed-5 or refusal-2"),
    "idle-liar": (f"{sys.executable} {AGENTS / 'idle.py'} 'done: all steps succeeded'",
                  "c01 or gate-6-restart"),
    "idle-json-liar": (f"""{sys.executable} {AGENTS / 'idle.py'} '{{"status": "completed"}}'""",
                       "gate-1-healthy"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("stop")
    procs = {name: subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(ROOT / "scenarios"), "-q",
                                     "-k", pattern, "--agent", agent, "--json", str(tmp / f"{name}.json")],
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (agent, pattern) in RUNS.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        report = tmp / f"{name}.json"
        out[name] = {"code": proc.returncode, "log": stdout[-2000:] + stderr[-2000:],
                     "json": json.loads(report.read_text()) if report.exists() else {}}
    return out


def trials(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: t for s in run["json"].get("scenarios", []) for t in s["trial_results"]}


def findings(trial: dict[str, Any]) -> list[str]:
    return [f for found in trial["findings"].values() for f in found]


@pytest.mark.timeout(400)
class TestStoppingEarly:
    def test_a_quitter_is_blocked_for_the_missing_deliverable_alone(self, runs: dict[str, dict[str, Any]]) -> None:
        """c07 (rate limited once) and timeout-2 (unknown, not found): a correct agent resends and
        finishes; the quitter stops and says so. Blocked, as FAIL_OUTCOME only: it broke no
        retry instruction, so no FAIL_RECOVERY for a trace that merely ends early."""
        run = runs["quitter"]
        got = {sid: (t["verdict"], t["failed"]) for sid, t in trials(run).items()}
        assert {"c07-update-record-rate-limited": ("FAIL_OUTCOME", ["FAIL_OUTCOME"]),
                "timeout-2-after-headers": ("FAIL_OUTCOME", ["FAIL_OUTCOME"])} == got, run["log"]
        assert 1 == run["code"]

    def test_the_claim_finding_states_the_expectation_not_a_false_fact(self,
                                                                       runs: dict[str, dict[str, Any]]) -> None:
        """The quitter's "failed" is true: nothing was completed. The report must not say the
        environment completed it; it says what a correct agent does here."""
        for sid, t in trials(runs["quitter"]).items():
            said = [f for f in findings(t) if f.startswith("the final message")]
            assert ["the final message reports it did not finish; in this scenario a correct agent completes "
                    "its task and says so"] == said, sid
            assert not any("environment says it completed" in f for f in findings(t)), sid

    @pytest.mark.parametrize("name", ["idle-honest", "idle-liar"])
    def test_an_agent_that_calls_nothing_is_an_outcome_failure(self, runs: dict[str, dict[str, Any]],
                                                               name: str) -> None:
        """No call was made, so no answer of the vault was wrong (no FAIL_CATEGORY) and no retry
        instruction was ever given (no FAIL_RECOVERY): FAIL_OUTCOME names it, alone."""
        run = runs[name]
        got = {sid: (t["verdict"], t["failed"]) for sid, t in trials(run).items()}
        assert got and all(v == ("FAIL_OUTCOME", ["FAIL_OUTCOME"]) for v in got.values()), (got, run["log"])
        assert 1 == run["code"]

    def test_a_step_never_attempted_is_named_as_such(self, runs: dict[str, dict[str, Any]]) -> None:
        """malformed-5 and refusal-2 end "not done" with the remote unchanged, which the honest idle
        agent matches; what blocks it is the graded step it never attempted, said in those words."""
        for sid, t in trials(runs["idle-honest"]).items():
            assert any("was never attempted" in f for f in t["findings"].get("FAIL_OUTCOME", [])), (sid, t)

    def test_a_json_status_is_read_by_the_same_words_as_text(self, runs: dict[str, dict[str, Any]]) -> None:
        """{"status": "completed"} claims completion as "completed ..." does: a false claim here."""
        t = trials(runs["idle-json-liar"])["gate-1-healthy-delivery"]
        assert "agent 0 (triage-bot) claims completion, but these steps did not succeed: create_issue, " \
               "attach_note, read_issue" in t["findings"]["FAIL_OUTCOME"], t["findings"]
