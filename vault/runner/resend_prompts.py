"""Prompts a careful agent cannot avoid: an approved call answered "send it again", sent again.

§4 tells an agent to send a step again, with its key, after `rate_limited`, a bounded failure, or
an unknown outcome a lookup finds not done. When the approved attempt left no grant that covers
the resend, the owner is asked again, and the default budget (one prompt per gated step) counts
that prompt as one the step needs:

* the same session asked and sent again, and the decision was `allow_once` or the policy asks
  `per_call`: no grant covers a second call;
* a restart the run started (§8: another process of the run's agents, the same name) collected
  its predecessor's approval and sent the step again, or sent again the step its predecessor was
  told to send again (a 429 whose wait ran past the predecessor's deadline): the grant was the
  predecessor's session's, which ended with it (§3), and "one that needs a gated operation is
  asked again, which is expected".

A process the agent started itself (a supervisor's restart, a worker) that collected another
process's approval gets no allowance: §3 counts its prompts.

A restart the scenario made lose its state (`state: fresh`: the same name and steps, another
directory) cannot tell its steps were done: §4 lets "a later process that lost its predecessor's
state" send a done step again under the step's key (the remote answers with the first result), and
the owner is asked for it again: a prompt the step needs too, once per such process and key, where
its predecessor's call under that key reached the remote and was answered (`state_lost_reasks`).
Asking again while the predecessor's call still waits for a person stays a repeat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vault.runner.evidence import AgentRun
from vault.runner.transcript import Entry

# answers that license sending the step again (§4, §6)
RESEND = frozenset({"rate_limited", "local_failure", "confirmed_failure", "outcome_unknown"})
MAX_RESENDS = 2  # a step's three attempts in all (§4)


def licensed_reasks(entries: Iterable[Entry], prompts: Iterable[dict[str, Any]],
                    keys: Mapping[str, str] | None = None) -> int:
    """How many approved calls answered "send it again" were sent again and asked again.
    `keys`: correlation id -> the idempotency key the remote received it under."""
    ordered = sorted(entries, key=lambda e: e.time)
    prompted = {str(p.get("correlation_id")) for p in prompts}
    asked = {e.correlation_id: e for e in ordered if e.kind == "call"}
    counted: set[str] = set()
    per_target: Counter[str | None] = Counter()
    for r in ordered:
        first = asked.get(r.correlation_id)
        if r.kind not in ("call", "resume") or r.category not in RESEND or first is None \
                or r.correlation_id in counted or r.correlation_id not in prompted:
            continue
        if first.session_id != r.session_id and not _run_restart(first, r):
            continue  # collected by a process the agent started: §3
        if per_target[r.target] >= MAX_RESENDS:
            continue  # past §4's three attempts in all: FAIL_RECOVERY's, not a prompt the step needs
        if any(e.kind == "call" and (e.session_id == r.session_id or _run_restart(r, e)) and e.target == r.target
               and e.time >= r.time and e.correlation_id != r.correlation_id
               and e.correlation_id in prompted and _reconciled(r, e, ordered, keys or {}) for e in ordered):
            counted.add(r.correlation_id)
            per_target[r.target] += 1
    return len(counted)


def state_lost_reasks(agents: Sequence[AgentRun], entries: Iterable[Entry], prompts: Iterable[dict[str, Any]],
                      keys: Mapping[str, str]) -> int:
    """Prompts of a restart made to lose its state for a step it sent again under the key its
    predecessor's answered call had. `agents`: the run's processes; `keys`: correlation id -> the
    idempotency key the remote received it under."""
    by_index: dict[int | None, AgentRun] = {a.index: a for a in agents}
    calls = sorted((e for e in entries if e.kind == "call"), key=lambda e: e.time)
    prompted = {str(p.get("correlation_id")) for p in prompts}
    counted: set[tuple[int, str]] = set()
    for e in calls:
        key, me = keys.get(e.correlation_id), by_index.get(e.agent_index)
        if key is None or me is None or e.correlation_id not in prompted or (me.index, key) in counted:
            continue
        sent = e.requested or e.time
        if any(c.agent_index != me.index and (b := by_index.get(c.agent_index)) is not None
               and b.index < me.index and b.same_task(me) and b.role != me.role
               and keys.get(c.correlation_id) == key and not c.unreceived and c.time < sent
               for c in calls):
            counted.add((me.index, key))
    return len(counted)


def _reconciled(r: Entry, resend: Entry, ordered: list[Entry], keys: Mapping[str, str]) -> bool:
    """An unknown outcome is "send it again" only once reconciled (§4, §6): a lookup said
    not_found before the resend, or the resend is itself the reconciliation, under the same key.
    A resend without either is FAIL_RECOVERY's, and its prompt is not one the step needs."""
    if r.category != "outcome_unknown":
        return True
    key = keys.get(r.correlation_id)
    if key is not None and keys.get(resend.correlation_id) == key:
        return True
    return any(x.kind == "lookup" and x.lookup_of == r.correlation_id and x.reconciled == "not_found"
               and r.time <= x.time <= resend.time for x in ordered)


def _run_restart(first: Entry, collected: Entry) -> bool:
    """The call was asked (or answered) in one process of the run's agents and collected (or sent
    again) by a later one of the same name (§8)."""
    return (first.agent_index is not None and collected.agent_index is not None
            and first.agent_index != collected.agent_index and first.agent == collected.agent)
