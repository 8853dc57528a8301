"""Show (with the key): decrypt, and the sessions / activity / correlation projections."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit_fixtures import FakeClock, make_log, sample_events
from vault.audit import activity, correlation, decrypt_events, sessions
from vault.audit.show import describe, render
from vault.errors import AuditError, BadInput

EVENTS: list[dict[str, Any]] = [
    {"type": "session_opened", "session_id": "s-1", "agent": "stub", "pid": 101, "run_id": "r-9"},
    {"type": "call_requested", "correlation_id": "c-1", "session_id": "s-1", "operation": "delete_release",
     "risk": "delete", "target": "api/releases/7"},
    {"type": "prompt_shown", "request_id": "q-1", "correlation_id": "c-1", "scope": "delete_release:api"},
    {"type": "session_opened", "session_id": "s-2", "agent": "other", "pid": 202, "run_id": "r-9"},
    {"type": "call_requested", "correlation_id": "c-2", "session_id": "s-2", "operation": "read_issue",
     "risk": "read", "target": "api/issues/1"},
    {"type": "decision", "request_id": "q-1", "decision": "deny", "approver": "alice"},
    {"type": "classification", "correlation_id": "c-1", "category": "approval_denied", "retry": "never"},
    {"type": "intent", "correlation_id": "c-2", "operation": "read_issue", "target": "api/issues/1"},
    {"type": "session_closed", "session_id": "s-1", "reason": "process exited"},
    {"type": "grant_ended", "session_id": "s-1", "scope": "create_issue:api", "reason": "process exited"},
    {"type": "lock", "by": "alice"},
    {"type": "custom_thing", "answer": 42},
]


@pytest.fixture
def log(tmp_path: Path):
    return make_log(tmp_path, EVENTS)


class TestDecrypt:
    def test_round_trip_in_seq_order(self, log) -> None:
        """Every event comes back, in order, with its seq and a time."""
        events = decrypt_events(log.log, log.key)
        assert list(range(len(EVENTS))) == [ev["seq"] for ev in events]
        assert EVENTS == [{k: v for k, v in ev.items() if k not in ("seq", "time")} for ev in events]
        assert all(isinstance(ev["time"], float) for ev in events)

    def test_event_time_wins_but_seq_is_the_records(self, tmp_path: Path) -> None:
        """An event's own time is kept; a forged 'seq' field cannot override the record's."""
        files = make_log(tmp_path, [{"type": "x", "time": 5.0, "seq": 99}])
        (ev,) = decrypt_events(files.log, files.key)
        assert (0, 5.0) == (ev["seq"], ev["time"])

    def test_wrong_key(self, log) -> None:
        """Another key cannot read the log: AuditError, not garbage."""
        with pytest.raises(AuditError, match="wrong key"):
            decrypt_events(log.log, os.urandom(32))

    def test_moved_record_refused(self, log) -> None:
        """A record whose seq/prev were rewritten fails its AEAD tag (AAD binds them)."""
        lines = log.lines()
        from audit_fixtures import rechain
        # drop record 1 and rechain: record 2 now claims seq 2 but prev of record 0
        log.write_lines(rechain([ln for ln in lines if b'"seq":1,' not in ln]))
        with pytest.raises(AuditError, match="cannot decrypt record 2"):
            decrypt_events(log.log, log.key)

    def test_torn_tail_ignored(self, log) -> None:
        """A torn last line (a writer died mid-write) is not an event."""
        log.log.write_bytes(log.log.read_bytes() + b'{"seq":12,"ti')
        assert len(EVENTS) == len(decrypt_events(log.log, log.key))

    def test_missing_log(self, tmp_path: Path) -> None:
        """No log is bad input."""
        with pytest.raises(BadInput):
            decrypt_events(tmp_path / "none.log", os.urandom(32))

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in ("seq", "time")),
        st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3),
                     max_leaves=8),
        max_size=5), min_size=1, max_size=6))
    def test_any_json_event_round_trips(self, events: list[dict[str, Any]]) -> None:
        """Any JSON object (unicode, nesting) comes back exactly."""
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            files = make_log(Path(d), events)
            back = decrypt_events(files.log, files.key)
        assert events == [{k: v for k, v in ev.items() if k not in ("seq", "time")} for ev in back]


class TestProjections:
    def test_sessions(self, log) -> None:
        """One row per session: who, which process, when opened/closed, how many calls."""
        rows = sessions(decrypt_events(log.log, log.key))
        assert [("s-1", "stub", 101, "r-9", True, 1), ("s-2", "other", 202, "r-9", False, 1)] == [
            (r["session_id"], r["agent"], r["pid"], r["run_id"], r["closed"] is not None, r["calls"])
            for r in rows]

    def test_correlation_includes_decisions_on_its_prompts(self, log) -> None:
        """--correlation c-1 shows the request, its prompt, the decision on it, the classification."""
        picked = correlation(decrypt_events(log.log, log.key), "c-1")
        assert ["call_requested", "prompt_shown", "decision", "classification"] == [ev["type"] for ev in picked]

    def test_correlation_in_time_order(self, tmp_path: Path) -> None:
        """Events are ordered by their time, then seq."""
        files = make_log(tmp_path, [{"type": "remote_result", "correlation_id": "c", "time": 20.0},
                                    {"type": "intent", "correlation_id": "c", "time": 10.0}])
        assert ["intent", "remote_result"] == [
            ev["type"] for ev in correlation(decrypt_events(files.log, files.key), "c")]

    def test_unknown_correlation_is_empty(self, log) -> None:
        """An id that never occurred gives no events."""
        assert [] == correlation(decrypt_events(log.log, log.key), "c-nope")

    def test_activity_renders_every_known_type(self, tmp_path: Path) -> None:
        """Each vocabulary event gets a line with its fields; unknown types show all fields."""
        files = make_log(tmp_path, EVENTS + sample_events(9), clock=FakeClock())
        lines = activity(decrypt_events(files.log, files.key))
        assert len(EVENTS) + 9 == len(lines)
        assert "decision request_id=q-1 decision=deny approver=alice" in lines[5]
        assert "custom_thing answer=42" in lines[11]
        assert lines[0].startswith("2023-11-14T22:13:20.")  # FakeClock's epoch, UTC

    def test_render_escapes_control_characters(self) -> None:
        """An agent name cannot put terminal escapes on the operator's screen."""
        ev = {"seq": 0, "time": 0.0, "type": "session_opened", "session_id": "s", "agent": "\x1b[2Jevil\n"}
        line = describe(ev)
        assert "\x1b" not in line and "\n" not in line and "\\x1b[2Jevil\\n" in line
        assert "\x1b" not in render([ev])

    def test_render_text(self, log) -> None:
        """The text view has a sessions section and an activity section."""
        text = render(decrypt_events(log.log, log.key))
        assert text.startswith("sessions (2)") and f"activity ({len(EVENTS)} events)" in text
        text = render(decrypt_events(log.log, log.key), "c-1")
        assert text.startswith("correlation c-1: 4 events")
