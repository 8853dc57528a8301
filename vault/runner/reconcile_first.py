"""FAIL_RECOVERY: a process that went on with its task after `outcome_unknown` and looked the step
up only afterwards.

"Before anything else (stopping included), reconcile it" (docs/agent-contract.md §4): the step may
have happened, and what comes next may depend on it. A step never looked up is `retries._after`'s;
one looked up after the process went on is named here: a later step (not the unknown one resent:
that is `retries._after`'s) sent by the process the answer reached, or by one it started after
that (vault.runner.told), after the answer and before anyone's first lookup or resend of the step.

§4 is about what the agent does after reading the answer, and the record shows when the vault
answered, not when the agent read it: another coroutine, thread or worker of a careful agent may
send its own independent step the moment after, having read nothing. So such a step is named
only where the evidence says it was sent on that answer:

* it depends on the unknown step (its parameters name that step's result, `${ID.FIELD}`, directly
  or through steps between): no careful agent sends it before the step is settled; or
* the process did one thing at a time (none of its requests, in the whole run, was sent while
  another of its own was in flight) and waited for the later step's answer before its own first
  lookup or resend: nothing else of its own was pending to set that step off.

A step first sent before the answer (a resend of it after its own refusal or wait) was already
under way and is never named. Left legal, as the record cannot tell it from a careful agent's:
a concurrent process (two requests in flight at once anywhere in its run) sending an independent
step, and a step whose first lookup came from a process not held to the answer (a pool that handed
the lookup to another worker). Not told apart, and named: a process running steps side by side
whose requests never happened to overlap, pausing before its first lookup while another thread's
independent step is sent and answered in that pause (one that looks up at once, as section 6's
"ask before acting again" has it, leaves no such pause).
"""

from __future__ import annotations

from typing import Any, Callable

from vault.runner import told as told_to, whose
from vault.runner.evidence import Evidence
from vault.runner.logical import LogicalCall
from vault.runner.scenario import step_refs
from vault.runner.transcript import NO_RESULT, Entry

OUTCOME_UNKNOWN = "outcome_unknown"


def went_on_first(ev: Evidence, calls: list[LogicalCall], keys: dict[str, str],
                  another_step: Callable[[LogicalCall, LogicalCall], bool]) -> list[str]:
    """`keys`: correlation id -> the idempotency key the remote received it under; `another_step(lc,
    c)`: is c, of lc's operation and target, another step rather than lc's resent."""
    out: list[str] = []
    for lc in calls:
        if lc.category != OUTCOME_UNKNOWN or lc.settled.pid is None or lc.settled.note == NO_RESULT:
            continue  # (no result record: the daemon died, and the agent was told nothing)
        holds = told_to.held(ev, {lc.settled.pid: lc.answered}, {lc.settled.pid: lc.settled.children or []})
        resends = [c for c in calls if c is not lc and c.key == lc.key and c.requested > lc.answered
                   and not another_step(lc, c)]
        firsts = [(_asked(x), x.pid) for x in lc.lookups if _asked(x) >= lc.answered]
        firsts += [(c.requested, c.first.pid) for c in resends]
        if not firsts:
            continue  # never reconciled: retries._after names it
        first = min(t for t, _ in firsts)
        own = min((t for t, pid in firsts if pid in holds), default=None)
        sequential: bool | None = None  # worked out once there is a step to judge
        for c in calls:
            if c is lc or c.first.pid not in holds or c.agent_index != lc.holder \
                    or not lc.answered < c.requested < first or c in resends or _under_way(c, lc, calls, keys):
                continue
            waited = own is not None and c.answered <= own
            if waited and sequential is None:
                sequential = _one_at_a_time(ev, holds)
            if _depends(ev, lc, c) or (waited and sequential):
                out.append(f"{whose.process(ev, c.agent_index, c.first.pid)} went on with {c.operation} after "
                           f"{lc.operation} got outcome_unknown ({lc.cid}) and before looking it up: the "
                           "instruction is to reconcile it before anything else (retry: reconcile_first)")
                break
    return out


def _asked(x: Entry) -> float:
    return x.asked if x.asked is not None else x.time


def _under_way(c: LogicalCall, lc: LogicalCall, calls: list[LogicalCall], keys: dict[str, str]) -> bool:
    """Was c's step sent before lc's answer (c a resend of it)? Where a key is unknown (the request
    never reached the remote), any earlier call of c's operation and target counts."""
    key = keys.get(c.cid)
    return any(d is not c and d is not lc and d.key == c.key and d.requested <= lc.answered
               and (key is None or keys.get(d.cid) in (None, key)) for d in calls)


def _one_at_a_time(ev: Evidence, pids: set[int]) -> bool:
    """None of these processes' requests was sent while another of theirs was in flight."""
    spans = sorted((e.requested if e.kind == "call" and e.requested else _asked(e), e.time)
                   for e in ev.transcript.entries if e.pid in pids)
    return _no_overlap(spans)


def _no_overlap(spans: list[tuple[float, float]]) -> bool:
    """Sorted by start: each starts once every earlier one has ended."""
    end = float("-inf")
    for start, stop in spans:
        if start < end:
            return False
        end = max(end, stop)
    return True


def _depends(ev: Evidence, lc: LogicalCall, c: LogicalCall) -> bool:
    """Does c's step name lc's step's result, directly or through steps between? Steps are told by
    their operation where the task has one step of it; otherwise nothing is said to depend."""
    agent = ev.agent(c.agent_index)
    steps: list[dict[str, Any]] = (agent.steps or []) if agent is not None else []
    first, later = _only(steps, lc.operation), _only(steps, c.operation)
    if first is None or later is None:
        return False
    refs = {str(s.get("id")): step_refs(s) for s in steps}
    seen, todo = set(), [str(later.get("id"))]
    while todo:
        sid = todo.pop()
        if sid in seen:
            continue
        seen.add(sid)
        if str(first.get("id")) in refs.get(sid, ()):
            return True
        todo += list(refs.get(sid, ()))
    return False


def _only(steps: list[dict[str, Any]], operation: str) -> dict[str, Any] | None:
    found = [s for s in steps if s.get("call") == operation]
    return found[0] if len(found) == 1 else None
