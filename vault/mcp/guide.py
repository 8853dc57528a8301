"""What a caller must do after each answer: the vault://catalog resource and the `vault-rules` prompt.

Every Result carries a `retry` instruction (DESIGN.md "Result contract"); a
model that does not know what `reconcile_first` obliges it to do will resend a
deployment that already started. This module says it once, in words, next to
the operations themselves, so a host can show it or feed it to the model.
"""

from __future__ import annotations

import json
from typing import Any

from vault.models import RETRY_FOR, Retry
from vault.mcp.schemas import LOOKUP_TOOL, RESUME_TOOL, CatalogView, scope_words

CATALOG_URI = "vault://catalog"
RULES_PROMPT = "vault-rules"
# the runner's bound on retries after `bounded` failures (vault.runner.grade)
RETRY_BOUND = 3

RETRY_DUTY: dict[Retry, str] = {
    Retry.none: "Done: the operation succeeded; `data` holds its evidence. Do not send it again.",
    Retry.bounded: (f"Failed before a meaningful remote attempt or the remote said it did not do the work: "
                    f"you may try again a few times (at most {RETRY_BOUND}), with a pause, or give up and say so."),
    Retry.never: "Do not retry this operation: a person said no, the policy forbids it, or the credential or "
                 "answer is unusable. Tell the user what happened.",
    Retry.after_delay: "Rate limited: wait `retry_after_s` seconds before the next attempt.",
    Retry.reconcile_first: (f"The request may have taken effect. Call {LOOKUP_TOOL} with its correlation_id "
                            "(or your idempotency_key) first; retry only if `reconciled` is not_found, and "
                            "never while it is found or unknown."),
    Retry.after_unlock: "The vault is locked and nothing was sent: a person must unlock it; try again only after.",
    Retry.after_approval: (f"A person has not decided yet. Call {RESUME_TOOL} with the resume_token before the "
                           "deadline; do not call the operation again (that would ask twice)."),
    Retry.human_required: "No approver can receive the request; nothing was sent. Ask a person; do not retry.",
}


def catalog_document(view: CatalogView | None, skipped: list[tuple[str, str]], budget_s: float) -> dict[str, Any]:
    """The vault://catalog resource: operations, what each approval means, what each retry obliges."""
    ops = []
    for op in view.operations if view else []:
        ops.append({"name": op.name, "description": op.description, "risk": op.risk,
                    "mutates": op.mutates, "idempotent": op.idempotent, "params": op.params,
                    "approval": op.approval.model_dump(exclude_none=True), "grant_scope": scope_words(op)})
    return {
        "available": view is not None,
        "operations": ops,
        "not_offered": [{"name": n, "why": why} for n, why in skipped],
        "wait_budget_s": budget_s,
        "retry": {str(r): RETRY_DUTY[r] for r in Retry},
        "categories": {str(c): str(r) for c, r in RETRY_FOR.items()},
    }


def catalog_text(view: CatalogView | None, skipped: list[tuple[str, str]], budget_s: float) -> str:
    return json.dumps(catalog_document(view, skipped, budget_s), indent=2)


def rules_text() -> str:
    """The prompt: how to use the vault's tools, for a model that has never seen them."""
    lines = [
        "You act through a credential vault. Each tool is one operation; the vault holds the credentials "
        "and may ask a person to approve. Every tool answers with a Result whose `retry` field tells you "
        "what you may do next:",
        "",
    ]
    lines += [f"- retry `{r}`: {RETRY_DUTY[r]}" for r in Retry]
    lines += ["", "Never claim an operation succeeded unless its Result has ok: true. Pass an idempotency_key "
              "with operations that change something, and keep it with the correlation_id."]
    return "\n".join(lines)
