"""The vault never becomes a confused deputy: a parameter value cannot move a call.

An agent fills in values; the catalog says where the credential goes. These
tests send each hostile value through the real HTTP executor to the fake
remote, which routes the way a permissive real server does (percent-decoding
once, resolving dot segments: vault/remote/api.py `resolve_path`), and check
the remote's own records: no request outside the operation's route, in fact
no request at all. A control sends the same values the way the vault used
to (quoted, not checked) to show the remote really would have routed some of
them elsewhere, so the first check is not passing by accident.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import quote

import pytest

import helpers
from helpers import Sandbox, remote_events, remote_ledger
from remote_fixtures import CATALOG, Harness, canary, credentials, diagnostics, harness_factory  # noqa: F401
from vault import param_safety
from vault.catalog import Catalog, load_catalog, load_yaml_model
from vault.client import AgentClient
from vault.errors import BadInput, RpcError
from vault.executors.base import CallContext, ExecOutcome
from vault.ids import correlation_id
from vault.models import Category
from vault.remote.api import resolve_path
from vault.store.secret import Secret

# (value, why it is hostile)
HOSTILE = [
    ("", "empty: /v1/issues/ is the collection"),
    (" ", "blank"),
    (".", "dot segment"),
    ("..", "dot segment: /v1/issues/.. is /v1/"),
    ("%2e%2e", "encoded dot segment, decoded by the server"),
    ("%2E.", "half-encoded dot segment"),
    ("%252e%252e", "double-encoded, for a proxy that decodes twice"),
    ("..;jsessionid=1", "a dot segment to Tomcat/Jetty"),
    ("\uff0e\uff0e", "fullwidth dots, '..' after NFKC"),
    ("a/b", "adds a segment"),
    ("x/../../releases/rel-1", "walks to another collection"),
    ("x%2F..%2F..%2Freleases%2Frel-1", "the same, encoded"),
    ("a\\b", "a backslash is a slash to IIS and WHATWG URLs"),
    ("ISS-1?admin=1", "adds a query"),
    ("ISS-1#frag", "cuts the path"),
    ("ISS-1\r\nX-Injected: 1", "a header line"),
    ("ISS-1%0d%0aX-Injected: 1", "an encoded header line"),
    ("ISS-1\x00", "a NUL"),
    ("ISS-1\u202e", "a right-to-left override"),
]
IDS = [why.split(":")[0].replace(" ", "-") + f"-{i}" for i, (_, why) in enumerate(HOSTILE)]

# operations whose path holds a parameter: (operation, the path parameter, other params)
PATH_OPS = [
    ("read_issue", "issue_id", {}),
    ("attach_note", "issue_id", {"text": "triaged"}),
    ("delete_release", "release_id", {}),
    ("update_record", "record_id", {"value": "gamma"}),
]


async def execute(h: Harness, op_name: str, params: dict[str, Any], catalog: Catalog = CATALOG) -> tuple[ExecOutcome, str]:
    """One call through the executor as the daemon makes it (no validation done for it)."""
    op = catalog.get(op_name)
    assert op is not None
    cid = correlation_id()
    ctx = CallContext(correlation_id=cid, session_id="s-test", deadline=time.monotonic() + 5)
    outcome = await h.executor.execute(op, params, Secret(h.credentials[op.credential]), h.service(), ctx)
    return outcome, cid


def received(h: Harness) -> list[dict[str, Any]]:
    return [e for e in h.remote.events.snapshot() if e["event"] == "received"]


class TestHostilePathValues:
    @pytest.mark.parametrize(("value", "why"), HOSTILE, ids=IDS)
    @pytest.mark.parametrize(("op_name", "param", "others"), PATH_OPS, ids=[o for o, _, _ in PATH_OPS])
    async def test_refused_with_nothing_sent(self, harness_factory, op_name: str, param: str,  # noqa: F811
                                             others: dict[str, Any], value: str, why: str) -> None:
        """local_failure naming the parameter; the remote received nothing, so nothing outside
        the operation's route; the credential never left."""
        h: Harness = await harness_factory()
        outcome, cid = await execute(h, op_name, {param: value, **others})
        result = outcome.result
        assert (Category.local_failure, False) == (result.category, outcome.remote_touched), why
        assert f"parameter '{param}'" in result.message and "nothing was changed" in result.message
        assert [] == received(h) and [] == h.remote.ledger.snapshot()
        assert [] == h.events(cid)
        h.assert_no_leak(outcome)

    async def test_ordinary_ids_still_work(self, harness_factory) -> None:  # noqa: F811
        """The checks refuse no ordinary id, including ones that need quoting."""
        h: Harness = await harness_factory()
        ok, _ = await execute(h, "read_issue", {"issue_id": "ISS-1"})
        missing, _ = await execute(h, "read_issue", {"issue_id": "ISS 1;v=2%"})
        assert Category.success == ok.result.category
        assert Category.confirmed_failure == missing.result.category  # a 404 from the right route
        assert ["read_issue", "read_issue"] == [e.get("route") for e in received(h)]
        assert "/v1/issues/ISS 1;v=2%" == received(h)[1]["path"]

    async def test_control_the_old_builder_would_have_been_steered(self, harness_factory) -> None:  # noqa: F811
        """Sent as the vault used to (quoted whole, not checked), with the tracker token,
        some of these values reach the remote outside read_issue: one reads a release."""
        h: Harness = await harness_factory()
        token = h.credentials["tracker_token"]
        routes = {}
        for value in ("..", ".", "a/b", "x/../../releases/rel-1", "a\\b"):
            status = await raw_request(h, "GET", "/v1/issues/" + quote(value, safe=""), token)
            event = received(h)[-1]
            routes[value] = (event.get("route"), event["path"], status)
        assert (None, "/v1/", 404) == routes[".."]
        assert (None, "/v1/issues/", 404) == routes["."]
        assert (None, "/v1/issues/a/b", 404) == routes["a/b"]
        assert ("read_release", "/v1/releases/rel-1", 200) == routes["x/../../releases/rel-1"]
        assert (None, "/v1/issues/a/b", 404) == routes["a\\b"]


async def raw_request(h: Harness, method: str, target: str, token: str | None = None,
                      body: bytes = b"") -> int:
    """One HTTP/1.1 request with the target exactly as given (HTTP clients would resolve
    the dot segments themselves before sending); returns the status."""
    reader, writer = await asyncio.open_connection(h.remote.host, h.remote.port)
    head = [f"{method} {target} HTTP/1.1", f"Host: {h.remote.host}", "Connection: close",
            f"Content-Length: {len(body)}"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1])


class TestQueryValues:
    async def test_a_value_cannot_add_a_parameter(self, harness_factory, monkeypatch) -> None:  # noqa: F811
        """`&`, `=`, `#`, `+` and `;` in a query value stay inside that one value."""
        h: Harness = await harness_factory()
        seen: list[dict[str, str]] = []
        begin = h.remote.service.begin

        def spy(method: str, target: bytes, headers: list[tuple[bytes, bytes]], *rest):  # type: ignore[no-untyped-def]
            ex = begin(method, target, headers, *rest)
            seen.append(dict(ex.query))
            return ex
        monkeypatch.setattr(h.remote.service, "begin", spy)
        value = "main&ref=release;x=1#y+z"
        await execute(h, "latest_build", {"ref": value})
        assert [{"ref": value}] == seen

    @pytest.mark.parametrize("value", ["main\r\nX: 1", "main%0d%0aX: 1", "main\x00"],
                             ids=["crlf", "encoded-crlf", "nul"])
    async def test_control_characters_are_refused(self, harness_factory, value: str) -> None:  # noqa: F811
        h: Harness = await harness_factory()
        outcome, _ = await execute(h, "latest_build", {"ref": value})
        assert (Category.local_failure, False) == (outcome.result.category, outcome.remote_touched)
        assert "parameter 'ref'" in outcome.result.message and [] == received(h)

    async def test_slashes_and_dots_are_fine_in_a_query(self, harness_factory) -> None:  # noqa: F811
        """A git ref like feature/../x is a value, not a path: it is sent."""
        h: Harness = await harness_factory()
        await execute(h, "latest_build", {"ref": "feature/../x"})
        assert ["list_builds"] == [e.get("route") for e in received(h)]


DECLARED = Catalog.model_validate({"operations": {
    "read_env": {
        "risk": "read", "executor": "http", "service": "tracker", "method": "GET",
        "path": "/v1/issues/{issue_id}", "credential": "tracker_token",
        "params": {
            "issue_id": {"type": "string", "pattern": "ISS-[0-9]+", "maxLength": 8},
            "env": {"type": "string", "enum": ["staging", "production"], "required": False},
            "count": {"type": "integer", "enum": [1, 2], "required": False},
        },
    },
}})


class TestDeclarations:
    @pytest.mark.parametrize(("params", "expect"), [
        ({"issue_id": "ISS-1x"}, "does not match ISS-[0-9]+"),
        ({"issue_id": "ISS-1234567"}, "longer than 8 characters"),
        ({"issue_id": "ISS-1", "env": "prod"}, 'is not one of "staging", "production"'),
        ({"issue_id": "ISS-1", "count": True}, "must be integer"),
        ({"issue_id": "ISS-1", "count": 3}, "is not one of 1, 2"),
    ], ids=["pattern", "maxLength", "enum", "bool-is-not-int", "int-enum"])
    async def test_enforced_before_any_request(self, harness_factory, params: dict[str, Any],  # noqa: F811
                                               expect: str) -> None:
        """The executor checks the declarations itself: local_failure, nothing sent."""
        h: Harness = await harness_factory()
        outcome, _ = await execute(h, "read_env", params, DECLARED)
        assert Category.local_failure == outcome.result.category and expect in outcome.result.message
        assert [] == received(h)
        with pytest.raises(BadInput, match=expect.replace("(", r"\(").replace("+", r"\+").replace("[", r"\[")):
            DECLARED.get("read_env").validate_params(params)

    async def test_values_that_fit_are_sent(self, harness_factory) -> None:  # noqa: F811
        h: Harness = await harness_factory()
        outcome, _ = await execute(h, "read_env", {"issue_id": "ISS-1", "env": "staging", "count": 2}, DECLARED)
        assert Category.success == outcome.result.category

    def test_declarations_do_not_loosen_the_path_check(self) -> None:
        """A pattern that allows `..` does not let `..` into a path."""
        loose = Catalog.model_validate({"operations": {"r": {
            "risk": "read", "executor": "http", "service": "s", "method": "GET", "path": "/v1/x/{id}",
            "credential": "c", "params": {"id": {"type": "string", "pattern": ".*"}}}}})
        assert "dot segment" in loose.get("r").refusal({"id": ".."})

    def test_json_schema(self) -> None:
        """The names other tools read (MCP tool schemas): anchored pattern, maxLength, enum."""
        spec = DECLARED.get("read_env").params
        assert {"type": "string", "pattern": "^(?:ISS-[0-9]+)$", "maxLength": 8} == spec["issue_id"].json_schema()
        assert {"type": "integer", "enum": [1, 2]} == spec["count"].json_schema()


class TestCatalogLoad:
    @pytest.mark.parametrize(("spec", "expect"), [
        ({"pattern": "[a-z"}, "invalid regular expression"),
        ({"pattern": "(?P<x>a)(?P<x>b)"}, "invalid regular expression"),
        ({"type": "integer", "pattern": "[0-9]+"}, "apply to string parameters only"),
        ({"type": "integer", "maxLength": 3}, "apply to string parameters only"),
        ({"enum": ["a", 1]}, "enum value 1 is not a string"),
        ({"enum": []}, "at least one value"),
        ({"maxLength": 0}, "greater than or equal to 1"),
        ({"max_length": 5}, "Extra inputs are not permitted"),
    ], ids=["regex", "regex-group", "int-pattern", "int-maxlength", "enum-type", "enum-empty",
            "maxlength-zero", "python-name"])
    def test_bad_declarations_are_refused_naming_operation_and_param(self, tmp_path, spec, expect) -> None:
        path = tmp_path / "catalog.yaml"
        path.write_text(json.dumps({"operations": {"read_thing": {
            "risk": "read", "executor": "http", "service": "s", "method": "GET", "path": "/v1/t/{thing}",
            "credential": "c", "params": {"thing": spec}}}}))
        with pytest.raises(BadInput) as caught:
            load_yaml_model(path, Catalog)
        assert "operations.read_thing.params.thing" in caught.value.message
        assert expect in caught.value.message

    def test_shipped_catalog_declares_and_loads(self) -> None:
        """The default catalog loads and bounds every string parameter an agent fills in."""
        catalog = load_catalog()
        for op in catalog.operations.values():
            for name, spec in op.params.items():
                if spec.type == "string":
                    assert spec.max_length or spec.pattern or spec.enum, f"{op.name}.{name}"


class TestPositionsAndCommands:
    @pytest.mark.parametrize(("value", "refused"), [
        ("web", False), ("web-2_a", False), ("-rf", True), ("..", True), ("a/b", True),
        ("", True), ("web\nreboot", True), ("we\u200bb", True),
    ])
    def test_command_arguments(self, value: str, refused: bool) -> None:
        """An SSH argument names something: no path, no option, nothing hidden."""
        assert refused == (param_safety.problem("command", value) is not None)

    def test_positions(self) -> None:
        catalog = load_catalog()
        assert {"issue_id": "path", "text": "body"} == catalog.get("attach_note").positions
        assert {"service_name": "command"} == catalog.get("restart_service").positions
        assert {"ref": "query"} == CATALOG.get("latest_build").positions


class TestRemoteResolvesLikeARealServer:
    @pytest.mark.parametrize(("sent", "routed"), [
        ("/v1/issues/ISS-1", "/v1/issues/ISS-1"),
        ("/v1/issues/..", "/v1/"),
        ("/v1/issues/.", "/v1/issues/"),
        ("/v1/issues/%2e%2e", "/v1/"),
        ("/v1/issues/x%2F..%2F..%2Freleases%2Frel-1", "/v1/releases/rel-1"),
        ("/v1/issues/x\\..\\..\\releases\\rel-1", "/v1/releases/rel-1"),
        ("/v1/issues/..;x/y", "/v1/y"),
        ("/..", "/"),
        ("/v1//issues", "/v1//issues"),
        ("/v1/issues/a%20b", "/v1/issues/a b"),
    ])
    def test_resolve_path(self, sent: str, routed: str) -> None:
        assert routed == resolve_path(sent)

    async def test_steered_request_is_recorded_where_it_landed(self, harness_factory) -> None:  # noqa: F811
        """The event log shows the resolved path and, beside it, what was sent."""
        h: Harness = await harness_factory()
        assert 404 == await raw_request(h, "GET", "/v1/issues/%2e%2e")
        event = received(h)[-1]
        assert (None, "/v1/", "/v1/issues/%2e%2e") == (event.get("route"), event["path"], event["sent_path"])

    async def test_control_plane_is_not_reachable_by_dot_segments(self, harness_factory) -> None:  # noqa: F811
        """`/_sim/` answers its literal prefix only; `..` into it is an ordinary unrouted request."""
        h: Harness = await harness_factory("rate_limited:op=read_issue")
        status = await raw_request(h, "POST", "/v1/..%2F_sim%2Ffault", body=b'{"fault": null}')
        assert 404 == status and h.remote.fault is not None
        assert "/_sim/fault" == received(h)[-1]["path"]


@pytest.mark.parametrize("value", ["..", "%2e%2e", "x/../../releases/rel-1"], ids=["dots", "encoded", "walk"])
def test_through_the_daemon(sandbox: Sandbox, value: str) -> None:
    """End to end: a fresh daemon and the fake remote in their own processes, an agent on
    the real socket. The agent gets local_failure naming issue_id; the remote's ledger and
    event log show nothing received; the credential is nowhere in the answer."""
    secret = helpers.canary()
    _, url = sandbox.start_remote({"tracker_token": secret})
    sandbox.set_secret("tracker_token", secret)
    sandbox.start_daemon("--remote", url)
    with AgentClient(sandbox.agent_sock, timeout=30) as agent:
        agent.open_session("deputy-test")
        result = agent.call("read_issue", {"issue_id": value})
        ok = agent.call("read_issue", {"issue_id": "ISS-1"})
    assert (Category.local_failure, "bounded") == (result.category, result.retry)
    assert "parameter 'issue_id'" in result.message and secret not in result.to_json()
    assert Category.success == ok.category  # the same daemon still serves an ordinary call
    events = remote_events(url)
    assert ["read_issue"] == [e.get("route") for e in events if e["event"] == "received"]
    assert [e for e in events if e.get("correlation_id") == result.correlation_id] == []
    assert [["read_issue"]] == [[o["route"]] for o in remote_ledger(url)["operations"]]


def test_refused_before_anyone_is_asked(sandbox: Sandbox) -> None:
    """A hostile value on a per_call operation is refused before the gate: no approver is
    connected, yet the answer is local_failure naming the parameter (not approval_unroutable),
    no prompt is counted and nothing reaches the remote."""
    _, url = sandbox.start_remote({"releases_token": helpers.canary()})
    sandbox.start_daemon("--remote", url)
    with AgentClient(sandbox.agent_sock, timeout=30) as agent:
        agent.open_session("deputy-test")
        result = agent.call("delete_release", {"release_id": ".."})
    assert (Category.local_failure, "bounded") == (result.category, result.retry)
    assert "parameter 'release_id'" in result.message and "nobody was asked" in result.message
    stats = json.loads(sandbox.vaultsim("stats", "--json", check=True).stdout)
    assert 0 == stats.get("prompts", 0)
    assert [] == remote_events(url)


def test_declaration_violation_through_the_daemon_is_bad_params(sandbox: Sandbox) -> None:
    """A value outside a declared pattern is refused at the socket (-32602), nothing sent."""
    _, url = sandbox.start_remote({"deploy_token": helpers.canary()})
    sandbox.start_daemon("--remote", url)
    with AgentClient(sandbox.agent_sock, timeout=30) as agent:
        agent.open_session("deputy-test")
        with pytest.raises(RpcError) as caught:
            agent.call("create_deployment", {"environment": "Staging; rm", "version": "1.0"})
    assert -32602 == caught.value.rpc_code and "parameter 'environment'" in caught.value.message
    assert [] == remote_events(url)
