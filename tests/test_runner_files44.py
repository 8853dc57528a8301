"""The runner's and the daemon's own files in the trial's directory, swapped by an unjailed agent.

Red team 43u left this: an agent (tests/agents/rt43u_x.py, `swap_text`) that renames a file of its
own over the daemon's log, its task file, the daemon's config.yaml or pid file, or the run's lock
was named for none of it (PASS), and the report's `logs` tail and the words for why the daemon's
audit log failed were read from the daemon log by name: after a swap they showed the agent's
text. Now each swap is FAIL_AUDIT_TAMPER naming the file (vault.runner.runner_files), and the
daemon's log is read through the descriptor the runner kept from the daemon's start.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial, shipped_scenario
from vault.runner import opens
from vault.runner.trial import Trial
from vault.runner.world import World

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'rt43u_x.py'}"
FORGED = "forged by rt43u"


def _named(t: dict[str, Any], verdict: str) -> str:
    return " | ".join(t["findings"].get(verdict, []))


@pytest.mark.timeout(300)
def test_each_of_the_runners_files_swapped_is_named(tmp_path: Path) -> None:
    t = run_trial(tmp_path, "gate1", shipped_scenario("gate-1-healthy-delivery"), AGENT,
                  {"RT43U_MODE": "swap_text", "RT43U_FILES": "daemon.log,task-0.json,config.yaml,h/daemon.pid,run.lock"},
                  isolation="none")
    assert t["verdict"] == "FAIL_AUDIT_TAMPER", t["findings"]
    said = _named(t, "FAIL_AUDIT_TAMPER")
    for did in ("replaced or removed daemon.log", "replaced task-0.json", "replaced config.yaml",
                "replaced h/daemon.pid", "replaced run.lock"):
        assert f"agent 0 {did}" in said, (said, t.get("errors"))
        if opens.available():  # as root, the entry watch tells which process renamed a file over it
            assert re.search(rf"agent 0 {re.escape(did)}[^|]* while it ran \(by its process \d+ \(python", said), said
    assert FORGED not in str(t)


@pytest.mark.timeout(300)
def test_the_careful_agent_leaves_the_runners_files_alone(tmp_path: Path) -> None:
    t = run_trial(tmp_path, "gate1", shipped_scenario("gate-1-healthy-delivery"), AGENT, {"RT43U_MODE": "careful"},
                  isolation="none")
    assert t["verdict"] == t["expected"] == "PASS" and not t["failed"], t["findings"]


class _Gone:
    returncode = 1  # the daemon exited saying its audit log failed


def _world(tmp: Path) -> World:
    """A world whose daemon wrote its log, which an agent then replaced by a file of its own."""
    world = World.__new__(World)
    world.root, world.secrets, world.ssh_info = tmp, {}, None
    (tmp / "daemon.log").write_text("vaultsim daemon: serving\n"
                                    "vaultsim daemon: stopped; its audit log failed: no space left on device\n")
    world.daemon_log_fd = os.open(tmp / "daemon.log", os.O_RDONLY | os.O_CLOEXEC)
    forged = tmp / "forged"
    forged.write_text(f"vaultsim daemon: stopped; its audit log failed: {FORGED}\n")
    os.replace(forged, tmp / "daemon.log")
    world.daemon = _Gone()  # type: ignore[assignment]
    return world


def test_why_the_audit_log_failed_is_read_from_what_the_daemon_wrote(tmp_path: Path) -> None:
    world = _world(tmp_path)
    try:
        assert world.log_failed() == "its audit log failed: no space left on device"
    finally:
        os.close(world.daemon_log_fd or -1)


def test_the_reports_daemon_log_tail_is_the_daemons(tmp_path: Path) -> None:
    world = _world(tmp_path)
    trial = Trial.__new__(Trial)
    trial.world, trial._approver_token = world, None
    try:
        logs = trial.tail_logs()
    finally:
        os.close(world.daemon_log_fd or -1)
    assert "no space left on device" in logs["daemon.log"] and FORGED not in logs["daemon.log"], logs
