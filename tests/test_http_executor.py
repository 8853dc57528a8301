"""The HTTP executor against the real fake remote: one test per fault.

Each fault case makes four assertions (the article's matrix): the category and
retry instruction; the remote's state from the effect ledger (or why it has
none); the remote's event log holding the correlation id and what it observed;
and the canary credential absent from every surface an agent or a log sees.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from remote_fixtures import CATALOG, Harness, canary, credentials, diagnostics, harness_factory  # noqa: F401
from vault.executors.base import CallContext, ServiceConfig
from vault.executors.http import DIAG_BODY, HttpExecutor, _evidence, request_parts
from vault.executors.http_evidence import Attempt, Verdict
from vault.models import RETRY_FOR, Category
from vault.store.secret import Secret

ISSUE = ("create_issue", {"title": "disk full on ci-3"})


@dataclass(frozen=True)
class Case:
    fault: str
    op: str
    params: dict[str, Any]
    category: Category
    attempts: int  # attempts the remote saw for this logical operation
    effects: int  # effects it committed
    events: tuple[str, ...] = ()  # remote events that must appear for the correlation id
    final: str | None = None  # how the remote saw the exchange end: "response_sent:403", "connection_closed"
    violation: str | None = None  # the contract field the diagnostic must name
    deadline_s: float = 3.0


CASES = [
    # C01: nothing is sent, so the remote has no record at all
    Case("dns_failure", "read_issue", {"issue_id": "ISS-1"}, Category.local_failure, 0, 0),
    Case("connection_refused", "read_issue", {"issue_id": "ISS-1"}, Category.local_failure, 0, 0),
    Case("timeout_before_send", *ISSUE, Category.local_failure, 0, 0, deadline_s=0.3),
    # C03
    Case("permission_denied", "delete_release", {"release_id": "rel-1"}, Category.authorization_denied, 1, 0,
         ("received", "rejected"), "response_sent:403"),
    # C04
    Case("build_status_7", "read_build", {"build_id": "b-101"}, Category.malformed_response, 1, 0,
         ("received",), "response_sent:200", violation="status"),
    # C05
    Case("late_response_after_commit", "create_deployment", {"environment": "prod", "version": "1.4.2"},
         Category.outcome_unknown, 1, 1, ("received", "mutation_committed", "response_write_delayed"),
         "connection_closed", deadline_s=0.3),
    # C07
    Case("rate_limited:retry_after=7", "update_record", {"record_id": "rec-1", "value": "v2"},
         Category.rate_limited, 1, 0, ("received", "rejected"), "response_sent:429"),
    # timeouts at each point where certainty changes
    Case("timeout_after_headers", *ISSUE, Category.outcome_unknown, 1, 0,
         ("received", "request_body_stalled"), "connection_closed", deadline_s=0.3),
    Case("timeout_after_accept", *ISSUE, Category.outcome_unknown, 1, 0,
         ("received", "response_stalled"), "connection_closed", deadline_s=0.3),
    Case("timeout_during_body", *ISSUE, Category.outcome_unknown, 1, 1,
         ("received", "mutation_committed", "response_body_stalled"), "connection_closed", deadline_s=0.3),
    # a read has no effect: after-send timeouts are a bounded-retry local_failure
    Case("timeout_after_accept", "read_issue", {"issue_id": "ISS-1"}, Category.local_failure, 1, 0,
         ("received", "response_stalled"), "connection_closed", deadline_s=0.3),
    # malformed data: the create committed, the answer is unusable, nothing follows from it
    Case("id_null", *ISSUE, Category.malformed_response, 1, 1, ("mutation_committed",), "response_sent:201",
         violation="id"),
    Case("id_number", *ISSUE, Category.malformed_response, 1, 1, ("mutation_committed",), "response_sent:201",
         violation="id"),
    Case("id_object", *ISSUE, Category.malformed_response, 1, 1, ("mutation_committed",), "response_sent:201",
         violation="id"),
    Case("id_missing", *ISSUE, Category.malformed_response, 1, 1, ("mutation_committed",), "response_sent:201",
         violation="id"),
    Case("success_with_error_body", *ISSUE, Category.malformed_response, 1, 1, ("mutation_committed",),
         "response_sent:200", violation="error"),
    Case("error_status_html", *ISSUE, Category.malformed_response, 1, 0, ("rejected",), "response_sent:502"),
    Case("truncated_json", *ISSUE, Category.malformed_response, 1, 1, ("mutation_committed",),
         "response_sent:201", violation="(body)"),
    Case("duplicated_item", "latest_build", {"ref": "main"}, Category.malformed_response, 1, 0,
         ("received",), "response_sent:200", violation="items"),
    Case("reordered_items", "latest_build", {"ref": "main"}, Category.malformed_response, 1, 0,
         ("received",), "response_sent:200", violation="items"),
]


def _id(case: Case) -> str:
    return case.fault.split(":")[0] + ("" if CATALOG.get(case.op).mutates else "-read")  # type: ignore[union-attr]


class TestFaultMatrix:
    @pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
    async def test_fault(self, case: Case, harness_factory, caplog: pytest.LogCaptureFixture) -> None:
        """The Result says what the evidence supports, and the remote's records agree."""
        caplog.set_level(logging.DEBUG)
        h: Harness = await harness_factory(case.fault)
        call = await h.call(case.op, case.params, deadline_s=case.deadline_s)
        if case.final == "connection_closed":
            await h.wait_event(call.cid, "connection_closed")
        result, diag = call.result, call.outcome.diagnostic

        # 1. category and retry instruction
        assert (case.category, RETRY_FOR[case.category]) == (result.category, result.retry), result.message
        assert result.correlation_id == call.cid
        if case.category is not Category.success:
            assert result.data is None  # nothing later may run on a presumed value
        if case.category is Category.rate_limited:
            assert 7.0 == result.retry_after_s

        # 2. the remote's state: attempts and effects of this logical operation
        entry = h.remote.ledger.find(request_id=call.cid)
        seen = (entry["attempts"], entry["effects"]) if entry else (0, 0)
        assert (case.attempts, case.effects) == seen
        if case.attempts == 0:
            # documented reason: the failure happened before any request byte left
            assert 0 == h.remote.ledger.total_attempts()
            assert call.outcome.remote_touched is False
        else:
            assert call.outcome.remote_touched is True

        # 3. the event log holds the correlation id and what the remote observed
        names = [e["event"] for e in h.events(call.cid)]
        if case.attempts == 0:
            assert [] == names
            assert (call.cid, False) == (diag["correlation_id"], diag["remote_touched"])
        else:
            assert set(case.events) <= set(names), names
            kind, _, status = case.final.partition(":")
            last = h.events(call.cid)[-1]
            assert kind == last["event"]
            if status:
                assert int(status) == last["status"]
        if case.violation:
            assert case.violation in [v["field"] for v in diag["contract_violations"]]

        # 4. the canary credential is nowhere an agent or a log can see
        h.assert_no_leak(call.outcome, logs=caplog.text)


class TestExpiredToken:
    async def test_token_accepted_then_expired(self, harness_factory, caplog: pytest.LogCaptureFixture) -> None:
        """C02: a token that worked is then expired; the vault says authentication_failed, retry never."""
        caplog.set_level(logging.DEBUG)
        h: Harness = await harness_factory("expired_token")
        first = await h.call(*ISSUE)
        second = await h.call(*ISSUE)

        assert Category.success == first.result.category
        assert (Category.authentication_failed, RETRY_FOR[Category.authentication_failed]) == (
            second.result.category, second.result.retry)

        assert (1, 1) == (lambda e: (e["attempts"], e["effects"]))(h.remote.ledger.find(request_id=first.cid))
        assert (1, 0) == (lambda e: (e["attempts"], e["effects"]))(h.remote.ledger.find(request_id=second.cid))

        rejected = [e for e in h.events(second.cid) if e["event"] == "rejected"]
        assert [(401, "token_expired")] == [(e["status"], e["reason"]) for e in rejected]
        headers = dict((k.lower(), v) for k, v in second.outcome.diagnostic["headers"])
        assert 'Bearer error="invalid_token"' == headers["www-authenticate"]
        assert {"error": "token_expired"} == json.loads(second.outcome.diagnostic["body"])

        h.assert_no_leak(first.outcome, second.outcome, logs=caplog.text)


class TestIdempotencySequence:
    async def test_key_honoured_one_effect(self, harness_factory) -> None:
        """Delayed past the deadline -> outcome_unknown; lookup finds it; resend with the key -> 1 effect."""
        h: Harness = await harness_factory("late_response_after_commit:times=1,op=create_issue")
        first = await h.call(*ISSUE, key="k-issue-1", deadline_s=0.3)
        assert Category.outcome_unknown == first.result.category

        found = await h.lookup("create_issue", key="k-issue-1")
        assert ("found", Category.success) == (found.result.reconciled, found.result.category)
        created = found.result.data["created"]

        again = await h.call(*ISSUE, key="k-issue-1")
        assert Category.success == again.result.category
        assert created == [{"type": "issue", "id": again.result.data["id"]}]

        entry = h.remote.ledger.find(idempotency_key="k-issue-1")
        assert (2, 1) == (entry["attempts"], entry["effects"])
        assert 1 == sum(1 for i in h.remote.store.snapshot()["issues"] if i["title"] == ISSUE[1]["title"])
        h.assert_no_leak(first.outcome, found, again.outcome)

    async def test_header_ignored_by_deployments_two_effects(self, harness_factory) -> None:
        """create_deployment ignores Idempotency-Key: the same sequence makes two deployments."""
        h: Harness = await harness_factory("late_response_after_commit:times=1,op=create_deployment")
        params = {"environment": "prod", "version": "2.0.0"}
        first = await h.call("create_deployment", params, key="k-dep-1", deadline_s=0.3)
        assert Category.outcome_unknown == first.result.category

        found = await h.lookup("create_deployment", key="k-dep-1")
        assert "found" == found.result.reconciled
        assert "ignored" == found.result.data["idempotency"]

        again = await h.call("create_deployment", params, key="k-dep-1")
        assert Category.success == again.result.category

        entry = h.remote.ledger.find(idempotency_key="k-dep-1")
        assert (2, 2) == (entry["attempts"], entry["effects"])
        assert 2 == len(h.remote.store.snapshot()["deployments"])


class TestLookup:
    async def test_by_request_id_after_commit(self, harness_factory) -> None:
        """Without a key, the request id names the operation; a committed one is found."""
        h: Harness = await harness_factory("timeout_during_body")
        call = await h.call(*ISSUE, deadline_s=0.3)
        assert Category.outcome_unknown == call.result.category
        found = await h.lookup("create_issue", cid=call.cid)
        assert "found" == found.result.reconciled
        assert 1 == found.result.data["effects"]

    async def test_not_found_when_nothing_committed(self, harness_factory) -> None:
        """A request the remote refused, or never saw, did not take effect."""
        h: Harness = await harness_factory("permission_denied:op=delete_release")
        call = await h.call("delete_release", {"release_id": "rel-2"})
        assert "not_found" == (await h.lookup("delete_release", cid=call.cid)).result.reconciled
        assert "not_found" == (await h.lookup("delete_release", cid="c-never-sent")).result.reconciled

    async def test_unknown_while_the_remote_still_holds_it(self, harness_factory) -> None:
        """An attempt still in progress at the remote is reported unknown, not not_found."""
        h: Harness = await harness_factory()
        host, port = h.remote.url.removeprefix("http://").split(":")
        token = h.credentials["tracker_token"]
        with socket.create_connection((host, int(port))) as raw:
            # the head promises 100 bytes of body; only 2 arrive, so the remote waits
            raw.sendall(b"POST /v1/issues HTTP/1.1\r\nHost: x\r\nX-Correlation-Id: c-held\r\n"
                        b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: 100\r\n\r\n{}")
            await h.wait_event("c-held", "received")
            held = await h.lookup("create_issue", cid="c-held")
            assert ("unknown", Category.success) == (held.result.reconciled, held.result.category)

    async def test_lookup_failure_is_unknown(self, harness_factory) -> None:
        """When the lookup itself is refused, the answer is its category with reconciled unknown."""
        h: Harness = await harness_factory("expired_token")
        await h.call(*ISSUE)
        looked = await h.lookup("create_issue", cid="c-any")
        assert (Category.authentication_failed, "unknown") == (looked.result.category, looked.result.reconciled)


class TestConfirmedFailure:
    async def test_not_found_is_confirmed(self, harness_factory) -> None:
        """A 404 with the error envelope saying done:false is a confirmed failure."""
        h: Harness = await harness_factory()
        call = await h.call("read_issue", {"issue_id": "ISS-404"})
        assert (Category.confirmed_failure, RETRY_FOR[Category.confirmed_failure]) == (
            call.result.category, call.result.retry)

    async def test_second_delete_without_key_is_confirmed(self, harness_factory) -> None:
        """Deleting an already deleted release: the remote says not done, one effect in total."""
        h: Harness = await harness_factory()
        first = await h.call("delete_release", {"release_id": "rel-3"})
        second = await h.call("delete_release", {"release_id": "rel-3"})
        assert (Category.success, Category.confirmed_failure) == (first.result.category, second.result.category)
        assert 1 == h.remote.ledger.total_effects()


class TestRequestShape:
    async def test_ids_and_key_reach_the_remote(self, harness_factory) -> None:
        """X-Correlation-Id and Idempotency-Key are sent; the success data is a small projection."""
        h: Harness = await harness_factory()
        call = await h.call("update_record", {"record_id": "rec-2", "value": "gamma"}, key="k-rec")
        received = h.events(call.cid)[0]
        assert ("received", "k-rec", "update_record") == (
            received["event"], received["idempotency_key"], received["route"])
        assert {"id": "rec-2", "revision": 2} == call.result.data

    def test_path_params_are_quoted(self) -> None:
        """A path parameter fills one segment, quoted whole."""
        op = CATALOG.get("read_issue")
        assert ("/v1/issues/a%20b%25c%3Bd", None, None) == request_parts(op, {"issue_id": "a b%c;d"})

    def test_path_params_that_steer_are_refused(self) -> None:
        """A path parameter that could add segments or a query is refused, naming it."""
        op = CATALOG.get("read_issue")
        with pytest.raises(ValueError, match="parameter 'issue_id'"):
            request_parts(op, {"issue_id": "a/../b?x=1"})

    def test_rest_goes_to_body_or_query(self) -> None:
        """POST/PUT send the remaining params as JSON; GET sends them as the query."""
        assert ("/v1/records/r1", {"value": "v"}, None) == request_parts(
            CATALOG.get("update_record"), {"record_id": "r1", "value": "v"})
        assert ("/v1/builds", None, {"ref": "main"}) == request_parts(CATALOG.get("latest_build"), {"ref": "main"})

    async def test_connections_are_reused(self, harness_factory) -> None:
        """Two calls to one service share a connection: the second opens none."""
        h: Harness = await harness_factory()
        await h.call("read_issue", {"issue_id": "ISS-1"})
        second = await h.call("read_issue", {"issue_id": "ISS-1"})
        steps = [s for s, _ in second.outcome.diagnostic["trace"]]
        assert "connection.reused" in steps and "connection.connect.started" not in steps

    async def test_milestones_come_without_request_tracing(self, harness_factory) -> None:
        """A first call's diagnostic names each step of the exchange in order (the connection made,
        the head sent, the answer's head), and none comes from aiohttp's request tracing, whose
        signals cost 15-26 us of CPU per call (issue #19)."""
        h: Harness = await harness_factory()
        first = await h.call("read_issue", {"issue_id": "ISS-1"})
        steps = [s for s, _ in first.outcome.diagnostic["trace"]]
        assert ["connection.connect.started", "connection.connect.complete", "request.head_sent",
                "response.head_received"] == steps
        session = h.executor._http()
        assert [] == list(session.trace_configs)

    async def test_answer_about_another_object_is_malformed(self) -> None:
        """A response whose id differs from the requested one fails the contract (no presumed ids)."""
        def handler(request: web.Request) -> web.Response:
            return web.json_response({"id": "ISS-2", "title": "t", "state": "open"})
        outcome = await _mock_call(handler, "read_issue", {"issue_id": "ISS-1"})
        assert Category.malformed_response == outcome.result.category
        assert [{"field": "id", "reason": "does not match the requested issue_id"}] == \
            outcome.diagnostic["contract_violations"]


    async def test_unencodable_credential_sends_nothing_and_leaks_nothing(self, harness_factory) -> None:
        """A credential with a newline is refused before sending, and the exception text is scrubbed."""
        h: Harness = await harness_factory()
        secret = "CANARY-bad\nvalue"
        ctx = CallContext(correlation_id="c-badcred", session_id="s")
        outcome = await h.executor.execute(CATALOG.get("create_issue"), {"title": "t"}, Secret(secret),
                                           h.service(), ctx)
        assert (Category.local_failure, False) == (outcome.result.category, outcome.remote_touched)
        assert "CANARY-bad" not in json.dumps(outcome.diagnostic) + outcome.result.to_json()
        assert 0 == h.remote.ledger.total_attempts()


    async def test_header_injection_through_the_key_sends_nothing(self, harness_factory) -> None:
        """An idempotency key with a line break is refused before any connection is used."""
        h: Harness = await harness_factory()
        ctx = CallContext(correlation_id="c-inject", session_id="s", idempotency_key="k\r\nX-Admin: 1")
        outcome = await h.executor.execute(CATALOG.get("create_issue"), {"title": "t"}, Secret("tok"),
                                           h.service(), ctx)
        assert (Category.local_failure, False) == (outcome.result.category, outcome.remote_touched)
        assert 0 == h.remote.ledger.total_attempts()

    async def test_a_mark_or_correlation_id_that_is_no_header_value_sends_nothing(self, harness_factory) -> None:
        """Values the vault puts in headers itself are checked too (the mark once, when the
        executor is made; the correlation id per call): a line break sends nothing."""
        h: Harness = await harness_factory()
        marked = HttpExecutor(mark="m\r\nX-Admin: 1")
        try:
            outcome = await marked.execute(CATALOG.get("create_issue"), {"title": "t"}, Secret("tok"), h.service(),
                                           CallContext(correlation_id="c-mark", session_id="s"))
        finally:
            await marked.aclose()
        assert (Category.local_failure, False) == (outcome.result.category, outcome.remote_touched)
        outcome = await h.executor.execute(CATALOG.get("create_issue"), {"title": "t"}, Secret("tok"), h.service(),
                                           CallContext(correlation_id="c-x\r\nX-Admin: 1", session_id="s"))
        assert (Category.local_failure, False) == (outcome.result.category, outcome.remote_touched)
        assert 0 == h.remote.ledger.total_attempts()

    async def test_unencodable_body_sends_nothing(self, harness_factory) -> None:
        """A body JSON cannot carry (NaN, past the catalog's checks) is refused before any connection."""
        h: Harness = await harness_factory()
        ctx = CallContext(correlation_id="c-nan", session_id="s")
        outcome = await h.executor.execute(CATALOG.get("create_issue"), {"title": float("nan")}, Secret("tok"),
                                           h.service(), ctx)
        assert (Category.local_failure, False) == (outcome.result.category, outcome.remote_touched)
        assert 0 == h.remote.ledger.total_attempts()


class TestTimeouts:
    async def test_phase_timeouts_never_exceed_the_deadline(self, harness_factory) -> None:
        """Configured timeouts longer than the time left are cut to it."""
        h: Harness = await harness_factory()
        call = await h.call("read_issue", {"issue_id": "ISS-1"}, deadline_s=1.0,
                            read_timeout_s=60, connect_timeout_s=0.25)
        budget = call.outcome.diagnostic["timeouts_s"]
        assert 0.25 == budget["connect_timeout_s"]
        assert all(v <= 1.0 for v in budget.values())

    async def test_deadline_already_passed_sends_nothing(self, harness_factory) -> None:
        """With no time left the call is a local failure and the remote sees nothing."""
        h: Harness = await harness_factory()
        call = await h.call(*ISSUE, deadline_s=-1)
        assert (Category.local_failure, False) == (call.result.category, call.outcome.remote_touched)
        assert 0 == h.remote.ledger.total_attempts()


async def _mock_call(handler: Any, op_name: str, params: dict[str, Any], *, secret: str = "tok") -> Any:
    """One call against a loopback aiohttp server whose every answer comes from `handler`."""
    async def any_request(request: web.Request) -> web.StreamResponse:
        return handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_request)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    executor = HttpExecutor()
    try:
        ctx = CallContext(correlation_id="c-mock", session_id="s")
        return await executor.execute(CATALOG.get(op_name), params, Secret(secret),
                                      ServiceConfig(name="m", url=f"http://127.0.0.1:{port}"), ctx)
    finally:
        await executor.aclose()
        await runner.cleanup()


class TestClassificationEdges:
    """Answers the fake remote does not give, from a loopback aiohttp server."""

    @pytest.mark.parametrize(("status", "body", "op", "expected"), [
        (500, {"error": "boom"}, "create_issue", Category.outcome_unknown),
        (500, {"error": "boom", "done": False}, "create_issue", Category.confirmed_failure),
        (500, {"error": "boom"}, "read_issue", Category.confirmed_failure),
        (409, {"error": "conflict"}, "create_issue", Category.confirmed_failure),
        (500, {"error": "boom", "done": True}, "create_issue", Category.malformed_response),
        (302, {}, "read_issue", Category.malformed_response),
        (502, "<html>bad gateway</html>", "create_issue", Category.malformed_response),
    ], ids=["5xx-silent-mutation", "5xx-done-false", "5xx-read", "4xx-no-done", "error-claims-done",
            "redirect", "html"])
    async def test_status_and_envelope(self, status: int, body: Any, op: str, expected: Category) -> None:
        """Only an explicit or 4xx 'not done' is a confirmed failure; a silent 5xx on a write is unknown."""
        def handler(request: web.Request) -> web.Response:
            if isinstance(body, str):
                return web.Response(status=status, text=body, content_type="text/html")
            return web.json_response(body, status=status)
        params = {"title": "t"} if op == "create_issue" else {"issue_id": "ISS-1"}
        assert expected == (await _mock_call(handler, op, params)).result.category

    async def test_retry_after_http_date_and_default(self) -> None:
        """Retry-After as an HTTP-date is honoured; without it a default delay is given."""
        dated = await _mock_call(lambda r: web.Response(status=429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
                                 "read_issue", {"issue_id": "ISS-1"})
        bare = await _mock_call(lambda r: web.Response(status=429), "read_issue", {"issue_id": "ISS-1"})
        assert (0.0, Category.rate_limited) == (dated.result.retry_after_s, dated.result.category)
        assert bare.result.retry_after_s > 0

    async def test_echoed_secret_is_scrubbed_from_the_diagnostic(self) -> None:
        """A remote that echoes the bearer token back never gets it into the diagnostic."""
        secret = "CANARY-echoed-1234"
        def handler(request: web.Request) -> web.Response:
            return web.json_response({"error": "bad", "message": request.headers["authorization"]}, status=400,
                                     headers={"X-Echo": request.headers["authorization"], "Set-Cookie": "s=1"})
        outcome = await _mock_call(handler, "read_issue", {"issue_id": "ISS-1"}, secret=secret)
        assert secret not in json.dumps(outcome.diagnostic)
        assert secret not in outcome.result.to_json()

    async def test_an_echoed_secret_across_the_diagnostic_cut_leaves_no_part(self) -> None:
        """The diagnostic keeps 64 KiB of a body: cut before it was scrubbed, a credential that
        straddled the cut kept its first part there, which the runner's leak scan (any 12 of a
        token's characters) charged to the agent."""
        secret = "CANARY-straddles-the-cut-0123456789"
        for lead in range(DIAG_BODY - len(secret) + 1, DIAG_BODY):
            body = b"x" * lead + secret.encode() + b"y" * 100
            attempt = Attempt(status=400, body=body, complete=True)
            verdict = Verdict(Category.malformed_response, "m")
            diag = _evidence(attempt, verdict, Secret(secret), 0.0)
            assert secret[:12] not in diag["body"] and len(diag["body"]) <= DIAG_BODY, lead

    async def test_oversize_answer_is_malformed(self) -> None:
        """An answer beyond the size cap is not parsed."""
        big = b'{"id": "ISS-1", "title": "' + b"x" * (1 << 20) + b'", "state": "open"}'
        outcome = await _mock_call(lambda r: web.Response(body=big, content_type="application/json"),
                                   "read_issue", {"issue_id": "ISS-1"})
        assert Category.malformed_response == outcome.result.category
        assert outcome.diagnostic["body_truncated"] is True

    async def test_undecodable_content_encoding_is_malformed(self) -> None:
        """A body that claims gzip but is not is unusable, not a transport failure."""
        outcome = await _mock_call(lambda r: web.Response(body=b"not gzip at all", content_type="application/json",
                                                          headers={"Content-Encoding": "gzip"}),
                                   "read_issue", {"issue_id": "ISS-1"})
        assert Category.malformed_response == outcome.result.category
        assert "decoding" == outcome.diagnostic["reason"]


class TestNoSilentResend:
    @pytest.mark.parametrize("op,params,category", [
        ("read_issue", {"issue_id": "ISS-1"}, Category.local_failure),  # a read: bounded retry is safe
        ("delete_release", {"release_id": "rel-1"}, Category.outcome_unknown)])  # it may have acted
    async def test_a_dropped_reused_connection_is_not_resent(self, harness_factory, op: str,
                                                             params: dict[str, Any], category: Category) -> None:
        """The remote reads a request on a kept-alive connection, then closes it unanswered: the vault
        says so and sends nothing more. An HTTP client's own resend of an idempotent method (aiohttp's,
        RFC 9112 §9.3.1) would send the credential again under one audited intent, and report the
        second answer as if no fault had happened."""
        h: Harness = await harness_factory(f"timeout_after_accept:delay=0.2,op={op},times=1")
        warm = await h.call("read_build", {"build_id": "b-101"})  # leaves a pooled connection to reuse
        assert Category.success == warm.result.category
        call = await h.call(op, params)
        await h.wait_event(call.cid, "connection_closed")
        assert category == call.result.category, call.result.message
        entry = h.remote.ledger.find(request_id=call.cid)
        assert 1 == entry["attempts"]
        assert 1 == sum(1 for e in h.events(call.cid) if e["event"] == "received")
