"""Audit events as typed models (issue #17): written strictly, read tolerantly, shown whole.

The shapes below are the daemon's, as it writes them (README "Audit log"); a
model must give back exactly that JSON. The last test runs a real daemon, a real
fake remote and fresh agent processes, with every event it writes validated
against its model (VAULTSIM_AUDIT_CHECK=full), and checks that `vaultsim audit
show` names the category of every call it answered.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from audit_daemon_helpers import agent_call, daemon_args, events, setup_remote
from audit_fixtures import make_log, sample_events
from helpers import Sandbox, stop_process
from vault.audit import decrypt_events
from vault.audit.adapter import open_audit
from vault.audit.show import correlation, describe, no_result, render, sessions
from vault.audit_events import (EVENT_ADAPTER, EVENT_MODELS, AuditEventError, Classification, Decision,
                                Intent, OtherEvent, RemoteResult, SessionOpened, check_event, check_fields,
                                read_event)
from vault.errors import AuditError
from vault.home import VaultHome

# one event of every type the daemon writes today, each with every field it can carry
TODAY: list[dict[str, Any]] = [
    {"type": "daemon_started", "pid": 10, "version": "0.1.0"},
    {"type": "session_opened", "session_id": "s-1", "agent": "stub", "pid": 11, "sid": 11, "pgid": 11,
     "run_id": "r-1", "client": {"name": "claude-code", "version": "1.2", "text": "claude-code 1.2",
                                 "claimed": True, "host_verified": False}},
    {"type": "session_closed", "session_id": "s-1", "reason": "process exited"},
    {"type": "call_requested", "correlation_id": "c-1", "session_id": "s-1", "operation": "create_issue",
     "risk": "create", "target": "create_issue on tracker"},
    {"type": "prompt_unroutable", "correlation_id": "c-0", "operation": "create_issue", "owner": None},
    {"type": "prompt_shown", "request_id": "q-1", "correlation_id": "c-1", "operation": "create_issue",
     "risk": "create", "session_id": "s-1", "mode": "per_call", "scope": "create_issue on tracker",
     "repeat": False},
    {"type": "decision", "request_id": "q-1", "correlation_id": "c-1", "decision": "deny", "approver": "alice",
     "asked": 1.0, "shown": 1.5, "detail": None, "decided": 2.0, "detail_viewed": False, "reason": "no"},
    {"type": "decision", "request_id": "q-2", "correlation_id": "c-2", "decision": "withdrawn", "by": "agent",
     "was": "pending"},
    {"type": "grant_created", "session_id": "s-1", "scope": "create_issue on tracker", "grant_id": "g-1"},
    {"type": "grant_ended", "session_id": "s-1", "scope": "create_issue on tracker", "grant_id": "g-1",
     "reason": "ttl"},
    {"type": "lock", "by": "alice", "epoch": 1, "pending_denied": 0, "grants_ended": 1},
    {"type": "unlock", "by": "alice", "epoch": 1},
    {"type": "intent", "correlation_id": "c-1", "operation": "create_issue", "target": "create_issue on tracker",
     "idempotency_key": False},
    {"type": "client_timeout", "correlation_id": "c-1", "phase": "read"},
    {"type": "remote_result", "correlation_id": "c-1", "category": "success", "remote_touched": True,
     "diagnostic_id": None, "reconciled": None},
    {"type": "reconciliation", "correlation_id": "c-9", "category": "success", "remote_touched": True,
     "diagnostic_id": None, "reconciled": "found", "lookup_of": "c-1"},
    {"type": "classification", "correlation_id": "c-1", "session_id": "s-1", "operation": "create_issue",
     "category": "success", "retry": "none", "diagnostic_id": None, "resumed": False, "remote_touched": True},
    {"type": "approver_attempt", "method": "approver.hello", "pid": 12, "sid": 12, "pgid": 12,
     "exe": "/usr/bin/python3", "accepted": False, "reason": "refused: ...", "name": None, "request_id": None},
    {"type": "session_refused", "session_id": "s-1", "method": "call", "operation": "create_issue", "pid": 13,
     "sid": 12, "pgid": 12, "exe": "/usr/bin/python3", "owner_pid": 12, "reason": "not_owner", "count": 1},
    {"type": "connection_refused", "pid": 14, "sid": 14, "pgid": 14, "exe": "/usr/bin/python3", "tree_pid": 12,
     "held": 1024, "count": 1},
    {"type": "request_refused", "pid": 14, "sid": 14, "pgid": 14, "exe": "/usr/bin/python3", "tree_pid": 12,
     "limit": "in_progress", "where": "connection", "at_most": 64, "count": 1},
    {"type": "status_asked", "pid": 14, "sid": 12, "pgid": 12, "exe": "/usr/bin/python3", "count": 1,
     "asked": 1700000000.5, "lineage": [[14, 50.1], [12, 49.0]]},
    {"type": "unknown_operation", "session_id": "s-1", "method": "call", "operation": "drop_database",
     "count": 1},
    {"type": "foreign_reference", "session_id": "s-1", "method": "call.resume", "whose": "other", "owner": "alpha",
     "owner_run": True, "count": 1},
    {"type": "foreign_reference", "session_id": "s-1", "method": "lookup", "whose": "unknown",
     "operation": "create_issue", "count": 2},
    {"type": "foreign_reference", "session_id": "s-1", "method": "lookup", "whose": "other", "owner": "alpha",
     "owner_run": True, "operation": "create_issue", "count": 3, "by": "idempotency_key", "key_lookup": 1},
    {"type": "call_requested", "correlation_id": "c-2", "session_id": "s-1", "operation": "create_issue",
     "risk": "create", "target": "create_issue on tracker", "key_lookup": 1},
    {"type": "prompt_stats", "run_id": "r-1", "prompts": 2, "by_operation": {"create_issue": 2},
     "by_risk": {"create": 2}, "scopes_asked": {"x": 2}, "scopes_granted": {}, "decisions": {"deny": 2},
     "time_to_decision_ms": {"count": 2, "p50": 10.0, "max": 12.0}, "repeated_scope_prompts": 0,
     "read_prompts": 0, "destructive_session_grants": 0, "unroutable": 0, "locked_refusals": 0,
     "fatigue": {"rubber_stamp_s": 1.0}},
    {"type": "segment_started", "previous": "audit.000000000000.log"},
    {"type": "segment_started", "after_crash": True},
    {"type": "log_recovered", "unanchored_records": 2, "torn_bytes": 17},
    {"type": "log_resumed", "failed": "audit log x failed (write: No space left on device (ENOSPC))",
     "failed_at": 1700000000.25, "halted_s": 3.5, "refused_calls": 4},
]


class TestWrite:
    @pytest.mark.parametrize("event", TODAY, ids=lambda e: e["type"])
    def test_every_shape_written_today_fits_its_model_and_dumps_back_unchanged(self, event) -> None:
        """check_event accepts today's dict; the model gives back the same JSON, key order included."""
        model = check_event(event)
        assert json.dumps(event) == json.dumps(model.to_event())
        assert type(model) is type(EVENT_ADAPTER.validate_python(event))

    def test_every_writable_type_is_covered_above(self) -> None:
        """No model without a shape in this file (dispatch_started is read, never written)."""
        assert set(EVENT_MODELS) - {"dispatch_started"} == {e["type"] for e in TODAY}

    def test_a_built_model_writes_only_what_it_was_given(self) -> None:
        """A producer's model: absent fields stay absent, a None given is written as null."""
        assert {"type": "decision", "request_id": "q", "correlation_id": "c", "decision": "expired"} == \
            Decision(request_id="q", correlation_id="c", decision="expired").to_event()
        assert {"type": "intent", "correlation_id": "c", "target": None} == \
            Intent(correlation_id="c", target=None).to_event()

    @pytest.mark.parametrize("event, why", [
        ({"type": "intnet", "correlation_id": "c"}, "unknown audit event type 'intnet'"),
        ({"correlation_id": "c"}, "unknown audit event type NoneType"),
        ({"type": "classification", "correlation_id": "c", "categroy": "success"}, "categroy"),
        ({"type": "classification", "correlation_id": "c"}, "category"),
        ({"type": "intent", "correlation_id": "c", "time": 1.0}, "time"),
        ({"type": "remote_result", "correlation_id": "c", "status_class": "2xx"}, "status_class"),
        ({"type": "dispatch_started", "correlation_id": "c"}, "unknown audit event type"),
    ])
    def test_a_producer_typo_is_refused_by_both_checks(self, event, why) -> None:
        """Unknown type, misspelt, missing, record-owned or legacy field: an AuditEventError naming it."""
        for check in (check_fields, check_event):
            with pytest.raises(AuditEventError, match=why) as info:
                check(event)
            assert isinstance(info.value, AuditError)

    def test_the_full_check_refuses_a_value_of_the_wrong_type_without_echoing_it(self) -> None:
        secret = "CANARY-value-never-echoed"
        with pytest.raises(AuditEventError) as info:
            check_event({"type": "intent", "correlation_id": "c", "idempotency_key": secret})
        assert "idempotency_key" in info.value.message and secret not in info.value.message

    def test_models_are_frozen(self) -> None:
        with pytest.raises(ValidationError):
            Intent(correlation_id="c").correlation_id = "d"  # type: ignore[misc]


class TestSink:
    def test_the_daemons_sink_refuses_a_misspelt_event_and_stays_usable(self, tmp_path: Path) -> None:
        """open_audit (the daemon's sink) checks dicts; nothing is written for a bad one, the next is."""
        home = VaultHome(tmp_path / "h").ensure()
        key = os.urandom(32)
        w = open_audit(home, key)
        try:
            with pytest.raises(AuditEventError, match="opreation"):
                w.append_sync({"type": "intent", "correlation_id": "c", "opreation": "x"})
            assert 0 == w.append_sync(Intent(correlation_id="c", operation="read_issue", target="t",
                                             idempotency_key=True))
            assert 1 == w.append_sync({"type": "unlock", "by": "alice", "epoch": 0})
        finally:
            w.close()
        got = decrypt_events(home.audit_log, key)
        assert [("intent", 0, True), ("unlock", 1, None)] == [
            (e["type"], e["seq"], e.get("idempotency_key")) for e in got]

    def test_the_plain_writer_still_writes_any_json_object(self, tmp_path: Path) -> None:
        """The log format does not depend on what events say (AuditWriter.open: check off)."""
        files = make_log(tmp_path, [{"type": "x", "i": 1}, {"i": 2}])
        assert [{"type": "x", "i": 1}, {"i": 2}] == [
            {k: v for k, v in e.items() if k not in ("seq", "time")} for e in decrypt_events(files.log, files.key)]


class TestRead:
    def test_an_older_logs_shapes_still_read(self) -> None:
        """Own time kept, status_class read, dispatch_started known, unknown fields ignored."""
        old = read_event({"seq": 3, "time": 9.0, "type": "remote_result", "correlation_id": "c",
                          "status_class": "2xx", "time_ms": 4, "future_field": [1]})
        assert isinstance(old, RemoteResult)
        assert (3, 9.0, "2xx", None) == (old.seq, old.time, old.status_class, old.category)
        assert "dispatch_started" == read_event({"seq": 1, "time": 1.0, "type": "dispatch_started",
                                                 "correlation_id": "c"}).type
        # an older classification named its session on the request only
        told = read_event({"seq": 4, "time": 2.0, "type": "classification", "correlation_id": "c",
                           "category": "success", "retry": "none"})
        assert isinstance(told, Classification) and told.session_id is None

    def test_an_unknown_or_misfit_event_reads_as_other_with_its_fields(self) -> None:
        new = read_event({"seq": 1, "time": 1.0, "type": "quota_warning", "correlation_id": "c", "left": 3})
        assert isinstance(new, OtherEvent)
        assert ("quota_warning", {"correlation_id": "c", "left": 3}) == (new.type, new.fields)
        odd = read_event({"seq": 2, "time": 1.0, "type": "session_opened", "session_id": 5})
        assert isinstance(odd, OtherEvent) and {"session_id": 5} == odd.fields
        assert "#1 quota_warning correlation_id=c left=3" in describe(
            {"seq": 1, "time": 1.0, "type": "quota_warning", "correlation_id": "c", "left": 3})

    def test_the_projections_read_the_sample_conversation(self) -> None:
        """sessions, correlation and no_result over the fixtures' events (built through the models)."""
        evs = [{"seq": i, "time": 100.0 + i, **e} for i, e in enumerate(sample_events(9))]
        assert [("s-1", "stub", 1, "client closed")] == [
            (r["session_id"], r["agent"], r["calls"], r["close_reason"]) for r in sessions(evs)]
        assert ["call_requested", "prompt_shown", "decision", "intent", "classification", "reconciliation",
                "classification"] == [e["type"] for e in correlation(evs, "c-1")]
        for ev in sample_events(9):  # the fixture writes what the daemon writes, plus its index
            check_event({k: v for k, v in ev.items() if k != "n"})
        assert [] == no_result(evs)
        assert isinstance(read_event(evs[0]), SessionOpened)


class TestRealDaemon:
    def test_audit_show_names_the_category_of_every_call(self, sandbox: Sandbox, monkeypatch) -> None:
        """A real daemon (every event validated against its model), calls of five categories:
        each call's category is in `vaultsim audit show`, on its correlation's classification line."""
        url = setup_remote(sandbox)
        sandbox.write("auto-policy.yaml", "default: {mode: auto}\noperations:\n"
                      "  delete_release: {mode: deny}\n  create_issue: {mode: per_call}\n")
        monkeypatch.setenv("VAULTSIM_AUDIT_CHECK", "full")  # sandbox.env is a copy of os.environ
        daemon = sandbox.start_daemon(*daemon_args(sandbox, url))
        calls = agent_call(sandbox, (
            "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"
            "out(client.call('read_issue', {'issue_id': 'ISS-404'}))\n"
            "out(client.call('delete_release', {'release_id': 'REL-1'}))\n"
            "out(client.call('create_issue', {'title': 'nobody to ask'}))\n"))
        assert 0 == sandbox.vaultsim("lock").returncode
        calls += agent_call(sandbox, "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n")
        assert 0 == sandbox.vaultsim("unlock").returncode
        told = {c["correlation_id"]: c["category"] for c in calls}
        assert {"success", "authorization_denied", "approval_unroutable", "vault_locked"} <= set(told.values())
        assert len(set(told.values())) >= 5, told  # the unknown issue: a failure category of its own
        stop_process(daemon)
        assert "no longer serves calls" not in (sandbox.root / "daemon.stderr").read_text()
        logged = events(sandbox)  # every event the daemon wrote reads as its own model
        assert not [e for e in logged if isinstance(read_event(e), OtherEvent)]
        out = sandbox.vaultsim("audit", "show")
        assert 0 == out.returncode, out.stderr
        for cid, category in told.items():
            lines = [ln for ln in out.stdout.splitlines() if " classification " in ln and f"correlation_id={cid}" in ln]
            assert len(lines) == 1 and f"category={category}" in lines[0], (cid, category, out.stdout)
            one = sandbox.vaultsim("audit", "show", "--correlation", cid)
            assert f"category={category}" in one.stdout, one.stdout
        assert render(logged).count("category=") >= len(told)
