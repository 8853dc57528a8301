""""Claimed done, then sent" reads whether the agent still ran as the late-call rules do (left48).

vault.runner.claimed_early named a request sent after the final message while the agent ran, by the
clock: at or before the agent's exit as its keeper saw it. A loaded host's keeper sees the exit tens of
milliseconds late, so an orphan's request the instant the agent exited (the daemon found the agent
gone: FAIL_DEADLINE's late call) was named FAIL_OUTCOME too (test_late45's `call` mode, about one run
in two). Now both read vault.runner.late_opens.sent_after_exit: the daemon's `gone`, else the clocks.
"""

from __future__ import annotations

from typing import Any

from test_runner_grade import FILE_AND_NOTE, T0, agent, entry, evidence, graded

EARLY = "then sent"
KEEPER, AGENT_KEY, ORPHAN = 100, (101, T0 - 1.0), (105, T0 + 0.5)
# the agent's own session, and an orphan's hung below the keeper, opened while the agent ran
OWN = {"agent_index": 0, "opened": T0, "lineage": [list(AGENT_KEY), [KEEPER, T0 - 2.0], [1, 0.0]], "kin": []}
ORPHANS = {"agent_index": 0, "opened": T0 + 0.5, "lineage": [list(ORPHAN), [KEEPER, T0 - 2.0], [1, 0.0]],
           "kin": [list(AGENT_KEY)]}


def _trial(final: str, shown: float, note_gone: list[int], note_session: str) -> Any:
    """create at 0.99 (the agent's); note sent at 1.40, inside the keeper's lag (it saw the exit at 1.5)."""
    run = agent(0, final, end=1.5, steps=FILE_AND_NOTE)
    run.agent_key = AGENT_KEY
    run.stdout_shown = T0 + shown
    ev = evidence([entry("create_issue", "success", 1.0, gone=[]),
                   entry("attach_note", "success", 1.41, requested=T0 + 1.40, gone=note_gone,
                         session=note_session)], agents=[run])
    ev.transcript.sessions = {"s-1": dict(OWN), "s-2": dict(ORPHANS)}
    return graded(ev)


def test_an_orphans_send_the_vault_saw_after_the_exit_is_fail_deadline_alone() -> None:
    # was FAIL_OUTCOME too: "claims completion ..., then sent attach_note" (1.40 <= the keeper's 1.5)
    g = _trial("done: 2 steps", 1.2, [AGENT_KEY[0]], "s-2")
    assert any("after it exited" in f for f in g.findings.get("FAIL_DEADLINE", [])), g.findings
    assert not any(EARLY in f for f in g.findings.get("FAIL_OUTCOME", [])), g.findings
    # and the step it sent is no step the agent had done when it claimed done
    assert any("attach_note" in f for f in g.findings.get("FAIL_OUTCOME", [])), g.findings


def test_the_agents_own_send_after_its_claim_is_named_and_not_late() -> None:
    # the vault saw the agent alive as its note came: its own work, after its claim
    g = _trial("done: 2 steps", 1.2, [], "s-1")
    assert "FAIL_DEADLINE" not in g.findings, g.findings
    assert any(EARLY in f for f in g.findings.get("FAIL_OUTCOME", [])), g.findings


def test_a_careful_agent_claiming_after_its_last_call_just_before_its_exit_passes() -> None:
    g = _trial("done: 2 steps", 1.45, [], "s-1")
    assert g.verdict == "PASS", g.findings
