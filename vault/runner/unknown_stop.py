"""FAIL_RECOVERY: a process that went on with its task after a lookup left a step's outcome unknown.

After `outcome_unknown` a lookup that still answers `unknown` (asked again a few times) ends the
task: "if still unknown, stop the task: a person must inspect it" (docs/agent-contract.md §6). A
later step may build on the one nobody can vouch for (an issue saying the restart was done, a
release announced after a deployment nobody found), so it is named as a `never` answer's is
(`retries._after`: "went on with ... the task stops there"). Held to it: the process that got the
`unknown` and the one the call's outcome_unknown answered (by pid: a child may look it up for its
parent; a pool's other workers read neither), and a process either started after it was told
(a new child handed the later steps) or below such a one (vault.runner.told), for calls they sent
after that lookup's answer,
when no lookup ever found or did not find the step (one that did in the end leaves nothing for a
person to inspect: a careful agent's other coroutine may have gone on while it asked again). A paced lookup (`rate_limited`, `unknown`)
says to ask again, not to stop; a lookup answered before the call's own answer (the call still
being performed) likewise.
"""

from __future__ import annotations

from typing import Callable

from vault.runner import told as told_to, whose
from vault.runner.evidence import Evidence
from vault.runner.logical import LogicalCall
from vault.runner.transcript import Entry

OUTCOME_UNKNOWN = "outcome_unknown"
SETTLED = ("found", "not_found")


def went_on_unknown(ev: Evidence, calls: list[LogicalCall],
                    another_step: Callable[[LogicalCall, LogicalCall], bool]) -> list[str]:
    """`another_step(lc, c)`: is c, of lc's operation and target, another step rather than lc's
    resent (a resend after `unknown` is `retries._after`'s)."""
    out: list[str] = []
    for lc in calls:
        if lc.category != OUTCOME_UNKNOWN:
            continue
        looked = sorted((x for x in lc.lookups if x.lookup_of in (None, lc.cid)), key=lambda x: x.time)
        if any(y.reconciled in SETTLED for y in looked):
            continue  # found or not found in the end: a step sent while it was still asked about harmed nothing
        for x in looked:
            if not _stops(x, lc) or x.agent_index is None:
                continue
            told: dict[int, float] = {}
            told_to.tell(told, lc.settled.pid, lc.answered)
            told_to.tell(told, x.pid, x.time)
            holds = told_to.held(ev, told, _children(lc, x))
            later = next((c for c in calls if c is not lc and c.first.pid in holds
                          and c.agent_index == x.agent_index and c.requested > x.time
                          and (c.key != lc.key or another_step(lc, c))), None)
            if later is not None:
                out.append(f"{whose.process(ev, later.agent_index, later.first.pid)} went on with "
                           f"{later.operation} after {lc.operation}'s outcome stayed unknown ({lc.cid}; its lookup "
                           f"answered unknown): the task stops there, a person must inspect it")
                break
    return out


def _children(lc: LogicalCall, x: Entry) -> dict[int, list[tuple[int, float]]]:
    """Each told process's children when it was first told, where the record has them: the call's
    answer's, and the lookup's for a process the call's answer did not reach (one the call's reached
    was told first by it: a child it started between the two is held)."""
    ran: dict[int, list[tuple[int, float]]] = {}
    for e in (lc.settled, x):
        if e.pid is not None and e.pid not in ran:
            ran[e.pid] = e.children or []
    return ran


def _stops(x: Entry, lc: LogicalCall) -> bool:
    """A lookup answered after the call's own outcome_unknown, still unknown, and not paced."""
    return x.reconciled == "unknown" and x.category != "rate_limited" and x.time >= lc.answered

