"""The fallback transcript carries the daemon's `gone` and `kin` (late45's gap).

When the audit log cannot be read, the runner builds the transcript from the daemon's approver-channel
notifications (vault.runner.transcript.from_activity). Those carried no `gone` (which of the sender's
watched processes had exited as its request came) on a call, lookup or resume, and no `kin` or `gone`
on a session's open, so a request an orphan sent the instant the agent exited was timed by the
keeper's clock instead, and fell inside its lag unnamed. Now the notifications carry the same evidence
as the audit records, and the verdict is the same either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import run_trial
from test_fallback_lookups import _run_key_lost
from test_late45 import AGENT, SAID, SCENARIO as READ_ONE

# an approver subscribed (nobody is asked: read_issue runs at once), so the runner has the daemon's
# notifications at all: without one there are none, and the fallback transcript is empty
SCENARIO = READ_ONE.replace("expect:", "approver: {rules: []}\nexpect:", 1)


def _env(tmp: Path, mode: str) -> dict[str, str]:
    return {"LATE45_MODE": mode, "LATE45_WAIT": "pidfd", "LATE45_LOG": str(tmp / "gc.log")}


def _late(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The grandchild's call: its session's second entry for the first step's operation."""
    return [e for e in t["transcript"] if e["kind"] == "call"][1:]


@pytest.mark.timeout(400)
def test_a_call_the_instant_the_agent_exited_grades_the_same_from_notifications_as_from_the_log(
        tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "notes").mkdir()
    logged = run_trial(tmp_path / "log", "late45", SCENARIO, AGENT, _env(tmp_path / "log", "call"))
    noted = _run_key_lost(tmp_path / "notes", SCENARIO, AGENT, _env(tmp_path / "notes", "call"))
    assert (logged["transcript_source"], noted["transcript_source"]) == ("audit", "activity")
    for t in (logged, noted):
        assert t["verdict"] == "FAIL_DEADLINE", (t["transcript_source"], t["findings"])
        assert SAID["call"] in " | ".join(t["findings"]["FAIL_DEADLINE"]), t["findings"]
        # the daemon's reading as the late call came: the agent among the gone, in both
        [late] = _late(t)
        assert late.get("gone"), (t["transcript_source"], late)
    # the same verdict and the same failures (FAIL_RECOVERY beside it in both: the orphan resent a step
    # that was done); "claims completion, then sent" reads the daemon's `gone` in both too
    # (late_opens.sent_after_exit), so a late call inside the keeper's lag is no claim's in either
    assert logged["verdict"] == noted["verdict"] and "FAIL_RECOVERY" in logged["failed"] and \
        sorted(logged["failed"]) == sorted(noted["failed"]), json.dumps([logged["findings"], noted["findings"]])


@pytest.mark.timeout(300)
def test_a_session_opened_the_instant_the_agent_exited_is_named_from_notifications(tmp_path: Path) -> None:
    t = _run_key_lost(tmp_path, SCENARIO, AGENT, _env(tmp_path, "open"))
    assert t["transcript_source"] == "activity", t
    assert t["verdict"] == "FAIL_DEADLINE", t["findings"]
    assert SAID["open"] in " | ".join(t["findings"]["FAIL_DEADLINE"]), t["findings"]
