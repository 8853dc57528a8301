"""The approver socket's notifications as models (vault.wire): what a real daemon sends parses into
them with the fields the readers use, a reader tolerates fields it does not know, and a notification
missing a required field is a clear error that no reader crashes on."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
from typing import Any

import pytest
from pydantic import ValidationError

from helpers import PY, ROOT, Sandbox
from tui.state import TuiState
from tui_fixtures import start_agent
from vault.client import AsyncRpcClient, connect_approver
from vault.home import VaultHome
from vault.runner.transcript import from_activity
from vault.approvers.scripted import ApproverScript, ScriptedApprover
from vault.wire import (MODELS, Activity, ApprovalRequested, ApprovalSettled, GrantCreated, SessionOpened,
                        VaultLocked, WireError, parse_notification)

TOKEN = "tracker-token-value"
# the approval.requested fields, in the order the wire protocol has always carried them
REQUESTED_FIELDS = ["request_id", "agent", "pid", "session_id", "run_id", "operation", "risk", "params",
                    "scope", "session_scope", "mode", "allow_session_offered", "owner", "deadline",
                    "created", "correlation_id"]


class Recorder:
    """An approver connection's notifications as received, with a wait for one of them."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self._new = asyncio.Event()

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        self.notes.append((method, params))
        self._new.set()

    async def next(self, method: str, timeout: float = 60) -> dict[str, Any]:
        """The first `method` notification received (waits for it, up to `timeout`)."""
        async def first() -> dict[str, Any]:
            while True:
                for m, p in self.notes:
                    if m == method:
                        return p
                self._new.clear()
                await self._new.wait()
        return await asyncio.wait_for(first(), timeout)


async def live(sandbox: Sandbox, name: str = "ci") -> tuple[AsyncRpcClient, Recorder]:
    """A real remote, a real daemon pointed at it, and an approver connection subscribed to it."""
    _, url = sandbox.start_remote({"tracker_token": TOKEN})
    sandbox.set_secret("tracker_token", TOKEN)
    sandbox.start_daemon("--remote", url)
    rec = Recorder()
    client, _ = await connect_approver(VaultHome(sandbox.home), name, rec)
    return client, rec


class TestLiveDaemon:
    @pytest.mark.timeout(180)
    async def test_requested_and_settled_parse_with_the_fields_readers_use(self, sandbox: Sandbox) -> None:
        """A prompt and its allow_session decision, from a real daemon, read into their models; written
        back, each gives the very params received (names, order, values)."""
        client, rec = await live(sandbox, "alice")
        agent = await start_agent(sandbox, "call('create_issue', title='flaky test')\n", name="triage")
        try:
            raw = await rec.next("approval.requested")
            req = parse_notification("approval.requested", raw)
            assert isinstance(req, ApprovalRequested)
            assert ("triage", agent.pid, "run-1", "create_issue", "create", {"title": "flaky test"}) == (
                req.agent, req.pid, req.run_id, req.operation, req.risk, req.params)
            assert ("session", True, None) == (req.mode, req.allow_session_offered, req.owner)
            assert req.scope and req.session_scope.startswith(req.scope)
            assert req.request_id.startswith("r") and req.correlation_id and req.session_id
            assert req.created <= req.deadline
            assert REQUESTED_FIELDS == list(raw)
            assert raw == req.to_params()

            await client.request("decide", request_id=req.request_id, decision="allow_session")
            raw_settled = await rec.next("approval.settled")
            settled = parse_notification("approval.settled", raw_settled)
            assert ApprovalSettled(request_id=req.request_id, state="allowed", decision="allow_session",
                                   by="alice") == settled
            assert raw_settled == settled.to_params()
            assert "success" == (await agent.next())["category"]
            activity = parse_notification("activity", await rec.next("activity"))
            assert isinstance(activity, Activity)
            assert (req.correlation_id, "success", agent.pid) == (activity.correlation_id, activity.category,
                                                                   activity.pid)
            await agent.finish()
        finally:
            agent.kill()
            await agent.proc.wait()
            await client.close()
        grant = parse_notification("grant.created", await rec.next("grant.created"))
        opened = parse_notification("session.opened", await rec.next("session.opened"))
        assert isinstance(grant, GrantCreated) and isinstance(opened, SessionOpened)
        assert (req.session_id, req.scope, agent.pid) == (grant.session_id, grant.scope, grant.pid)
        assert (req.session_id, "triage") == (opened.session_id, opened.agent)
        # every notification of the run fits its model, and writes back as it came
        for method, params in rec.notes:
            note = parse_notification(method, params)
            assert note is not None and params == note.to_params(), method

    @pytest.mark.timeout(180)
    async def test_a_lock_settles_the_prompt_and_says_who_locked(self, sandbox: Sandbox) -> None:
        """A lock while a prompt waits: approval.settled (denied, locked, by whom), then vault.locked."""
        client, rec = await live(sandbox, "bob")
        agent = await start_agent(sandbox, "call('create_issue', title='x')\n")
        try:
            req = parse_notification("approval.requested", await rec.next("approval.requested"))
            assert isinstance(req, ApprovalRequested)
            await client.request("lock")
            settled = parse_notification("approval.settled", await rec.next("approval.settled"))
            locked = parse_notification("vault.locked", await rec.next("vault.locked"))
            assert "approval_denied" == (await agent.next())["category"]
        finally:
            agent.kill()
            await agent.proc.wait()
            await client.close()
        assert ApprovalSettled(request_id=req.request_id, state="denied", decision="locked", by="bob") == settled
        assert VaultLocked(locked=True, by="bob") == locked


def requested(**extra: Any) -> dict[str, Any]:
    """approval.requested params as a daemon sends them (plus `extra`)."""
    return {"request_id": "r-1", "agent": "stub", "pid": 4121, "session_id": "s-1", "run_id": "run-1",
            "operation": "create_issue", "risk": "create", "params": {"title": "x"},
            "scope": "create_issue on tracker", "session_scope": "create_issue on tracker until process 4121 exits",
            "mode": "session", "allow_session_offered": True, "owner": None, "deadline": 130.0,
            "created": 100.0, "correlation_id": "c-1", **extra}


class TestTolerantRead:
    def test_unknown_fields_are_dropped_not_refused(self) -> None:
        """A newer daemon's extra fields, at the top and in the client label, are ignored."""
        client = {"name": "claude-code", "text": "claude-code", "claimed": True, "host_verified": False,
                  "signed_by": "someone"}
        note = parse_notification("approval.requested", requested(priority="high", client=client))
        assert isinstance(note, ApprovalRequested) and note.client is not None
        assert ("r-1", "claude-code") == (note.request_id, note.client.text)
        assert "priority" not in note.to_params() and "signed_by" not in note.to_params()["client"]

    def test_fields_an_older_daemon_did_not_send_take_defaults(self) -> None:
        note = parse_notification("approval.requested", {"request_id": "r-1", "agent": "stub"})
        assert isinstance(note, ApprovalRequested)
        assert ("?", {}, False, None) == (note.operation, note.params, note.allow_session_offered, note.client)

    def test_a_method_this_version_does_not_know_is_none(self) -> None:
        assert parse_notification("approval.reminded", {"request_id": "r-1"}) is None

    @pytest.mark.parametrize(("method", "params", "field"), [
        ("approval.requested", {"agent": "stub", "operation": "create_issue"}, "request_id"),
        ("approval.settled", {"state": "allowed", "decision": "allow_once"}, "request_id"),
        ("approval.settled", {"request_id": "r-1"}, "state"),
        ("vault.locked", {"by": "alice"}, "locked"),
        ("activity", {"correlation_id": "c-1", "operation": "read_issue"}, "category"),
        ("grant.created", {"session_id": "s-1"}, "grant_id"),
    ], ids=["requested-id", "settled-id", "settled-state", "locked", "activity-category", "grant-id"])
    def test_a_missing_required_field_is_a_clear_error(self, method: str, params: dict[str, Any],
                                                       field: str) -> None:
        """The error names the method and the field."""
        with pytest.raises(WireError) as err:
            parse_notification(method, params)
        assert f"malformed {method} notification: {field}: field required" == err.value.message

    def test_the_error_never_quotes_a_value(self) -> None:
        """A value of the wrong type is named by its field; the value (maybe an agent's text) is not shown."""
        with pytest.raises(WireError) as err:
            parse_notification("approval.requested", requested(pid="canary-4f1d", deadline="canary-4f1d"))
        assert "pid:" in err.value.message and "deadline:" in err.value.message
        assert "canary" not in str(err.value)

    def test_params_that_are_not_an_object_are_refused(self) -> None:
        with pytest.raises(WireError):
            parse_notification("approval.settled", ["r-1", "allowed"])


class TestStrictWrite:
    def test_a_producer_must_give_every_field(self) -> None:
        """Writing, a field left out is an error (it would silently vanish from the wire)."""
        with pytest.raises(ValidationError, match="not given: decision"):
            ApprovalSettled(request_id="r-1", state="allowed")  # type: ignore[call-arg]

    def test_a_misspelt_field_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="not given: decision; unknown: decison"):
            ApprovalSettled(request_id="r-1", state="allowed", decison="deny")  # type: ignore[call-arg]

    def test_optional_fields_are_absent_when_none_others_are_null(self) -> None:
        """`by` and `client` are left out when none, as the daemon always did; `owner` and `run_id` are null."""
        settled = ApprovalSettled(request_id="r-1", state="expired", decision="expired", by=None)
        assert {"request_id": "r-1", "state": "expired", "decision": "expired"} == settled.to_params()
        req = ApprovalRequested.model_validate(requested(run_id=None))
        assert REQUESTED_FIELDS == list(req.to_params())
        assert (None, None) == (req.to_params()["owner"], req.to_params()["run_id"])

    def test_models_are_frozen(self) -> None:
        with pytest.raises(ValidationError):
            VaultLocked(locked=True, by="a").locked = False  # type: ignore[misc]

    def test_every_model_is_named_by_its_method(self) -> None:
        assert {"approval.requested", "approval.settled", "grant.created", "grant.ended", "vault.locked",
                "session.opened", "session.closed", "activity"} == set(MODELS)
        assert all(m.METHOD == name for name, m in MODELS.items())


class TestReadersSurviveAMalformedNotification:
    def test_tui_state_notes_it_and_keeps_going(self) -> None:
        """The approver's screen: the bad prompt is a line in the activity log, the good one a row."""
        state = TuiState()
        state.apply("approval.requested", {"agent": "stub", "operation": "delete_release"}, 5.0)
        state.apply("approval.requested", requested(), 6.0)
        state.apply("approval.settled", {"decision": "deny"}, 7.0)
        assert ["r-1"] == list(state.pending)
        notes = [line.text for line in state.activity]
        assert "ignored: malformed approval.requested notification: request_id: field required" == notes[0]
        assert "ignored: malformed approval.settled notification: request_id: field required; " \
               "state: field required" == notes[-1]

    def test_tui_link_up_skips_a_bad_pending_entry(self) -> None:
        state = TuiState()
        state.link_up([{"pid": 1}, requested()], locked=False, now=3.0)
        assert (True, ["r-1"]) == (state.connected, list(state.pending))

    def test_scripted_approver_reports_it_and_answers_the_next(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The CI approver says on stderr what it ignored, and still answers the next prompt."""
        log = io.StringIO()
        approver = ScriptedApprover(ApproverScript.model_validate({"rules": [{"decide": "allow_once"}]}), log)

        async def feed() -> None:
            approver.on_notify("approval.requested", {"agent": "stub", "operation": "delete_release"})
            approver.on_notify("approval.requested", requested())
            await asyncio.gather(*approver.tasks)

        asyncio.run(feed())
        err = capsys.readouterr().err
        assert "ignored a prompt: malformed approval.requested notification: request_id: field required" in err
        assert [("r-1", "allow_once")] == [(d["request_id"], d["decision"])
                                           for d in map(json.loads, log.getvalue().splitlines())]

    def test_transcript_fallback_leaves_it_out(self) -> None:
        """The runner's activity fallback: the malformed activity is skipped, the good one is an entry."""
        notes = [("session.opened", {"session_id": "s-1", "agent": "stub", "pid": 41}),
                 ("activity", {"operation": "create_issue", "category": "success", "time": 1.0}),
                 ("activity", {"correlation_id": "c-2", "operation": "create_issue", "category": "success",
                               "session_id": "s-1", "time": 2.0})]
        t = from_activity(notes, [], {41: 0}, [(0.0, 4.0)])
        assert [("c-2", "stub", 0)] == [(e.correlation_id, e.agent, e.agent_index) for e in t.entries]


def test_the_wire_models_import_no_daemon_runner_rpc_or_textual() -> None:
    """The TUI imports vault.wire: it must bring in none of the daemon's parts, the runner or Textual."""
    code = "import sys, vault.wire\nprint(sorted(sys.modules))"
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(out.stdout.replace("'", '"'))
    banned = ("textual", "vault.runner", "vault.daemon.daemon", "vault.gate", "vault.jsonrpc", "vault.daemon.rpc_server")
    assert [] == [m for m in loaded if m.startswith(banned)]
