"""Response contracts: one assumption violated at a time fails, valid answers pass."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vault import contracts
from vault.catalog import load_catalog

ISSUE = {"id": "ISS-1", "title": "t", "state": "open"}
BUILD = {"id": "b-1", "number": 3, "ref": "main", "status": "passed"}


def check(name: str, body: Any, params: dict[str, Any] | None = None) -> contracts.Checked:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return contracts.check(name, raw, params)


def fields(checked: contracts.Checked) -> list[str]:
    return [v.field for v in checked.violations]


class TestCatalogCoverage:
    def test_every_catalog_contract_exists(self) -> None:
        """Each `contract:` named in the default catalog has a model."""
        named = {op.contract for op in load_catalog().operations.values() if op.contract}
        assert named <= set(contracts.CONTRACTS)


class TestIds:
    @pytest.mark.parametrize("bad", [None, 12345, {}, [], "", 1.5, True],
                             ids=["null", "number", "object", "list", "empty", "float", "bool"])
    def test_id_must_be_a_non_empty_string(self, bad: Any) -> None:
        """An id that changed type or is empty fails, naming the field."""
        assert ["id"] == fields(check("issue", {**ISSUE, "id": bad}))

    def test_missing_id_fails(self) -> None:
        """An omitted id fails; nothing falls back to the request's id."""
        body = {k: v for k, v in ISSUE.items() if k != "id"}
        assert ["id"] == fields(check("issue", body, {"issue_id": "ISS-1"}))

    def test_valid_issue_projects_small(self) -> None:
        """A valid answer yields only the projected fields; extras are ignored."""
        checked = check("issue", {**ISSUE, "body": "long text", "internal": {"x": 1}})
        assert checked.ok
        assert {"id": "ISS-1", "title": "t", "state": "open"} == checked.model.project()


class TestShapes:
    def test_build_status_must_be_a_known_string(self) -> None:
        """C04: `status: 7` and unknown strings fail."""
        assert ["status"] == fields(check("build", {**BUILD, "status": 7}))
        assert ["status"] == fields(check("build", {**BUILD, "status": "exploded"}))

    def test_no_coercion(self) -> None:
        """Strict: a numeric string is not an integer."""
        assert ["number"] == fields(check("build", {**BUILD, "number": "3"}))

    def test_success_with_error_body(self) -> None:
        """An error envelope under a success status fails even if it had an id."""
        assert ["error"] == fields(check("issue", {**ISSUE, "error": "internal"}))

    @pytest.mark.parametrize("raw", [b'{"id": "ISS-1", "tit', b"<html>oops</html>", b"", b"[1]", b"\xff\xfe"],
                             ids=["truncated", "html", "empty", "array", "not-utf8"])
    def test_unreadable_bodies(self, raw: bytes) -> None:
        """Truncated, HTML, empty or non-object bodies fail as a whole."""
        assert ["(body)"] == fields(check("issue", raw))

    def test_binding_to_the_request(self) -> None:
        """An answer about another object than the one asked for fails."""
        assert ["id"] == fields(check("record", {"id": "rec-2", "value": "v", "revision": 2},
                                      {"record_id": "rec-1", "value": "v"}))
        assert ["value"] == fields(check("record", {"id": "rec-1", "value": "old", "revision": 2},
                                         {"record_id": "rec-1", "value": "new"}))


class TestLists:
    items = [{**BUILD, "id": "b-3", "number": 3}, {**BUILD, "id": "b-2", "number": 2}]

    def test_valid_list_projects_first(self) -> None:
        """A unique, newest-first list yields its first item."""
        checked = check("build_list", {"items": self.items})
        assert checked.ok
        assert {"count": 2, "first": {"id": "b-3", "number": 3, "ref": "main", "status": "passed"}} == \
            checked.model.project()

    def test_duplicated_item_fails(self) -> None:
        """A duplicated item makes the list untrustworthy, even if the first is right."""
        assert ["items"] == fields(check("build_list", {"items": [self.items[0], *self.items]}))

    def test_reordered_items_fail(self) -> None:
        """A list out of its documented order fails, so 'first' is never the wrong one."""
        assert ["items"] == fields(check("build_list", {"items": list(reversed(self.items))}))


class TestErrorEnvelope:
    def test_envelope_reads_done(self) -> None:
        """The error envelope carries the remote's own statement about the work."""
        env = contracts.error_envelope(b'{"error": "not_found", "done": false}')
        assert ("not_found", False) == (env.error, env.done)

    def test_non_envelope(self) -> None:
        """HTML or a body without `error` is not an envelope."""
        assert contracts.error_envelope(b"<html></html>") is None
        assert contracts.error_envelope(b'{"message": "x"}') is None


class TestFrozen:
    def test_models_are_frozen(self) -> None:
        """A validated answer cannot be patched afterwards."""
        model = check("issue", ISSUE).model
        with pytest.raises(Exception):
            model.id = "other"  # type: ignore[misc]
