"""The published Result schema is valid, and every Result the HTTP executor makes fits it."""

from __future__ import annotations

import json

import pytest

from remote_fixtures import Harness, canary, credentials, diagnostics, harness_factory  # noqa: F401
from vault.cli.main import main as vaultsim
from vault.models import RESULT_ADAPTER, Category

# (fault, operation, params, deadline) covering every category the executor produces
PRODUCERS = [
    (None, "create_issue", {"title": "t"}, 3.0),
    ("connection_refused", "read_issue", {"issue_id": "ISS-1"}, 3.0),
    ("expired_token", "read_issue", {"issue_id": "ISS-1"}, 3.0),
    ("permission_denied", "delete_release", {"release_id": "rel-1"}, 3.0),
    ("rate_limited", "update_record", {"record_id": "rec-1", "value": "v"}, 3.0),
    (None, "read_issue", {"issue_id": "ISS-404"}, 3.0),
    ("build_status_7", "read_build", {"build_id": "b-101"}, 3.0),
    ("late_response_after_commit", "create_deployment", {"environment": "e", "version": "1"}, 0.3),
]


@pytest.fixture(scope="module")
def schema() -> dict:
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        assert 0 == vaultsim(["schema", "result"])
    return json.loads(out.getvalue())


def test_schema_is_valid_json_schema(schema: dict) -> None:
    """`vaultsim schema result` prints a valid JSON Schema."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validators.validator_for(schema).check_schema(schema)


async def test_executor_results_validate(schema: dict, harness_factory) -> None:
    """Results of every category, and lookups, validate against the schema and round-trip."""
    seen: set[Category] = set()
    docs = []
    for fault, op, params, deadline in PRODUCERS:
        h: Harness = await harness_factory(fault)
        if fault == "expired_token":
            docs.append((await h.call(op, params)).result.to_json())  # accepted once, then expired
        call = await h.call(op, params, deadline_s=deadline)
        seen.add(call.result.category)
        docs.append(call.result.to_json())
        docs.append((await h.lookup(op, cid=call.cid)).result.to_json())
    assert {Category.success, Category.local_failure, Category.authentication_failed,
            Category.authorization_denied, Category.rate_limited, Category.confirmed_failure,
            Category.malformed_response, Category.outcome_unknown} == seen
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - the pydantic round-trip below still runs
        jsonschema = None
    for doc in docs:
        if jsonschema is not None:
            jsonschema.validate(json.loads(doc), schema)
        assert doc == RESULT_ADAPTER.validate_json(doc).to_json()
