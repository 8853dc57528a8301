"""A trial whose audit log cannot be read and whose scenario has no approver is an ERROR, not the agent's FAIL.

Without an `approver:` nobody subscribes to the vault's notifications, so when the log does not
decrypt the fallback transcript (vault.runner.transcript.from_activity) is empty: a careful agent that
read its issue was graded FAIL_OUTCOME, as if it had done nothing. Nothing shows what it did, so the
trial says nothing about it (vault.runner.unrecorded).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_fallback_lookups import _run_key_lost
from test_late45 import SCENARIO

CAREFUL = f"{PY} {ROOT / 'tests' / 'agents' / 'careful.py'}"


@pytest.mark.timeout(300)
def test_an_unreadable_log_without_an_approver_is_an_error_naming_why(tmp_path: Path) -> None:
    assert "approver:" not in SCENARIO
    t = _run_key_lost(tmp_path, SCENARIO, CAREFUL, {})
    assert t["verdict"] == "ERROR", (t["verdict"], t.get("findings"))
    assert "audit log could not be read" in t["error"] and "no approver" in t["error"], t["error"]
    assert "the audit key is not available" in t["error"], t["error"]
