"""The daemon's producers build audit event models that write the bytes its dicts wrote (issue #17).

Until 2026-12 every producer (the gate, the call service, the session keeper,
the approver API, the daemon, its CLI) built a plain dict; now each builds the
event's model (vault.audit_events). The log's JSON is a user contract: each
pair below is one event as a producer built it then (the dict literal, its
optional fields added as the producer added them) and as it builds it now (the
model, with the same arguments), and the writer's encoding of both must be the
same bytes, key order included. Then: a producer cannot write the record's
``seq`` or ``time`` nor a legacy field, mypy refuses a misspelt field at a
producer, and the recorder still escapes an event whose text cannot be encoded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from vault import audit_events as A
from vault.audit.writer import _encode_event
from vault.daemon.approver_guard import attempt_event
from vault.daemon.peer import ProcessIdentity
from vault.daemon.recorder import _recordable, _unrecordable

ROOT = Path(__file__).resolve().parent.parent
CID, SID, RID, SCOPE = "c-0f3a", "s-1", "q-7", "create_issue on tracker"
TIMING = {"asked": 1.5, "shown": 1.75, "detail": None, "decided": 2.25, "detail_viewed": False}
CLIENT: dict[str, Any] = {"name": "claude-code", "version": "1.2", "text": "claude-code 1.2", "claimed": True,
                          "host_verified": False}
COUNTS: dict[str, Any] = {
    "prompts": 2, "by_operation": {"create_issue": 2}, "by_risk": {"create": 2}, "scopes_asked": {SCOPE: 2},
    "scopes_granted": {}, "decisions": {"deny": 2}, "time_to_decision_ms": {"count": 2, "p50": 10.0, "max": None},
    "repeated_scope_prompts": 0, "read_prompts": 0, "destructive_session_grants": 0, "unroutable": 0,
    "locked_refusals": 0, "fatigue": {"rubber_stamp_s": 1.0, "rubber_stamps": 0}}


def _decision_then(timing: bool, reason: str | None) -> dict[str, Any]:
    """The gate's decision dict as it was built (vault/gate/engine.py before the models)."""
    event: dict[str, Any] = {"type": "decision", "request_id": RID, "correlation_id": CID,
                             "decision": "deny" if reason else "allow_once", "approver": "alice"}
    if timing:
        event.update(TIMING)
    if reason:
        event["reason"] = reason
    return event


def _decision_now(timing: bool, reason: str | None) -> A.AuditEvent:
    given: dict[str, Any] = dict(TIMING) if timing else {}
    if reason:
        given["reason"] = reason
    return A.Decision(request_id=RID, correlation_id=CID, decision="deny" if reason else "allow_once",
                      approver="alice", **given)


def _classification_then(touched: bool | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "classification", "correlation_id": CID, "session_id": SID,
                             "operation": "create_issue", "category": "success", "retry": "none",
                             "diagnostic_id": None, "resumed": False}
    if touched is not None:
        event["remote_touched"] = touched
    return event


def _classification_now(touched: bool | None) -> A.AuditEvent:
    folded: dict[str, Any] = {} if touched is None else {"remote_touched": touched}
    return A.Classification(correlation_id=CID, session_id=SID, operation="create_issue", category="success",
                            retry="none", diagnostic_id=None, resumed=False, **folded)


def _session_then(client: dict[str, Any] | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "session_opened", "session_id": SID, "agent": "stub", "pid": 11, "sid": 11,
                             "pgid": 11, "run_id": None}
    if client is not None:
        event["client"] = client
    return event


def _session_now(client: dict[str, Any] | None) -> A.AuditEvent:
    label: dict[str, Any] = {} if client is None else {"client": client}
    return A.SessionOpened(session_id=SID, agent="stub", pid=11, sid=11, pgid=11, run_id=None, **label)


# (what, the dict a producer wrote, the model it builds now)
PAIRS: list[tuple[str, dict[str, Any], A.AuditEvent]] = [
    ("daemon_started", {"type": "daemon_started", "pid": 10, "version": "0.1.0"},
     A.DaemonStarted(pid=10, version="0.1.0")),
    ("session_opened", _session_then(None), _session_now(None)),
    ("session_opened with a client label", _session_then(CLIENT), _session_now(CLIENT)),
    ("session_closed", {"type": "session_closed", "session_id": SID, "reason": "process exited"},
     A.SessionClosed(session_id=SID, reason="process exited")),
    ("call_requested", {"type": "call_requested", "correlation_id": CID, "session_id": SID,
                        "operation": "create_issue", "risk": "create", "target": SCOPE},
     A.CallRequested(correlation_id=CID, session_id=SID, operation="create_issue", risk="create", target=SCOPE)),
    ("call_requested", {"type": "call_requested", "correlation_id": CID, "session_id": SID,
                        "operation": "create_issue", "risk": "create", "target": SCOPE, "key_lookup": 2},
     A.CallRequested(correlation_id=CID, session_id=SID, operation="create_issue", risk="create", target=SCOPE,
                     key_lookup=2)),
    ("call_requested, its sender's exited watched processes read", {
        "type": "call_requested", "correlation_id": CID, "session_id": SID, "operation": "create_issue",
        "risk": "create", "target": SCOPE, "gone": [4242]},
     A.CallRequested(correlation_id=CID, session_id=SID, operation="create_issue", risk="create", target=SCOPE,
                     gone=[4242])),
    ("session_opened with its lineage, kin and gone", {
        "type": "session_opened", "session_id": SID, "agent": "stub", "pid": 11, "sid": 11, "pgid": 11,
        "run_id": None, "lineage": [[11, 5.0], [9, 1.0]], "kin": [[10, 2.0]], "gone": [10]},
     A.SessionOpened(session_id=SID, agent="stub", pid=11, sid=11, pgid=11, run_id=None,
                     lineage=[(11, 5.0), (9, 1.0)], kin=[(10, 2.0)], gone=[10])),
    ("prompt_unroutable", {"type": "prompt_unroutable", "correlation_id": CID, "operation": "create_issue",
                           "owner": None},
     A.PromptUnroutable(correlation_id=CID, operation="create_issue", owner=None)),
    ("prompt_shown", {"type": "prompt_shown", "request_id": RID, "correlation_id": CID,
                      "operation": "create_issue", "risk": "create", "session_id": SID, "mode": "per_call",
                      "scope": SCOPE, "repeat": False},
     A.PromptShown(request_id=RID, correlation_id=CID, operation="create_issue", risk="create", session_id=SID,
                   mode="per_call", scope=SCOPE, repeat=False)),
    ("decision by a person", _decision_then(False, None), _decision_now(False, None)),
    ("decision with timings", _decision_then(True, None), _decision_now(True, None)),
    ("decision denied with a reason", _decision_then(True, "not today"), _decision_now(True, "not today")),
    ("decision denied, no timing", _decision_then(False, "no"), _decision_now(False, "no")),
    ("decision expired", {"type": "decision", "request_id": RID, "correlation_id": CID, "decision": "expired"},
     A.Decision(request_id=RID, correlation_id=CID, decision="expired")),
    ("decision withdrawn by the agent", {"type": "decision", "request_id": RID, "correlation_id": CID,
                                         "decision": "withdrawn", "by": "agent", "was": "pending"},
     A.Decision(request_id=RID, correlation_id=CID, decision="withdrawn", by="agent", was="pending")),
    ("decision withdrawn, its opener's exited ancestors read", {
        "type": "decision", "request_id": RID, "correlation_id": CID, "decision": "withdrawn", "by": "agent",
        "was": "pending", "session_id": SID, "gone": [4242]},
     A.Decision(request_id=RID, correlation_id=CID, decision="withdrawn", by="agent", was="pending",
                session_id=SID, gone=[4242])),
    ("grant_created", {"type": "grant_created", "session_id": SID, "scope": SCOPE, "grant_id": "g-1"},
     A.GrantCreated(session_id=SID, scope=SCOPE, grant_id="g-1")),
    ("grant_ended", {"type": "grant_ended", "session_id": SID, "scope": SCOPE, "grant_id": "g-1",
                     "reason": "revoked by alice"},
     A.GrantEnded(session_id=SID, scope=SCOPE, grant_id="g-1", reason="revoked by alice")),
    ("lock", {"type": "lock", "by": "alice", "epoch": 2, "pending_denied": 1, "grants_ended": 0},
     A.Lock(by="alice", epoch=2, pending_denied=1, grants_ended=0)),
    ("unlock", {"type": "unlock", "by": "alice", "epoch": 2}, A.Unlock(by="alice", epoch=2)),
    ("intent", {"type": "intent", "correlation_id": CID, "operation": "create_issue", "target": SCOPE,
                "idempotency_key": True},
     A.Intent(correlation_id=CID, operation="create_issue", target=SCOPE, idempotency_key=True)),
    ("client_timeout", {"type": "client_timeout", "correlation_id": CID, "phase": "connected"},
     A.ClientTimeout(correlation_id=CID, phase="connected")),
    ("remote_result", {"type": "remote_result", "correlation_id": CID, "category": "outcome_unknown",
                       "remote_touched": True, "diagnostic_id": "d-1", "reconciled": None},
     A.RemoteResult(correlation_id=CID, category="outcome_unknown", remote_touched=True, diagnostic_id="d-1",
                    reconciled=None)),
    ("reconciliation of a remembered call", {"type": "reconciliation", "correlation_id": "c-9",
                                             "category": "success", "remote_touched": True,
                                             "diagnostic_id": None, "reconciled": "found", "lookup_of": CID},
     A.Reconciliation(correlation_id="c-9", category="success", remote_touched=True, diagnostic_id=None,
                      reconciled="found", lookup_of=CID)),
    ("reconciliation of an unknown call", {"type": "reconciliation", "correlation_id": "c-9",
                                           "category": "success", "remote_touched": False,
                                           "diagnostic_id": None, "reconciled": "unknown"},
     A.Reconciliation(correlation_id="c-9", category="success", remote_touched=False, diagnostic_id=None,
                      reconciled="unknown")),
    ("classification", _classification_then(None), _classification_now(None)),
    ("classification folding the remote's result", _classification_then(True), _classification_now(True)),
    ("classification, remote untouched", _classification_then(False), _classification_now(False)),
    ("prompt_stats", {"type": "prompt_stats", "run_id": "r-1", **COUNTS},
     A.PromptStats.model_validate({"run_id": "r-1", **COUNTS})),
    ("session_refused", {"type": "session_refused", "session_id": "s-1", "method": "call.resume",
                         "operation": None, "pid": 13, "sid": 12, "pgid": 12, "exe": "/usr/bin/python3",
                         "owner_pid": 12, "reason": "closed", "count": 64},
     A.SessionRefused(session_id="s-1", method="call.resume", operation=None, pid=13, sid=12, pgid=12,
                      exe="/usr/bin/python3", owner_pid=12, reason="closed", count=64)),
    ("connection_refused", {"type": "connection_refused", "pid": 14, "sid": 14, "pgid": 14,
                            "exe": "/usr/bin/python3", "tree_pid": 12, "held": 1024, "count": 64},
     A.ConnectionRefused(pid=14, sid=14, pgid=14, exe="/usr/bin/python3", tree_pid=12, held=1024, count=64)),
    ("request_refused", {"type": "request_refused", "pid": 14, "sid": 14, "pgid": 14, "exe": "/usr/bin/python3",
                         "tree_pid": 12, "limit": "sessions", "where": "process", "at_most": 256, "count": 64},
     A.RequestRefused(pid=14, sid=14, pgid=14, exe="/usr/bin/python3", tree_pid=12, limit="sessions", where="process",
                      at_most=256, count=64)),
    ("status_asked", {"type": "status_asked", "pid": 14, "sid": 12, "pgid": 12, "exe": "/usr/bin/python3",
                      "count": 16, "asked": 1700000000.5, "lineage": [[14, 50.1]]},
     A.StatusAsked(pid=14, sid=12, pgid=12, exe="/usr/bin/python3", count=16, asked=1700000000.5,
                   lineage=[(14, 50.1)])),
    ("unknown_operation", {"type": "unknown_operation", "session_id": "s-1", "method": "lookup",
                           "operation": "drop_database", "count": 64},
     A.UnknownOperation(session_id="s-1", method="lookup", operation="drop_database", count=64)),
    ("foreign_reference", {"type": "foreign_reference", "session_id": "s-1", "method": "call.resume",
                           "whose": "other", "owner": "alpha", "owner_run": True, "count": 3},
     A.ForeignReference(session_id="s-1", method="call.resume", whose="other", owner="alpha", owner_run=True,
                        count=3)),
    ("foreign_reference", {"type": "foreign_reference", "session_id": "s-1", "method": "lookup",
                           "whose": "other", "owner": "alpha", "owner_run": True, "operation": "create_issue",
                           "count": 1, "by": "idempotency_key", "key_lookup": 2},
     A.ForeignReference(session_id="s-1", method="lookup", whose="other", owner="alpha", owner_run=True,
                        operation="create_issue", count=1, by="idempotency_key", key_lookup=2)),
    ("text that needs JSON escapes", {"type": "session_closed", "session_id": 's-"\\\n\u00e9\u2028',
                                      "reason": "\x00 \U0001f600"},
     A.SessionClosed(session_id='s-"\\\n\u00e9\u2028', reason="\x00 \U0001f600")),
]


class TestSameBytes:
    @pytest.mark.parametrize("then, now", [(t, n) for _, t, n in PAIRS], ids=[w for w, _, _ in PAIRS])
    def test_the_model_writes_the_bytes_the_dict_wrote(self, then: dict[str, Any], now: A.AuditEvent) -> None:
        assert _encode_event(then) == _encode_event(now.to_event())
        assert list(then) == list(now.to_event())  # key order, spelt out

    def test_every_type_the_daemon_writes_is_covered(self) -> None:
        """approver_attempt is below (its producer is a function); the writer's own
        (segment_started, log_recovered, log_resumed) are models."""
        written = set(A.EVENT_MODELS) - {"dispatch_started", "segment_started", "log_recovered", "log_resumed"}
        assert written == {then["type"] for _, then, _ in PAIRS} | {"approver_attempt"}

    @pytest.mark.parametrize("accepted", [True, False])
    def test_an_approver_attempt_writes_what_it_wrote(self, accepted: bool) -> None:
        """attempt_event (vault.daemon.approver_guard) against the dict it built; name and
        request_id as sent, bounded, or null when not text."""
        caller = ProcessIdentity(pid=-1, uid=0, create_time=0.0, exe="/usr/bin/python3")
        then = {"type": "approver_attempt", "method": "decide", "pid": -1, "sid": -1, "pgid": -1,
                "exe": "/usr/bin/python3", "accepted": accepted, "reason": "refused: why",  # as given (an accepted hello's number)
                "name": "n" * 128, "request_id": None}
        now = attempt_event("decide", caller, accepted, "refused: why", "n" * 500, 42)
        assert isinstance(now, A.ApproverAttempt)
        assert _encode_event(then) == _encode_event(now.to_event())


class TestStrictOnWrite:
    @pytest.mark.parametrize("field", ["seq", "time"])
    def test_a_producer_cannot_set_the_records_seq_or_time(self, field: str) -> None:
        with pytest.raises(ValidationError, match=f"{field} is read, never written"):
            A.Intent(correlation_id=CID, **{field: 3})

    def test_a_legacy_field_is_read_never_written(self) -> None:
        with pytest.raises(ValidationError, match="status_class is read, never written"):
            A.RemoteResult(correlation_id=CID, status_class="2xx")  # type: ignore[call-arg]
        old = A.read_event({"seq": 1, "time": 2.0, "type": "remote_result", "correlation_id": CID,
                            "status_class": "2xx"})
        assert isinstance(old, A.RemoteResult) and (1, 2.0, "2xx") == (old.seq, old.time, old.status_class)
        assert "status_class" in old.to_event() and "seq" not in old.to_event()

    def test_a_misspelt_field_missing_field_or_wrong_value_is_refused_when_built(self) -> None:
        with pytest.raises(ValidationError, match="categroy"):
            A.Classification(correlation_id=CID, categroy="success")  # type: ignore[call-arg]
        with pytest.raises(ValidationError, match="correlation_id"):
            A.Intent(operation="x")  # type: ignore[call-arg]
        secret = "CANARY-never-echoed"
        with pytest.raises(ValidationError) as info:
            A.Intent(correlation_id=CID, idempotency_key=secret)  # type: ignore[arg-type]
        assert secret not in str(info.value)
        with pytest.raises(ValidationError):
            A.PromptStats.model_validate({"run_id": "r", **COUNTS, "prompt": 1})

    @pytest.mark.timeout(600)
    def test_mypy_refuses_a_misspelt_field_at_a_producer(self, tmp_path: Path) -> None:
        """pydantic's models are dataclass_transforms: mypy --strict checks a producer's
        keyword arguments (names, types, the record's fields)."""
        producer = tmp_path / "producer.py"
        producer.write_text(textwrap.dedent("""\
            from vault import audit_events as A

            def events(cid: str) -> list[A.AuditEvent]:
                return [A.Intent(correlation_id=cid, opreation="read_issue"),
                        A.Intent(correlation_id=cid, idempotency_key="yes"),
                        A.CallRequested(correlation_id=cid, seq=1),
                        A.Classification(correlation_id=cid, category="success"),
                        A.Classification(correlation_id=cid)]
            """))
        out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(producer)],
                             cwd=ROOT, capture_output=True, text=True, timeout=540)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith(str(producer))]
        assert any(':4: error: Unexpected keyword argument "opreation"' in ln for ln in lines), out.stdout
        assert any(":5: error:" in ln and "idempotency_key" in ln for ln in lines), out.stdout
        assert any(':6: error: Unexpected keyword argument "seq"' in ln for ln in lines), out.stdout
        assert any(':8: error: Missing named argument "category"' in ln for ln in lines), out.stdout
        assert not any(":7:" in ln for ln in lines), out.stdout  # the correct one passes


class TestEscaped:
    def test_a_model_whose_text_cannot_be_encoded_is_recorded_escaped(self) -> None:
        """The recorder's fallback for an event (not the log) at fault takes models too."""
        event = A.CallRequested(correlation_id=CID, session_id=SID, operation="create_issue",
                                target="release \ud800")
        why = _unrecordable(event)
        assert "not Unicode" in why
        fixed = _recordable(event, why)
        assert "" == _unrecordable(fixed)
        assert ["type", "correlation_id", "session_id", "operation", "target", "recorded_as"] == list(fixed)
        assert "release \\ud800" == fixed["target"]
        A.check_fields(fixed)  # the sink's check of a dict still accepts it
