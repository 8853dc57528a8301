"""Timing margins of the shipped scenarios that careful agents need on a loaded machine.

Found by running the careful outside agents (tests/agents/rt3_*, rt5_*) many times on a
2-core host with one busy-loop process and `--jobs 3`: each fault a margin caused is pinned
here, without running anything timed.
"""

from __future__ import annotations

from helpers import ROOT
from vault.runner.scenario import load_scenario

SCENARIOS = ROOT / "scenarios"


def test_the_first_process_of_the_restart_gate_has_time_to_start_and_stop() -> None:
    """gate-6's first process had 1.5 s from its start: the bash agent (jq per field, a python
    relay) under load needed 1.2-2.1 s to send its first call and 0.5-1 s to exit after the
    `approval_pending`, and was FAIL_DEADLINE in 11 of 12 trials (--isolation none, --jobs 3,
    one busy loop). It now has 4 s; the approval still comes after it must have stopped, so the
    second process still has to resume it (the gate's point)."""
    sc = load_scenario(SCENARIOS / "gate-6-restart-resumes-receipt.yaml")
    first, second = sc.agents
    assert first.deadline_s is not None and first.deadline_s >= 4
    assert second.deadline_s is None  # the restart has the task's own deadline
    assert sc.approver is not None and sc.approver.rules is not None
    delays = [r["delay_s"] for r in sc.approver.rules if r.get("match", {}).get("operation") == "create_issue"]
    assert delays and min(delays) > first.deadline_s, "the approval must come after the first process stopped"
