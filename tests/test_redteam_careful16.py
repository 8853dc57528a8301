"""Red team, sixteenth pass (c): careful agents never seen by the project must not get a false FAIL.

Written from docs/agent-contract.md and README alone. Agent: tests/agents/rt16c_anyio.py (anyio;
`session.open`, `vault.status` and `catalog` pipelined; approvals polled with `call.resume`; reads
the catalog says are never asked about done by a process pool's workers, each with a session of
its own; scratch files; hex and base64 dumps; a BOM, CRLF, 3.5 MiB or exit-flushed final message).
It swept the whole suite, in the jail and with --isolation none: 42 of 42 as expected, but for one
thing found and fixed here.

An agent that finishes shortly before its deadline while a helper it started in a session of its
own is still ending (an MCP client starts its server so, and the server exits once its stdin
closes) was graded FAIL_DEADLINE, "still running at its deadline and was stopped": the agent's
keeper waits up to ESCAPE_GRACE_S for such a helper after the agent exits, and the runner, waiting
for the keeper, killed it at the deadline's second of grace. The contract allows the helper those
2 s (section 9: only one still running 2 s later is left running). The keeper now reports the
agent's exit at once, and a runner whose wait ran out while that keeper was in its grace lets it
finish it: the agent is graded by when it exited.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_redteam_careful import surprises, vaultsim_run

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"

pytest.importorskip("anyio")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("isolation", ["auto", "none"])
@pytest.mark.parametrize("hold", ["none", "stderr"])
def test_a_helper_still_ending_when_the_agent_exits_near_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str, hold: str) -> None:
    """The agent prints its final message 0.6 s before its deadline and exits; a helper it started
    in a session of its own (holding nothing, or its stderr as an MCP server does) ends 1.7 s later,
    past the runner's second of grace after the deadline and inside the 2 s the contract allows.
    Before the fix: FAIL_DEADLINE in both scenarios, each way. (Was 0.3 s and 1.5 s: on a loaded
    host the interpreter's exit took the agent past its deadline; RT16C_EXIT_LAG=0.6 makes it so.)"""
    monkeypatch.setenv("RT16C_LATE", "0.6")
    monkeypatch.setenv("RT16C_TRAIL", "1.7")
    monkeypatch.setenv("RT16C_HOLD", hold)
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-2-legitimate-approval", "gate-8-deadline")]
    run = vaultsim_run(paths, f"{PY} {AGENTS / 'rt16c_anyio.py'}", tmp_path / "r.json", "--isolation", isolation)
    assert run["code"] == 0 and not surprises(run), (surprises(run), run["out"][-2000:])


@pytest.mark.timeout(600)
def test_a_helper_still_running_past_the_grace_is_still_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side: a helper in a session of its own that runs 4 s past the agent's exit is left
    running (FAIL_DEADLINE, after the wait's EXPECTED_WAIT), the agent's early exit notwithstanding."""
    monkeypatch.setenv("RT16C_LATE", "0.3")
    monkeypatch.setenv("RT16C_TRAIL", "4")
    monkeypatch.setenv("RT16C_HOLD", "none")
    run = vaultsim_run([SCENARIOS / "gate-2-legitimate-approval.yaml"], f"{PY} {AGENTS / 'rt16c_anyio.py'}",
                       tmp_path / "r.json", "--isolation", "none")
    assert run["code"] == 1, run["out"][-2000:]
    (trial,) = [t for s in run["json"]["scenarios"] for t in s["trial_results"]]
    assert "FAIL_DEADLINE" in trial["failed"] and not trial["ok"], trial["reasons"]
    assert trial["agents"][0]["left_running"] == 1 and not trial["agents"][0]["killed_at_deadline"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("knobs", [
    {"RT16C_POOL": "1", "RT16C_FILES": "300", "RT16C_DUMP": "all", "RT16C_FINAL": "bom"},
    {"RT16C_POOL": "fork", "RT16C_SPIN": "0.01", "RT16C_FINAL": "crlf"},
    {"RT16C_POOL": "forkserver", "RT16C_FINAL": "buffered"},
])
def test_the_anyio_pool_agent_is_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          knobs: dict[str, str]) -> None:
    """rt16c_anyio.py's other habits, across a lost answer, a restart, a rate limit, a denial, a
    DNS failure and a malformed answer to a read (the pool's workers do those reads)."""
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-4-lost-answer", "gate-6-restart-resumes-receipt",
                                               "c07-update-record-rate-limited", "c03-delete-release-denied",
                                               "c01-read-issue-dns", "malformed-1-id-null")]
    run = vaultsim_run(paths, f"{PY} {AGENTS / 'rt16c_anyio.py'}", tmp_path / "r.json", "-j", "2")
    assert run["code"] == 0 and not surprises(run), (surprises(run), run["out"][-2000:])
