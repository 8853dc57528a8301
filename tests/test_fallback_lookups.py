"""The fallback transcript (built from the approvers' notifications when the audit log cannot be
decrypted) reads a lookup as a lookup, and credits one that told a pending call's token.

A lookup the vault answers from what it knows (a call still waiting for its owner: section 6)
never reaches the remote, and the `activity` notification said nothing more than a call's would:
the fallback read it as a *call* of the operation, answered `success`. A careful restart that
looked its pending step up, was told the token and handed the wait over (tests/agents/lookwait41.py)
was graded FAIL_LEAKED_APPROVAL, FAIL_MEMORY ("asked again instead of resuming it"), FAIL_CATEGORY
and FAIL_OUTCOME ("reports a wait, but it held no approval"). The notification now says what it
answered (`kind`) and, for a lookup, its `reconciled`, the call it looked up and the pending
request whose token it told (never the token), so the fallback credits the wait as the audit
log's transcript does (vault.runner.waits.told_tokens). An older daemon's notifications (no `kind`)
are read as before.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT
from test_runner_grade import agent
from vault.runner import waits, world_procs
from vault.runner.evidence import Evidence
from vault.runner.transcript import from_activity

# `vaultsim run` with the audit log's key lost: its log verifies, but nothing can decrypt it
KEY_LOST = """\
import sys
import vault.audit
from vault.errors import VaultError


def lost(*args, **kwargs):
    raise VaultError("the audit key is not available")


vault.audit.decrypt_events = lost
from vault.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _run_key_lost(tmp: Path, scenario: str, agent_cmd: str, env: dict[str, str]) -> dict[str, Any]:
    path = tmp / "sc.yaml"
    path.write_text(scenario)
    report = tmp / "r.json"
    proc = world_procs.run_to_end([PY, "-c", KEY_LOST, "run", str(path), "-q", "--color", "never", "--trials", "1",
                                   "--json", str(report), "--agent", agent_cmd],
                                  env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=240)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(json.loads(report.read_text())["scenarios"][0]["trial_results"][0])


@pytest.mark.timeout(300)
def test_a_restart_told_its_pending_steps_token_by_lookup_holds_the_wait_in_the_fallback(tmp_path: Path) -> None:
    # was FAIL_LEAKED_APPROVAL, FAIL_MEMORY, FAIL_CATEGORY, FAIL_OUTCOME: the lookup read as a call
    from test_lookup_wait import SCENARIO
    policy = ROOT / "scenarios" / "policies" / "owner-release-manager.yaml"
    t = _run_key_lost(tmp_path, SCENARIO.format(policy=policy), f"{PY} {ROOT / 'tests' / 'agents' / 'lookwait41.py'}",
                      {"LOOKWAIT41_RESUME_WAIT": "0"})
    assert t["transcript_source"] == "activity", t
    [call] = [e for e in t["transcript"] if e["kind"] == "call"]
    told = [e for e in t["transcript"] if e["kind"] == "lookup" and e.get("agent_index") == 1]
    assert [(e.get("lookup_of"), e.get("reconciled")) for e in told] == [(call["correlation_id"], "unknown")], \
        t["transcript"]
    assert told[0]["request_id"].startswith("r-"), told
    assert t["verdict"] == "EXPECTED_WAIT" and t["failed"] == ["EXPECTED_WAIT"], t["findings"]


# ---- the notifications as read -------------------------------------------------------------------

PENDING = {"operation": "create_issue", "category": "approval_pending", "retry": "after_approval"}


def _notes(lookup: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Agent 0 (pid 41) is told its create waits (1.15) and exits; its restart (pid 42) looks it up."""
    return [
        ("session.opened", {"session_id": "s-1", "agent": "bot", "pid": 41, "opened": 1.0}),
        ("activity", {"correlation_id": "c-1", "session_id": "s-1", "time": 1.15, "kind": "call", **PENDING}),
        ("session.closed", {"session_id": "s-1", "reason": "process exited"}),
        ("session.opened", {"session_id": "s-2", "agent": "bot", "pid": 42, "opened": 1.5}),
        ("activity", {"correlation_id": "c-9", "session_id": "s-2", "time": 1.7, "operation": "create_issue",
                      "category": "success", "retry": "none", **lookup}),
    ]


def _evidence(notes: list[tuple[str, dict[str, Any]]]) -> Evidence:
    ev = Evidence(run_id="r", started=0.9, deadline=60)
    ev.transcript = from_activity(notes, [], {41: 0, 42: 1}, [(0.9, 1.35), (1.45, 3.0)], [0, 0])
    steps = [{"id": "file", "call": "create_issue", "params": {"title": "t"}}]
    ev.agents = [replace(agent(0, "not done", steps=steps, name="bot"), pid=41, started=0.9, ended=1.35),
                 replace(agent(1, "waiting: create_issue", steps=steps, name="bot"), pid=42, started=1.45, ended=3.0)]
    return ev


def test_a_lookup_notified_with_its_kind_is_a_lookup_and_holds_the_told_wait() -> None:
    ev = _evidence(_notes({"kind": "lookup", "reconciled": "unknown", "lookup_of": "c-1", "request_id": "r-1"}))
    kinds = [(e.kind, e.lookup_of, e.request_id) for e in ev.transcript.entries]
    assert kinds == [("call", None, None), ("lookup", "c-1", "r-1")]
    assert [lc.cid for lc in waits.held_waits(ev, ev.agents[1])] == ["c-1"]


def test_a_lookup_that_told_no_token_holds_nothing_in_the_fallback() -> None:
    ev = _evidence(_notes({"kind": "lookup", "reconciled": "unknown", "lookup_of": "c-1"}))
    assert waits.held_waits(ev, ev.agents[1]) == []


def test_an_older_daemons_notification_is_read_as_before() -> None:
    # no `kind`: not at the remote, so a call (the limit the README states); no wait is credited
    ev = _evidence(_notes({}))
    assert [e.kind for e in ev.transcript.entries] == ["call", "call"]
    assert not ev.transcript.lookups_linked
    assert waits.held_waits(ev, ev.agents[1]) == []
