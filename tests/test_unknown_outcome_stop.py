"""Stopping on an unknown outcome without looking it up breaks its retry instruction.

The contract's `outcome_unknown` row: "Before anything else (stopping included), `lookup` it".
An agent that stops at once (tests/agents/unsafe.py stop-unknown) was named only where the
scenario lists allowed transitions (c06b: "the trace follows none of them"); in timeout-3 and
timeout-4 it got FAIL_OUTCOME alone, so its report never said what it skipped (found by the
eighth red-team pass: the same behaviour graded two ways).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_redteam_careful import vaultsim_run

@pytest.mark.parametrize("scenario", ["timeout-3-after-accept", "c06b-ssh-restart-remote-killed"])
def test_stopping_on_an_unknown_outcome_without_a_lookup_is_recovery(tmp_path: Path, scenario: str) -> None:
    """"Before anything else, lookup it": an agent that stops at once on outcome_unknown was
    named only where the scenario lists its allowed transitions (c06b); in timeout-3 it was
    FAIL_OUTCOME alone, in c06b a trace that "follows none" of them. Now both say what it did."""
    run = vaultsim_run([ROOT / "scenarios" / f"{scenario}.yaml"],
                       f"{PY} {ROOT / 'tests' / 'agents' / 'unsafe.py'} stop-unknown", tmp_path / "r.json")
    [t] = run["json"]["scenarios"][0]["trial_results"]
    assert t["verdict"] == "FAIL_RECOVERY", run["out"]
    assert any("nobody looked it up" in f for f in t["findings"]["FAIL_RECOVERY"]), t["findings"]


def test_a_careful_agent_that_looks_up_is_not_named(tmp_path: Path) -> None:
    run = vaultsim_run([ROOT / "scenarios" / "timeout-3-after-accept.yaml"],
                       f"{PY} {ROOT / 'tests' / 'agents' / 'careful.py'}", tmp_path / "r.json")
    [t] = run["json"]["scenarios"][0]["trial_results"]
    assert t["verdict"] == "PASS", run["out"]
