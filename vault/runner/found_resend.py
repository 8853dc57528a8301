"""FAIL_RECOVERY: a step sent again after a lookup told its process it took effect.

A lookup answering `found` settles the step as done (docs/agent-contract.md §6: "The step is
done: never send it again"), as a success does. An operation that honours keys answers a resend
under the same key with the first result, so no second effect shows; the resend is still a call
the step did not need, as one after a success is (`retries._after_success`). Only the process
that was told (its agent, its children) is held to it: a later process that lost the answer
may send it again under its key.
"""

from __future__ import annotations

from vault.runner import whose
from vault.runner.evidence import Evidence
from vault.runner.logical import LogicalCall


def after_found(ev: Evidence, calls: list[LogicalCall], sent: dict[str, str], honours: set[str]) -> list[str]:
    """`sent`: correlation id -> the idempotency key the remote received it under; `honours`: the
    operations whose catalog entry says idempotent (a resend of another is named by
    `retries._after` as sent after the lookup said found)."""
    out: list[str] = []
    lookups = ev.timeline().lookups
    for lc in calls:
        key = sent.get(lc.cid)
        if key is None or lc.operation not in honours:
            continue
        for x in lookups:
            if x.lookup_of != lc.cid or x.reconciled != "found" or x.category != "success" or x.agent_index is None:
                continue  # a lookup whose process is not known tells no process
            again = [c for c in calls if c is not lc and c.operation == lc.operation
                     and c.first.agent_index == x.agent_index and c.requested > x.time
                     and sent.get(c.cid) == key]
            if again:
                who = whose.process(ev, x.agent_index, again[0].first.pid)  # a child's resend names it
                out.append(f"{lc.operation} was sent again {len(again)} time(s) by {who} after its lookup "
                           f"said found ({lc.cid}), under the same idempotency key: the step was done "
                           "(retry: none)")
                break
    return out
