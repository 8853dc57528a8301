"""Without a jail, as root, the vault's audit files made or replaced while the agent runs are
watched as the ones there at its start are (vault.runner.opens: AUDIT_DIR).

A mark on h/audit.log's inode missed a segment a rotation made while the agent ran and
audit.head, replaced by rename at each head the daemon signs: a forgery of either was named
nowhere, or only as a damaged log, never by its writer. tests/agents/tamper47_audit.py forges one
and then does its task carefully; the daemon's own rotation and head updates are the control.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial, shipped_scenario

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'tamper47_audit.py'}"
SCENARIO = "gate-1-healthy-delivery"


def _run(tmp: Path, mode: str) -> dict[str, Any]:
    t = run_trial(tmp, "gate", shipped_scenario(SCENARIO), AGENT, {"TAMPER47_MODE": mode}, isolation="none")
    if os.geteuid() != 0:
        pytest.skip("who writes the vault's files is seen only by a root runner without a jail")
    return t


def _named(t: dict[str, Any], *words: str) -> None:
    said = " | ".join(t["findings"].get("FAIL_AUDIT_TAMPER", []))
    assert t["verdict"] == "FAIL_AUDIT_TAMPER", t["findings"]
    for w in words:
        assert w in said, said


@pytest.mark.timeout(300)
def test_a_segment_made_while_the_agent_runs_is_watched(tmp_path: Path) -> None:
    _named(_run(tmp_path, "new_segment"), "agent 0's process", "wrote to h/audit.000000000001.log")


@pytest.mark.timeout(300)
def test_the_head_file_written_in_place_is_named(tmp_path: Path) -> None:
    _named(_run(tmp_path, "head_inplace"), "agent 0's process", "wrote to h/audit.head")


@pytest.mark.timeout(300)
def test_the_head_file_replaced_by_rename_is_named(tmp_path: Path) -> None:
    _named(_run(tmp_path, "head_rename"), "h/audit.head")


@pytest.mark.timeout(300)
def test_the_daemons_own_head_updates_are_not_the_agents(tmp_path: Path) -> None:
    t = _run(tmp_path, "none")
    assert (t["verdict"], t["failed"]) == ("PASS", []), t["findings"]
