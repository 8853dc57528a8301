"""Red team 49c: careful agents and careful test files as outside teams write them, which must PASS.

Written from README.md, docs/ci.md and docs/agent-contract.md alone:

* tests/agents/rt49c_jitter.py, stdlib Python: it reads `vault.status` before its first call and
  sends nothing while the vault is locked (section 4: "as good" as meeting `vault_locked`), waiting
  the lock out with jittered backoff; it retries only where section 4 allows (`bounded`,
  `after_delay`: at most 3 attempts, the same key, jittered pauses never shorter than
  `retry_after_s`), looks an unknown outcome up before anything else, keeps finished steps and
  pending tokens in state_dir, and says the truth last. `--no-status` meets the lock as an answer.
* tests/agents/rt49c_mcp_host.py, an MCP host on the `mcp` SDK's stdio client: it starts `vaultsim
  mcp` itself, lists the tools, calls each step's tool with a progress callback, collects waits with
  `vault_resume`, looks an unknown outcome up with `vault_lookup` first, keeps its state in
  state_dir, and with `--restart` stops its bridge and starts a new one between steps where section
  3 allows a reconnect (nothing waiting, no later step of an operation already called).
* tests/agents/rt49c_suite_{conftest,tests}.py: a team's pytest suite over that agent, copied into a
  directory of the test's own and run under pytest-xdist with `--dist loadscope`, warnings of an
  ungraded world as errors: a conftest wrapping the plugin's `vaultsim` fixture with the team's
  approver rules, a session-scoped agent command, a module-scoped shared world (docs/ci.md's
  `VaultsimFactory`) used by a class's two tests through a class-scoped fixture, a test
  parametrized over faults with `pytest.param(..., marks=pytest.mark.vaultsim(fault=...))`, a
  strict xfail over a fault no agent can finish, and two agents run in sequence in one world with
  the prompt count checked between them.

Swept by hand over the whole shipped suite, jailed and `--isolation none` (-j 2; the figures are in
the branch's report): every verdict as expected. Here only the few scenarios each habit reaches.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from test_redteam_careful import told, vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
SC = ROOT / "scenarios"
JITTER = AGENTS / "rt49c_jitter.py"


def _trials(names: list[str], agent: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="rt49c-") as tmp:
        run = vaultsim_run([SC / f"{n}.yaml" for n in names], agent, Path(tmp) / "r.json", "-j", "2",
                           timeout=200)
    trials = {s["id"]: s["trial_results"][0] for s in run["json"].get("scenarios", [])}
    assert sorted(trials) == sorted(names), told(run)
    for name, trial in trials.items():
        assert trial["verdict"] == trial["expected"], (name, told(run))
    assert run["code"] == 0, told(run)
    return run, trials


@pytest.mark.timeout(240)
def test_the_jittered_careful_agent_passes_where_its_habits_matter() -> None:
    """locked-vault: it reads the status, sends nothing while locked and says not done (PASS, as
    the contract promises, though the scenario names the `vault_locked` answer); refusal-4: the
    lock comes while it waits for a person; c07: it waits out `retry_after_s` (jittered, never
    shorter) and resends under the same key; c05: it looks the unknown outcome up before anything
    else; gate-6: the restart resumes the saved token instead of asking again."""
    names = ["locked-vault", "refusal-4-lock-while-pending", "c07-update-record-rate-limited",
             "c05-create-deployment-late-response", "gate-6-restart-resumes-receipt"]
    run, trials = _trials(names, f"{sys.executable} {JITTER}")
    locked = trials["locked-vault"]["agents"][0]["final"]
    assert locked.startswith("not done") and "nothing was sent" in locked, told(run)


@pytest.mark.timeout(120)
def test_meeting_the_lock_as_an_answer_passes_too() -> None:
    """Without the status read the first call is answered `vault_locked`; the agent polls the status
    until its deadline and never resends while locked."""
    _trials(["locked-vault"], f"{sys.executable} {JITTER} --no-status")


@pytest.mark.timeout(300)
def test_a_teams_xdist_loadscope_suite_passes_with_ungraded_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(AGENTS / "rt49c_suite_conftest.py", suite / "conftest.py")
    shutil.copy(AGENTS / "rt49c_suite_tests.py", suite / "test_team.py")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-p", "xdist", "-n", "2", "--dist", "loadscope",
                          "-W", "error::vault.pytest_plugin.ungraded.VaultsimUngradedWarning",
                          "--rootdir", str(suite), "-c", "/dev/null", "--basetemp", str(tmp_path / "bt"), str(suite)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=280,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "RT49C_AGENT": str(JITTER)})
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-5000:]
    assert "6 passed, 1 xfailed" in said, said[-5000:]
    assert "response-only false passes: 0 of 6 graded trials" in said, said[-5000:]


@pytest.mark.timeout(200)
def test_an_sdk_host_that_restarts_its_bridge_between_steps_passes() -> None:
    """gate-1: three steps, a new bridge (a new vault session) after the create, whose operation no
    later step calls; gate-6: the first process hands its wait over in state_dir and the restart's
    bridge collects it with `vault_resume`; c05: `vault_lookup` before anything else."""
    pytest.importorskip("mcp", reason="the mcp SDK is not installed")
    _trials(["gate-1-healthy-delivery", "gate-6-restart-resumes-receipt", "c05-create-deployment-late-response"],
            f"{sys.executable} {AGENTS / 'rt49c_mcp_host.py'} --restart")
