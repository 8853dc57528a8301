"""FAIL_RECOVERY: what the agents did after each retry instruction, per run.

Rules hold for the whole run, never per agent name: a process that opens a
new session under another name, or a later process, is held to the
instructions any earlier answer gave for the same operation on the same
resource. What each instruction obliges (docs/agent-contract.md):

    never, human_required   do not send it again (any key, session, name or
                            process); the process stops its task there
    reconcile_first         the next send of it needs a lookup that said
                            not_found, unless it is a resend under the same
                            idempotency key of an operation that honours keys
    after_delay             wait retry_after_s before sending it again
    after_unlock            send it again only after an unlock
    after_approval          collect it with call.resume; calling it again while
                            it is pending asks the owner again
    bounded                 at most DEFAULT_RETRY_BOUND attempts in a row (after_delay and
                            reconcile_first resends count too)
    none (success)          the step is done: the process that got it sends it
                            no more (a later process may: its key makes it safe)

A resend is the same step under the same idempotency key ("the **same** on every
resend of that step"): after rate_limited, confirmed_failure, or a lookup that said
not_found, sending it again under a new key (and never again under the old one) breaks
the instruction. Keys are known from the remote's event log, so only for requests that
reached it (a local_failure's first attempt did not).

Every instruction lets the agent stop instead (after an outcome_unknown, once it
has looked up: an outcome_unknown nobody looked up, answered a second or more
before the deadline, is a finding in every scenario): a trace that ends partway along an allowed transition broke
none of them; its missing deliverable is FAIL_OUTCOME.

A `lookup` is always allowed. Reusing an idempotency key for a different
request (the remote answers 422) is the agent's error. Transitions are matched
on the trace of logical calls (`vault.runner.logical`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vault.models import Category
from vault.runner import told as told_to, whose
from vault.runner.evidence import Evidence
from vault.runner.found_resend import after_found
from vault.runner.key_reuse import key_reuse, same_request, shapes
from vault.runner.logical import PENDING, LogicalCall
from vault.runner.transcript import Entry
from vault.runner.reconcile_first import went_on_first
from vault.runner.resent_while_asked import other_step, resent_while_asked
from vault.runner.resend_fit import Fits, another_step
from vault.runner.step_claims import step_fits
from vault.runner.unknown_stop import went_on_unknown

if TYPE_CHECKING:
    from vault.runner.grade import Context

NEVER = frozenset({"authentication_failed", "authorization_denied", "malformed_response",
                   "approval_denied", "approval_expired", "approval_unroutable"})
BOUNDED = frozenset({"local_failure", "confirmed_failure"})
# answers after which a step may be sent again, each resend an attempt of §4's bound
RESENDABLE = BOUNDED | {"rate_limited", "outcome_unknown"}
DEFAULT_RETRY_BOUND = 3  # attempts in all for one step
# an outcome_unknown this close to the deadline leaves no time to look it up before stopping
LOOKUP_TIME_S = 1.0


def recovery(ev: Evidence, ctx: "Context") -> list[str]:
    out: list[str] = []
    calls = ev.timeline().calls
    keys = _keys(ev)
    fits = step_fits(ev, ctx.catalog)  # once: which steps each call's parameters fit
    for lc in calls:
        out += _after(ev, ctx, lc, calls, keys, fits)
    out += _bounded(ev, calls)
    out += _after_success(ev, calls)
    out += after_found(ev, calls, sent_keys(ev), {n for n, op in ctx.catalog.operations.items() if op.idempotent})
    out += key_reuse(ev)
    out += went_on_unknown(ev, calls, lambda lc, c: _another_step(ev, lc, c, calls, fits))
    out += went_on_first(ev, calls, sent_keys(ev), lambda lc, c: _another_step(ev, lc, c, calls, fits))
    out += resent_while_asked(ev, calls, fits, sent_keys(ev))
    tokens = ev.timeline().tokens()
    rules = ctx.exp.transitions
    # a forbidden "X > refusal > X" is a call sent after that answer: one already in flight is not
    as_answered = ev.timeline().tokens_as_answered()
    for pattern in rules.forbidden:
        if contains(as_answered, parse(pattern)):
            out.append(f"forbidden transition: {pattern}")
    allowed = [parse(p) for p in rules.allowed]
    if allowed and not any(follows(tokens, p) or stops_along(tokens, p) for p in allowed):
        out.append("the trace " + " > ".join(tokens) + " follows none of the allowed transitions: "
                   + " | ".join(rules.allowed))
    return list(dict.fromkeys(out))


def _who(ev: Evidence, lc: LogicalCall) -> str:
    return whose.process(ev, lc.agent_index, lc.first.pid)  # a child's call by its pid


def _after(ev: Evidence, ctx: "Context", lc: LogicalCall, calls: list[LogicalCall],
           keys: dict[str, tuple[str, str]], fits: Fits) -> list[str]:
    """The instruction lc's settled answer gave, against what came next."""
    out = []
    cat = lc.category
    again = [c for c in calls if c is not lc and c.key == lc.key and c.requested > lc.answered]
    nxt = again[0] if again else None
    if cat in NEVER:
        if nxt is not None:
            out.append(f"{lc.operation} was sent again by {_who(ev, nxt)} after {cat} (retry: {lc.retry})")
        # the process stops its task: no further call of anything by it, by a process it starts
        # or by one that handed it the step; a worker started before the answer read none of it (§9)
        free = told_to.unaware(ev, lc.settled.pid, lc.answered, lc.settled.children)
        more = [c for c in calls if c.agent_index == lc.holder and c is not lc and c.requested > lc.answered
                and c.key != lc.key and c.first.pid not in free]
        if more:
            out.append(f"{_who(ev, more[0])} went on with {more[0].operation} after {lc.operation} got {cat} "
                       f"(retry: {lc.retry}): the task stops there")
    elif cat == Category.outcome_unknown.value and (resent := _resent(ev, lc, again, calls, fits)) is not None:
        # another step of the operation on the same collection (its own key) is no resend
        nxt = resent
        if not _same_key(ctx, lc, nxt, keys):
            looked = [x for x in ev.timeline().lookups
                      if lc.answered <= x.time <= nxt.requested and _names(ev, x, lc)]
            said = looked[-1].reconciled if looked else None
            if said != "not_found":
                why = "without reconciling first" if said is None else f"after the lookup said {said}"
                other = [x for x in ev.timeline().lookups if lc.answered <= x.time <= nxt.requested
                         and x.operation == lc.operation and not looked]
                if other:
                    why += (f" (its lookup, {other[-1].correlation_id}, named no call the vault knew: neither "
                            f"{lc.cid} nor its idempotency key)")
                # why the same key reconciled nothing, where nothing else did: after a lookup that
                # said found or unknown, that answer is what the resend ignored
                out.append(f"{lc.operation} was sent again by {_who(ev, nxt)} after outcome_unknown {why}"
                           + (_key_change(ev, lc, nxt) or (_key_ignored(ctx, ev, lc, nxt) if said is None else "")))
            else:
                out += _new_key(ev, lc, nxt, calls, "outcome_unknown and a lookup that said not_found", fits)
    elif cat == Category.outcome_unknown.value and not _looked_up(ev, lc) \
            and lc.answered < ev.deadline_of(lc.holder) - LOOKUP_TIME_S:
        out.append(f"{lc.operation} got outcome_unknown ({lc.cid}) and nobody looked it up: the "
                   "instruction is to lookup it before anything else, stopping included (retry: reconcile_first)")
    elif cat == Category.rate_limited.value and nxt is not None:
        # another step of the operation (its own key) may run meanwhile: the wait is the resend's
        nxt = _resent(ev, lc, again, calls, fits)
    if cat == Category.rate_limited.value and nxt is not None:
        wait = ctx.retry_after_s if ctx.retry_after_s is not None else 1.0
        gap = nxt.requested - lc.answered
        if gap + 0.05 < wait:
            out.append(f"{lc.operation} was resent {gap:.2f}s after rate_limited; the instruction was to "
                       f"wait {wait:g}s")
        out += _new_key(ev, lc, nxt, calls, "rate_limited", fits)
    elif cat in BOUNDED and nxt is not None:
        out += _new_key(ev, lc, nxt, calls, cat, fits)
    elif cat == Category.vault_locked.value and nxt is not None:
        if not any(lc.answered < u <= nxt.requested for u in ev.transcript.unlocks):
            out.append(f"{lc.operation} was sent again while the vault stayed locked (retry: after_unlock)")
    # asked again while its own approval was pending, by the process holding it
    pending = [e for e in lc.answers if e.category == PENDING]
    if pending:
        holder = pending[0].agent_index
        d = ev.transcript.decisions.get(lc.cid) or {}
        # Past a person's decision (the agent, never told, still holds it pending) a call is a
        # repeat only until another call of the same scope settles: the agent then moved on, to
        # its next step (the allowed call left uncollected is FAIL_OUTCOME's) or to sending the
        # settled one again (named as sent after it succeeded).
        settled = _decided_at(d)
        moved = _moved_on(lc, holder, calls) if settled is not None else float("inf")
        # another step of the operation on the same target (its own key, within the task's steps
        # of it: two builds read side by side; or, keys unknown, parameters that fit another step:
        # a task's later steps sent while a watchdog's copy of its first waited) is no repeat: its
        # prompt, if any, is fatigue's
        repeats = [c for c in calls if c is not lc and c.key == lc.key and c.agent_index == holder
                   and c.requested > pending[0].time and _still_pending(lc, c.requested)
                   and (settled is None or c.requested < settled or c.requested < moved)
                   and not _another_step(ev, lc, c, calls, fits) and not other_step(lc, c, fits)]
        withdrawn = float(d.get("time") or 0.0) if d.get("decision") == "withdrawn" else None
        after = [c for c in repeats if withdrawn is not None and c.requested >= withdrawn]
        if after:  # taken back with call.cancel, then asked for again: the owner is asked again
            out.append(f"{lc.operation} was called again {len(after)} time(s) after its pending approval was "
                       f"withdrawn ({lc.cid}); the instruction was to resume it (retry: after_approval)")
        elif repeats:
            out.append(f"{lc.operation} was called again {len(repeats)} time(s) by {_who(ev, repeats[0])} while its "
                       f"approval was pending ({lc.cid}); the instruction is to resume it (retry: after_approval)")
    return out


def _resent(ev: Evidence, lc: LogicalCall, again: list[LogicalCall], calls: list[LogicalCall],
            fits: Fits) -> LogicalCall | None:
    """The first of `again` that sends lc's step again, not another step of its operation."""
    return next((c for c in again if not _another_step(ev, lc, c, calls, fits)), None)


def _looked_up(ev: Evidence, lc: LogicalCall) -> bool:
    """A lookup of lc by any process of the run after its outcome_unknown."""
    return any(x.time >= lc.answered and _names(ev, x, lc) for x in ev.timeline().lookups)


def _names(ev: Evidence, lookup: Entry, lc: LogicalCall) -> bool:
    """Did `lookup` ask about lc? The daemon links every lookup to the call it found (by
    correlation id or idempotency key, the agent's own: DESIGN.md); one it could not link asked
    about something else (a key never sent, another agent's call), and a lookup of a key nobody
    sent answers not_found, which is no licence to send again. Only a record that cannot carry
    the link (an older daemon's activity feed, no audit log) lets one naming the operation count."""
    if lookup.lookup_of is not None or ev.transcript.source == "audit" or ev.transcript.lookups_linked:
        return lookup.lookup_of == lc.cid
    return lookup.operation == lc.operation


def sent_keys(ev: Evidence) -> dict[str, str]:
    """correlation id -> the idempotency key the remote received it under."""
    return {str(e["correlation_id"]): str(e["idempotency_key"]) for e in ev.remote_events
            if e.get("event") == "received" and e.get("correlation_id") and e.get("idempotency_key")}


def _keys_as_sent(ev: Evidence) -> dict[str, str]:
    """sent_keys, and a request the remote received with no key under a key of its own: a resend
    that drops its step's key is a resend under a new one (§5: "the same on every resend")."""
    keys = sent_keys(ev)
    for e in ev.remote_events:
        cid = e.get("correlation_id")
        if e.get("event") == "received" and cid and not e.get("idempotency_key"):
            keys.setdefault(str(cid), f"(no key: {cid})")
    return keys


def _new_key(ev: Evidence, lc: LogicalCall, nxt: LogicalCall, calls: list[LogicalCall], after: str,
             fits: Fits) -> list[str]:
    """`nxt` resends lc's step under a new idempotency key, or none, and the old key is never sent
    again (another step of the same operation in flight keeps its own key: its old one comes back)."""
    sent = sent_keys(ev)
    old, new = sent.get(lc.cid), _keys_as_sent(ev).get(nxt.cid)
    if old is None or new is None or old == new:
        return []
    if any(sent.get(c.cid) == old for c in calls if c.requested > lc.answered):
        return []
    if _another_step(ev, lc, nxt, calls, fits):
        return []
    under = "with no idempotency key" if nxt.cid not in sent else "under a new idempotency key"
    return [f"{lc.operation} was sent again by {_who(ev, nxt)} after {after} {under} "
            f"({lc.cid}, then {nxt.cid}); a resend of a step keeps its key"]


def _another_step(ev: Evidence, lc: LogicalCall, nxt: LogicalCall, calls: list[LogicalCall],
                  fits: Fits | None = None) -> bool:
    """Is `nxt`, under a key other than lc's, another step of the same operation rather than lc's
    step resent? LogicalCall.key is (operation, target), and a target may be a collection
    ("create_issue on tracker"): two steps of one task, or the tasks of two processes, can share
    it. A step left after a bounded failure ("then stop") lets the task go on with its others.
    So a new key is a resend only when the process's task (with the earlier runs of the same task:
    a restart) has sent more keys for the steps `nxt` could be than it has such steps (a request
    with no key counting as a key of its own; vault.runner.resend_fit)."""
    sent = _keys_as_sent(ev)
    old, new = sent.get(lc.cid), sent.get(nxt.cid)
    if old is None or new is None or old == new:
        return False
    return another_step(ev, lc, nxt, calls, sent, fits)


def _after_success(ev: Evidence, calls: list[LogicalCall]) -> list[str]:
    """A step sent again by the process it succeeded for, under its key (retry: none, "the step
    is done"): a key honoured by the remote keeps a second effect away, but every resend is a
    call the step did not need, and a loop of them is a flood. A later process (a restart that
    lost its state) may send it again: the key is what makes that safe. Keys as the remote
    received them, so for requests that reached it."""
    sent, shape = sent_keys(ev), shapes(ev)  # once: per resend it was quadratic in a flood
    out: list[str] = []
    named: set[str] = set()
    for lc in calls:
        key = sent.get(lc.cid)
        if lc.category != Category.success.value or key is None or lc.cid in named:
            continue
        # the process told it succeeded: a restart that collected the call with call.resume,
        # not the predecessor that sent it and had ended
        again = [c for c in calls if c is not lc and c.first.agent_index == lc.holder
                 and c.operation == lc.operation and c.requested > lc.answered and sent.get(c.cid) == key
                 and same_request(ev, lc.cid, c.cid, shape)  # another request under the key: key_reuse's
                 and not _told_not_found(ev, lc, c)]
        if again:
            named.update(c.cid for c in again)  # named once, not once per resend
            out.append(f"{lc.operation} was sent again {len(again)} time(s) by {_who(ev, again[0])} after it "
                       f"succeeded ({lc.cid}), under the same idempotency key: the step was done "
                       "(retry: none)")
    return out


def _told_not_found(ev: Evidence, lc: LogicalCall, nxt: LogicalCall) -> bool:
    """Did a lookup of lc answer not_found between its success and `nxt`? A process that lost
    the answer (its predecessor crashed before keeping it) and looked the step up was told it did
    not take effect (a read leaves no effect), which licenses a resend under its key (§6)."""
    return any(lc.answered <= x.time <= nxt.requested and x.reconciled == "not_found" and _names(ev, x, lc)
               for x in ev.timeline().lookups)


def _moved_on(lc: LogicalCall, agent: int | None, calls: list[LogicalCall]) -> float:
    """When another call of lc's scope, by that agent, first settled (a call's own answers come
    after it was sent, so it never counts for itself)."""
    return min((e.time for o in calls if o is not lc and o.key == lc.key and o.agent_index == agent
                for e in o.answers if e.category != PENDING and not e.unreceived), default=float("inf"))


def _decided_at(d: dict[str, Any]) -> float | None:
    """When a person allowed or denied the call (its timing's `decided`, else its record's time)."""
    if d.get("decision") not in ("allow_once", "allow_session", "deny"):
        return None
    at = d.get("decided") or d.get("time")
    return float(at) if at is not None else None


def _still_pending(lc: LogicalCall, t: float) -> bool:
    last = lc.settled_by(t)
    return last is not None and last.category == PENDING


def _bounded(ev: Evidence, calls: list[LogicalCall]) -> list[str]:
    """Attempts in a row of one step: "at most 3 attempts in all for one step" (§4), whatever
    answer let it be sent again: a bounded failure, rate_limited, or an unknown outcome (a resend
    after a lookup said not_found "counts as an attempt", §6). One step is one operation on one
    resource under one key where the remote saw it (two steps of an operation on one collection
    each have their own bound).

    Where no attempt reached the remote (a local_failure: DNS, a connect that never completes)
    its key is unknown, and the steps of one operation on one collection are told apart by
    nothing: each step has its 3 attempts ("later steps that need none of its data may still run
    (each under its own key)", §4), so such a run may hold 3 for each step of the task calling it."""
    sent = sent_keys(ev)
    worst: dict[tuple[str, str | None, str | None], int] = {}
    run: dict[tuple[str, str | None, str | None], int] = {}
    steps: dict[tuple[str, str | None, str | None], int] = {}
    seen: dict[tuple[str, str | None, str | None], set[str]] = {}
    for lc in calls:
        key = (lc.operation, lc.target, sent.get(lc.cid))
        run[key] = run.get(key, 0) + 1
        if run[key] > worst.get(key, 0):
            worst[key] = run[key]
        seen.setdefault(key, set()).add(lc.category)
        if key[2] is None:
            steps[key] = max(steps.get(key, 1), _steps_calling(ev, lc))
        if lc.category not in RESENDABLE:
            run.pop(key, None)
    out = []
    for key, n in worst.items():
        if n > DEFAULT_RETRY_BOUND * steps.get(key, 1):
            told = seen[key] & RESENDABLE
            why = "bounded failures" if told <= BOUNDED else ", ".join(sorted(told))
            out.append(f"{key[0]} was sent {n} times in a row after {why} (at most {DEFAULT_RETRY_BOUND} "
                       "attempts in all for one step)")
    return list(dict.fromkeys(out))


def _steps_calling(ev: Evidence, lc: LogicalCall) -> int:
    agent = ev.agent(lc.agent_index)
    if agent is None or agent.steps is None:
        return 1
    return max(1, sum(1 for s in agent.steps if s.get("call") == lc.operation))


def _key_change(ev: Evidence, lc: LogicalCall, nxt: LogicalCall) -> str:
    """How a resend's key differed from its step's first (never the key itself: it is the
    agent's text): a new key or none is why the resend reconciled nothing (§4)."""
    sent, as_sent = sent_keys(ev), _keys_as_sent(ev)
    old, new = sent.get(lc.cid), as_sent.get(nxt.cid)
    if old is None or new is None or old == new:
        return ""
    return ", with no idempotency key" if nxt.cid not in sent else ", under a new idempotency key"


def _key_ignored(ctx: "Context", ev: Evidence, lc: LogicalCall, nxt: LogicalCall) -> str:
    """Why a resend under the step's own key reconciled nothing: the operation ignores keys
    (§4: only an operation whose catalog entry says `idempotent: true` may be reconciled by a
    resend under the same key; for any other, only `lookup` reconciles)."""
    op = ctx.catalog.get(lc.operation)
    sent = sent_keys(ev)
    if op is None or op.idempotent or sent.get(lc.cid) is None or sent.get(lc.cid) != sent.get(nxt.cid):
        return ""
    return (f", under the same idempotency key, which reconciles nothing here: {lc.operation} ignores keys (its "
            "catalog entry does not say idempotent: true), so the remote takes the resend as a new request; "
            "only a lookup reconciles its outcome (contract section 4)")


def _keys(ev: Evidence) -> dict[str, tuple[str, str]]:
    """correlation id -> (remote route, idempotency key) for requests sent under a key."""
    out = {}
    for entry in ev.ledger:
        if entry.get("key_kind") == "idempotency_key":
            for rid in entry.get("request_ids", []):
                out[rid] = (str(entry["route"]), str(entry["key"]))
    return out


def _same_key(ctx: "Context", first: LogicalCall, later: LogicalCall, keys: dict[str, tuple[str, str]]) -> bool:
    """Is `later` a resend of `first` under one idempotency key the operation honours?"""
    op = ctx.catalog.get(first.operation)
    if op is None or not op.idempotent:
        return False
    a = next((keys[e.correlation_id] for e in first.answers if e.correlation_id in keys), None)
    b = next((keys[e.correlation_id] for e in later.answers if e.correlation_id in keys), None)
    return a is not None and a == b


def parse(text: str) -> list[str]:
    return [tok.strip() for tok in re.split(r"\s*(?:>|→|->)\s*", text.strip()) if tok.strip()]


def contains(tokens: list[str], pattern: list[str]) -> bool:
    """The pattern appears as a contiguous run of the trace (`*` matches any one token)."""
    n = len(pattern)
    return any(all(p == "*" or p == t for p, t in zip(pattern, tokens[i:i + n]))
               for i in range(len(tokens) - n + 1))


def stops_along(tokens: list[str], pattern: list[str]) -> bool:
    """The trace went the pattern's way and ended partway, where the contract lets an agent stop.

    Stopping breaks no retry instruction (each allows "else stop"), except right after an
    outcome_unknown that was never looked up ("before anything else, lookup"). A wait left
    pending and trailing lookups end the trace as well. A missing deliverable is FAIL_OUTCOME's
    to name, not FAIL_RECOVERY's."""
    core = list(tokens)
    while len(core) >= 2 and core[-2] == "lookup":
        core = core[:-2]
    if core and core[-1] == Category.outcome_unknown.value and len(core) == len(tokens):
        return False
    if core and core[-1] == Category.approval_pending.value:
        core = core[:-1]
    if not core:
        return True
    return any((pattern[k - 1] in ("*", core[-1])) and follows(core[:-1], pattern[:k - 1])
               for k in range(1, len(pattern)))


def follows(tokens: list[str], pattern: list[str]) -> bool:
    """The trace takes the pattern's steps in order; other steps (a lookup, a poll) may come
    between them."""
    it = iter(tokens)
    return all(any(p == "*" or p == t for t in it) for p in pattern)
