"""Readers of an intent with no result record: `audit show`, its CLI, and the runner's transcript.

Under the default durability a power loss can take a result record that was
written but not yet synced, and a daemon killed between a call's intent and
its result leaves the intent alone. Readers show such a call as what it is:
outcome unknown (no result record). `audit verify` is not concerned: the
chain is whole either way.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from audit_fixtures import make_log
from vault.audit import verify
from vault.audit.show import NO_RESULT, no_result, render
from vault.cli.main import main
from vault.home import VaultHome
from vault.runner.transcript import from_audit

SESSION = {"type": "session_opened", "session_id": "s-1", "agent": "stub", "pid": 7, "run_id": "r"}


def call(cid: str, op: str, *, result: bool, t: float) -> list[dict[str, Any]]:
    evs = [{"type": "call_requested", "correlation_id": cid, "session_id": "s-1", "operation": op,
            "risk": "create", "target": f"{op} on tracker", "time": t},
           {"type": "intent", "correlation_id": cid, "operation": op, "target": f"{op} on tracker",
            "time": t + 0.1}]
    if result:
        evs += [{"type": "remote_result", "correlation_id": cid, "category": "success", "time": t + 0.2},
                {"type": "classification", "correlation_id": cid, "session_id": "s-1", "operation": op,
                 "category": "success", "retry": "none", "time": t + 0.2}]
    return evs


# as decrypt_events gives them: each with its record's seq
EVENTS = [ev | {"seq": i} for i, ev in enumerate([
    SESSION | {"time": 1.0}, *call("c-lost", "create_issue", result=False, t=2.0),
    *call("c-ok", "read_issue", result=True, t=3.0)])]


class TestShow:
    def test_intents_without_a_result_are_listed(self) -> None:
        """Only the call whose intent no result record follows is reported."""
        assert ["c-lost"] == [ev["correlation_id"] for ev in no_result(EVENTS)]

    def test_a_later_result_settles_an_earlier_intent(self) -> None:
        """An approved call that ran after its approval_pending answer has its remote_result:
        a result record, though the agent never collected it."""
        events = [*call("c-1", "create_issue", result=False, t=1.0),
                  {"type": "remote_result", "correlation_id": "c-1", "category": "success", "time": 2.0}]
        assert [] == no_result(events)

    def test_render_names_the_call_and_says_so(self) -> None:
        """The text view ends with the calls whose outcome is unknown, and why."""
        text = render(EVENTS)
        assert f"calls with no result record (1): {NO_RESULT}" in text
        assert 'c-lost create_issue target="create_issue on tracker"' in text
        one = render(EVENTS, "c-lost")
        assert one.splitlines()[0] == f"correlation c-lost: 2 events; {NO_RESULT}"
        assert NO_RESULT not in render(EVENTS, "c-ok")

    def test_verify_is_not_concerned(self, tmp_path: Path) -> None:
        """A log whose last call has no result record is intact: the chain is whole."""
        assert verify(make_log(tmp_path, EVENTS).log).intact


class TestShowCommand:
    @pytest.fixture
    def home(self, tmp_path: Path, monkeypatch):
        files = make_log(tmp_path / "h", EVENTS)
        vh = VaultHome(tmp_path / "h")
        fake = types.ModuleType("vault.store.keystore")

        class KeyStore:
            def __init__(self, h: VaultHome) -> None:
                pass

            def derive(self, purpose: str) -> bytes:
                return files.key

        fake.KeyStore = KeyStore  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vault.store.keystore", fake)
        return vh

    def test_correlation_json_says_outcome_unknown(self, home, capsys) -> None:
        """--correlation --json carries "outcome": "outcome unknown (no result record)"."""
        assert 0 == main(["audit", "show", "--home", str(home.root), "--correlation", "c-lost", "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert (NO_RESULT, ["call_requested", "intent"]) == (doc["outcome"], [e["type"] for e in doc["events"]])
        assert 0 == main(["audit", "show", "--home", str(home.root), "--correlation", "c-ok", "--json"])
        assert "outcome" not in json.loads(capsys.readouterr().out)

    def test_json_lists_them(self, home, capsys) -> None:
        """The whole-log JSON lists the correlation ids with no result record."""
        assert 0 == main(["audit", "show", "--home", str(home.root), "--json"])
        assert ["c-lost"] == json.loads(capsys.readouterr().out)["no_result"]


class TestTranscript:
    def test_an_intent_without_its_result_is_an_outcome_unknown_entry(self) -> None:
        """The runner's transcript shows the lost call in its place, outcome_unknown /
        reconcile_first, with the note; the answered call is as before."""
        t = from_audit(EVENTS, {7: 0}, [])
        lost, ok = t.entries
        assert ("c-lost", "outcome_unknown", "reconcile_first", NO_RESULT, True, 0) == (
            lost.correlation_id, lost.category, lost.retry, lost.note, lost.executed, lost.agent_index)
        assert (lost.operation, lost.target, lost.requested) == ("create_issue", "create_issue on tracker", 2.0)
        assert ("c-ok", "success", None) == (ok.correlation_id, ok.category, ok.note)
        assert lost.token() == ["create_issue", "outcome_unknown"]
        assert "note" not in ok.to_dict() and lost.to_dict()["note"] == NO_RESULT
