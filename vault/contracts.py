"""Response contracts: what a remote's answer must be before anything uses it.

A parser that succeeds proves nothing: production failures arrive as an id
that turned into `null`, a number or an object, a missing field, an error
envelope under a 200, an enum that grew an integer (`status: 7`), a list with
a duplicate or in the wrong order. Each catalog `contract:` name maps to one
model here; the HTTP executor validates every success body against it and
reports `malformed_response` on any violation, naming the field only in the
protected diagnostic. Nothing downstream ever runs on a presumed value
(no `response.id or request.id`): the one small projection an agent gets is
built from a validated model.

Judgement calls: validation is strict (no "7" -> 7 coercion, ids are only
non-empty strings); unknown extra fields are ignored, not rejected, because
providers add fields all the time and an additive change is not a broken
contract, but an `error`/`errors` key in a success body always is. `binds`
ties a call parameter to the response field that must echo it (read issue
ISS-1, get ISS-1 back), so an answer about another object is caught.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

Id = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class Contract(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, hide_input_in_errors=True)

    # call parameter -> response field that must carry the same value
    binds: ClassVar[dict[str, str]] = {}
    # the fields an agent gets back on success
    projection: ClassVar[tuple[str, ...]] = ("id",)

    def project(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self.projection}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, StrEnum) else value


class Issue(Contract):
    binds: ClassVar[dict[str, str]] = {"issue_id": "id"}
    projection: ClassVar[tuple[str, ...]] = ("id", "title", "state")
    id: Id
    title: str
    state: Literal["open", "closed"]


class Note(Contract):
    binds: ClassVar[dict[str, str]] = {"issue_id": "issue_id"}
    projection: ClassVar[tuple[str, ...]] = ("id", "issue_id")
    id: Id
    issue_id: Id


class Release(Contract):
    binds: ClassVar[dict[str, str]] = {"release_id": "id"}
    projection: ClassVar[tuple[str, ...]] = ("id", "tag", "state")
    id: Id
    tag: str
    state: Literal["published", "deleted"]


class BuildStatus(StrEnum):
    queued = "queued"
    running = "running"
    passed = "passed"
    failed = "failed"
    cancelled = "cancelled"


class Build(Contract):
    binds: ClassVar[dict[str, str]] = {"build_id": "id"}
    projection: ClassVar[tuple[str, ...]] = ("id", "number", "ref", "status")
    id: Id
    number: int = Field(ge=0)
    ref: str
    status: BuildStatus


class BuildList(Contract):
    """Builds of one ref, documented newest first; callers take the first."""

    binds: ClassVar[dict[str, str]] = {}
    items: list[Build]

    @field_validator("items")
    @classmethod
    def _unique_and_ordered(cls, items: list[Build]) -> list[Build]:
        ids = [b.id for b in items]
        if len(set(ids)) != len(ids):
            raise ValueError("an item appears more than once")
        numbers = [b.number for b in items]
        if any(a <= b for a, b in zip(numbers, numbers[1:])):
            raise ValueError("items are not in the documented order (newest first)")
        return items

    def project(self) -> dict[str, Any]:
        return {"count": len(self.items), "first": self.items[0].project() if self.items else None}


class Deployment(Contract):
    binds: ClassVar[dict[str, str]] = {"environment": "environment", "version": "version"}
    projection: ClassVar[tuple[str, ...]] = ("id", "environment", "version", "status")
    id: Id
    environment: str
    version: str
    status: Literal["started", "running", "succeeded", "failed"]


class Record(Contract):
    binds: ClassVar[dict[str, str]] = {"record_id": "id", "value": "value"}
    projection: ClassVar[tuple[str, ...]] = ("id", "revision")
    id: Id
    value: str
    revision: int = Field(ge=0)


class ResourceRef(Contract):
    type: str
    id: Id


class OperationStatus(Contract):
    """The remote's status endpoint: was a logical operation committed?"""

    projection: ClassVar[tuple[str, ...]] = ("state", "attempts", "effects")
    state: Literal["committed", "in_progress", "not_committed", "not_seen"]
    attempts: int = Field(ge=0)
    effects: int = Field(ge=0)
    resources: list[ResourceRef] = []
    idempotency: Literal["honoured", "ignored"] | None = None

    def project(self) -> dict[str, Any]:
        out = super().project()
        out["created"] = [r.model_dump() for r in self.resources]
        if self.idempotency:
            out["idempotency"] = self.idempotency
        return out


class ErrorEnvelope(BaseModel):
    """`{"error": CODE, "message": TEXT, "done": false}` on a 4xx/5xx."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)
    error: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    message: str | None = None
    # the remote's own statement on whether it did the work; absent = silent
    done: bool | None = None


CONTRACTS: dict[str, type[Contract]] = {
    "issue": Issue,
    "note": Note,
    "release": Release,
    "build": Build,
    "build_list": BuildList,
    "deployment": Deployment,
    "record": Record,
    "operation_status": OperationStatus,
}


@dataclass(frozen=True)
class Violation:
    field: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "reason": self.reason}


@dataclass(frozen=True)
class Checked:
    model: Contract | None
    violations: tuple[Violation, ...] = ()

    @property
    def ok(self) -> bool:
        return self.model is not None and not self.violations


def check(name: str, body: bytes, params: dict[str, Any] | None = None) -> Checked:
    """Validate a success body against contract `name` and the call's params."""
    model_cls = CONTRACTS.get(name)
    if model_cls is None:
        return Checked(None, (Violation("(contract)", f"no contract named {name!r}"),))
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Checked(None, (Violation("(body)", "not valid JSON"),))
    if not isinstance(doc, dict):
        return Checked(None, (Violation("(body)", "not a JSON object"),))
    shaped = [k for k in ("error", "errors") if k in doc]
    if shaped:
        return Checked(None, (Violation(shaped[0], "a success status with an error-shaped body"),))
    try:
        model = model_cls.model_validate_json(body)
    except ValidationError as exc:
        return Checked(None, tuple(
            Violation(".".join(str(p) for p in err["loc"]) or "(body)", f"{err['type']}: {err['msg']}")
            for err in exc.errors(include_input=False, include_url=False, include_context=False)
        ))
    mismatched = tuple(
        Violation(fld, f"does not match the requested {param}")
        for param, fld in model_cls.binds.items()
        if params and param in params and getattr(model, fld) != params[param]
    )
    return Checked(None if mismatched else model, mismatched)


def error_envelope(body: bytes) -> ErrorEnvelope | None:
    """The error envelope of a 4xx/5xx body, or None when it has none."""
    try:
        return ErrorEnvelope.model_validate_json(body)
    except ValidationError:
        return None
