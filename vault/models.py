"""The Result contract: the one small, stable answer an agent ever receives.

Every path (socket, MCP, transcripts, runner) builds and reads Results through
this module so that the category -> retry mapping lives in exactly one place.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter


class Category(StrEnum):
    success = "success"
    local_failure = "local_failure"
    authentication_failed = "authentication_failed"
    authorization_denied = "authorization_denied"
    rate_limited = "rate_limited"
    confirmed_failure = "confirmed_failure"
    malformed_response = "malformed_response"
    outcome_unknown = "outcome_unknown"
    vault_locked = "vault_locked"
    approval_pending = "approval_pending"
    approval_denied = "approval_denied"
    approval_expired = "approval_expired"
    approval_unroutable = "approval_unroutable"


class Retry(StrEnum):
    none = "none"  # success: nothing to retry
    bounded = "bounded"
    never = "never"
    after_delay = "after_delay"
    reconcile_first = "reconcile_first"
    after_unlock = "after_unlock"
    after_approval = "after_approval"
    human_required = "human_required"


# DESIGN.md "Result contract": the retry instruction is a function of the category.
RETRY_FOR: dict[Category, Retry] = {
    Category.success: Retry.none,
    Category.local_failure: Retry.bounded,
    Category.authentication_failed: Retry.never,
    Category.authorization_denied: Retry.never,
    Category.rate_limited: Retry.after_delay,
    Category.confirmed_failure: Retry.bounded,
    Category.malformed_response: Retry.never,
    Category.outcome_unknown: Retry.reconcile_first,
    Category.vault_locked: Retry.after_unlock,
    Category.approval_pending: Retry.after_approval,
    Category.approval_denied: Retry.never,
    Category.approval_expired: Retry.never,
    Category.approval_unroutable: Retry.human_required,
}

Reconciled = Literal["found", "not_found", "unknown"]


class Result(BaseModel):
    """What the agent is told. Never carries a credential or raw remote data."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    ok: bool
    category: Category
    operation: str
    retry: Retry
    correlation_id: str
    message: str
    diagnostic_id: str | None = None
    # success payload: a small, stable projection of the remote answer (ids, status)
    data: dict[str, Any] | None = None
    # rate_limited
    retry_after_s: float | None = None
    # approval_pending
    request_id: str | None = None
    owner: str | None = None
    deadline: float | None = None
    resume_token: str | None = None
    # lookup: did the earlier operation take effect?
    reconciled: Reconciled | None = None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


RESULT_ADAPTER: TypeAdapter[Result] = TypeAdapter(Result)


def make_result(
    category: Category,
    operation: str,
    correlation_id: str,
    message: str,
    **extra: Any,
) -> Result:
    """Build a Result whose `ok` and `retry` follow from the category."""
    return Result(
        ok=category is Category.success,
        category=category,
        operation=operation,
        retry=RETRY_FOR[category],
        correlation_id=correlation_id,
        message=message,
        **extra,
    )


def result_schema() -> dict[str, Any]:
    return RESULT_ADAPTER.json_schema()


def result_schema_json() -> str:
    return json.dumps(result_schema(), indent=2, sort_keys=True)
