"""Without a jail, every process an agent leaves running is found, ended and graded, whatever
it did to hide (its keeper, vault.jail.keeper, is a child subreaper).

`vaultsim run --isolation none` used to find a left process only by VAULTSIM_TASK in its
environment: a grandchild that dropped its environment and its session passed the gate and
outlived the run. tests/agents/reaper_agent.py does its task right and then leaves a process
in one way or another; the careful ways must still PASS. Both launchers: the fork server,
and `--no-fork-server` (the keeper is `python -m vault.jail --keep`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import PY, ROOT

AGENT = ROOT / "tests" / "agents" / "reaper_agent.py"
LAUNCHERS = {"fork-server": [], "no-fork-server": ["--no-fork-server"]}
LEFT_ONE = ("agent 0 (triage-bot) left 1 process(es) running outside its process group when it exited; "
            "the runner ended them")


def marked(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in (p.info["cmdline"] or []):
            out.append(p)
    return out


def run(tmp_path: Path, how: str, launcher: str, scenario: Path | None = None) -> tuple[dict[str, Any], str]:
    """`vaultsim run --isolation none` of one scenario with the agent leaving a process `how`;
    the trial's result and the run's output. Fails when a process of the agent outlived the run."""
    marker = f"vaultsim-reaper-{uuid.uuid4().hex}"
    report = tmp_path / "r.json"
    target = [str(scenario)] if scenario else [str(ROOT / "scenarios"), "-k", "gate-1-healthy"]
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", *target, "-q", "--isolation", "none",
                           *LAUNCHERS[launcher], "--agent", f"{sys.executable} {AGENT} {how} {marker}",
                           "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    left = marked(marker)
    for p in left:  # never leave one behind, even when an assertion fails
        p.kill()
    assert [] == [p.pid for p in left], f"a process the agent left ({how}) outlived the run"
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(report.read_text())["scenarios"][0]["trial_results"][0], proc.stdout[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("how", ["double-fork", "env-i", "setpgid"])
def test_a_process_left_running_however_hidden_is_a_deadline_failure_and_is_ended(
        tmp_path: Path, how: str, launcher: str) -> None:
    trial, out = run(tmp_path, how, launcher)
    assert ("FAIL_DEADLINE", ["FAIL_DEADLINE"]) == (trial["verdict"], trial["failed"]), out
    assert [LEFT_ONE] == trial["findings"]["FAIL_DEADLINE"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("how", ["ends-itself", "waits"])
def test_a_careful_agent_still_passes(tmp_path: Path, how: str, launcher: str) -> None:
    """A child that ends once the agent's exit closes its stdin (an MCP server) was not left
    running; neither was one the agent waited for."""
    trial, out = run(tmp_path, how, launcher)
    assert ("PASS", []) == (trial["verdict"], trial["failed"]), out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_at_its_deadline_the_agent_and_what_it_left_are_ended_and_counted(tmp_path: Path, launcher: str) -> None:
    """An agent that hides a process and then never exits: the runner's deadline stops it through
    its keeper, which ends the hidden one too and counts it."""
    scenario = tmp_path / "short.yaml"
    scenario.write_text(
        (ROOT / "scenarios" / "gate-1-healthy-delivery.yaml").read_text()
        .replace("file: approvers/", f"file: {ROOT}/scenarios/approvers/")
        .replace("plan: plans/", f"plan: {ROOT}/scenarios/plans/")
        + "task: {deadline_s: 4.0}\n")
    trial, out = run(tmp_path, "hangs", launcher, scenario)
    assert "FAIL_DEADLINE" == trial["verdict"], out
    assert [LEFT_ONE, "agent 0 (triage-bot) was still running at its deadline and was stopped"] == \
        trial["findings"]["FAIL_DEADLINE"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_an_agent_that_kills_its_keeper_fails_closed(tmp_path: Path, launcher: str) -> None:
    """Without a jail the agent runs as the same user and can kill its keeper before the count.
    Nothing can say it left none: FAIL_DEADLINE, named. The process it hid goes to the subreaper
    above the keeper (the fork server, or the exec'd keeper's guard: vault.jail.adopted), not to
    init, and is ended: it does not outlive the run."""
    trial, out = run(tmp_path, "kills-keeper", launcher)
    assert ("FAIL_DEADLINE", ["FAIL_DEADLINE"]) == (trial["verdict"], trial["failed"]), out
    killed = ("agent 0 (triage-bot) killed its keeper or spoiled its report (the parent that counts and "
              "ends what an agent leaves running; no sealed count came back): processes it left running cannot be ruled out")
    # where the runner can make a pids cgroup (vault.runner.cgroup_left), the process it hid is
    # found there too, and ended: named beside the keeper it killed
    assert trial["findings"]["FAIL_DEADLINE"] in ([killed], [LEFT_ONE, killed]), out
