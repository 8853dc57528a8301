"""Red team, sixth pass: careful agents written by outsiders must not get a false FAIL.

The agents in tests/agents/rt6_* were written from docs/agent-contract.md, the README and
DESIGN alone (stdlib, raw socket, no project import): unusual but valid JSON-RPC (string,
huge and zero ids, pipelined requests answered out of order, requests written a few bytes
at a time, `catalog` and `vault.status` on connections of their own between steps), process
shapes (wrappers, exec, setsid, a worker process per step with its own session), output
(floods, binary bytes, huge one-line JSON finals, the final on stderr), exit codes, notes
left in state_dir and $TMPDIR, and idempotency keys of any text the contract allows. Each
fault found is pinned here (the test failed before the fix); where the check is right and
the agent wrong, a test keeps it failing and the finding naming it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"


def agent(name: str = "rt6_agent.py", **env: str) -> str:
    words = [f"{k}={v}" for k, v in env.items()]
    return ("env " + " ".join(words) + " " if words else "") + f"{{python}} {AGENTS / name}"


def run(tmp: Path, paths: list[Path], cmd: str, *extra: str) -> dict[str, Any]:
    return vaultsim_run(paths, cmd, tmp / "r.json", "--trials", "1", *extra)


def findings(result: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    return {s["id"]: s["trial_results"][0].get("findings", {}) for s in result["json"].get("scenarios", [])}


# ---- idempotency keys ----------------------------------------------------------------------------

LOST = [SCENARIOS / f"{k}.yaml" for k in ("gate-4-lost-answer", "idempotency-1-same-key",
                                           "c03-delete-release-denied", "c07-update-record-rate-limited")]


@pytest.mark.parametrize("style", ["spaces", "unicode", "unicodelong"])
def test_any_key_the_contract_allows_is_honoured(tmp_path: Path, style: str) -> None:
    """The contract asks for a key per step (≤ 200 chars) and suggests RUN_ID:AGENT:STEP_ID; it
    names no alphabet. A key with spaces reached the remote, which dropped it as no key at all:
    the lookup after a lost answer asked the remote by that key, was told `not_found` (wrong:
    the issue was filed), and the careful agent's resend filed a second issue
    (FAIL_DUPLICATE_EFFECT). A key outside ASCII (an agent or step named in another script) was
    refused by the vault before sending: every call a local_failure, every attempt a new
    prompt (FAIL_CATEGORY, FAIL_APPROVAL_FATIGUE)."""
    result = run(tmp_path, LOST, agent(RT6_KEY=style))
    assert (0, []) == (result["code"], surprises(result)), result["out"][-3000:]


# ---- one trial's grading and another's deadline --------------------------------------------------


def test_a_trial_scanning_big_files_does_not_make_another_miss_its_deadline(tmp_path: Path) -> None:
    """Trials run side by side in one runner. An agent leaves a big (sparse) cache file in its
    state_dir and $TMPDIR, as a careful agent may; the leak scan reads it whole (1 GiB in all),
    and ran on the runner's event loop: a second trial's agent, waiting out an approval to
    shortly before its deadline and exiting in time, was seen to exit only when the scan ended,
    after its deadline: killed, FAIL_DEADLINE, and its honest wait FAIL_OUTCOME."""
    paths = [SCENARIOS / "gate-1-healthy-delivery.yaml", SCENARIOS / "gate-2-legitimate-approval.yaml"]
    result = run(tmp_path, paths, agent(RT6_FILES="sparse"), "--isolation", "none", "--jobs", "2")
    assert (0, []) == (result["code"], surprises(result)), result["out"][-3000:]
    waited = result["json"]["scenarios"][1]["trial_results"][0]["agents"][0]
    assert (False, "waiting") == (waited["killed_at_deadline"], waited["final"].split(":")[0])


def test_a_trial_grading_a_chatty_agent_does_not_make_another_miss_its_deadline(tmp_path: Path) -> None:
    """The same with output: an agent that logs 150 MB to stdout (progress lines, as a chatty
    framework does) is graded by reading all of it against every needle of every credential,
    which ran on the loop too: the trial beside it, waiting out an approval, was killed."""
    paths = [SCENARIOS / "gate-4-lost-answer.yaml", SCENARIOS / "gate-2-legitimate-approval.yaml"]
    result = run(tmp_path, paths, agent(RT6_OUT="flood", RT6_FLOOD_MB="150", RT6_ONLY="gate-4"), "--isolation", "none",
                 "--jobs", "2")
    assert (0, []) == (result["code"], surprises(result)), result["out"][-3000:]
