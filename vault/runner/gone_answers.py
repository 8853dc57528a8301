"""Answers written to a connection that had gone: whether the agent ever got them.

The vault answers a call when its approval is decided or its wait ends, also when the process
that asked had died in between (a helper killed after sending). That answer went to a closed
connection. While the agent's other processes still ran it would otherwise count as theirs: a
driver that never held the call's resume token and said `waiting` was graded "stopped in time
holding it" (red team 35c's killed helper's lying twin, on a loaded host).

Such an answer is `unreceived` unless the agent learned the call's state another way (sections
3, 6, 7 and 8): a lookup of that call (by its correlation id or idempotency key) answered after the
connection had gone, which tells the call's answer or, while it waits, its resume token; or a
resume of that call, which presents its token. A replacement worker that looked up its dead
worker's step and was told `malformed_response` got that answer (red team 33c's pool).

The same holds for an answer written after the whole agent had exited (its process was seen to
exit: the runner's window, `exited`): a restart of its task (the same name and steps,
`AgentRun.same_task`) that looked the call up, or resumed it, after that answer was written learned
it; otherwise it reached nobody. (After it, not before: the runner's teardown settles a call still
held `approval_unroutable` once every agent is gone, which a restart that had resumed it, and
stopped holding it pending, never read.) Only the agent's own task learns: a lookup or resume by
another task is not its.

A session closed by `session.close` keeps its connection: an answer after that still reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from vault.runner.evidence import AgentRun
    from vault.runner.transcript import Entry, Transcript

GONE = ("connection closed", "process exited")


def task_ids(agents: Iterable["AgentRun"]) -> list[int]:
    """Per agent index, the index of the first agent of its task (a restart shares its task's)."""
    runs = list(agents)
    return [min(b.index for b in runs if b.same_task(a) or b is a) for a in runs]


def gone_at(s: dict[str, Any] | None) -> float | None:
    """When the session's connection went (it closed, or its process exited), if it did."""
    closed = (s or {}).get("closed")
    if isinstance(closed, (int, float)) and (s or {}).get("close_reason") in GONE:
        return float(closed)
    return None


def mark(t: "Transcript", owned: set[str], exited: Sequence[tuple["Entry", float]] = (),
         tasks: Sequence[int] | None = None) -> None:
    """Marks `unreceived`, where the agent never learned it otherwise: each call or resume answer
    written after its connection had gone, of a session of an agent's own processes (`owned`), and
    each of `exited` (an answer and when its agent was seen to exit, before it was written).
    `tasks`: per agent index, its task (task_ids); None: any agent's lookup or resume counts."""
    late = [(e, went) for e, went in exited if not e.unreceived]
    for e, _ in late:  # first all: one written after its agent exited teaches nothing of another
        e.unreceived = True
    for e, exit_at in late:
        told = max(exit_at, e.time)  # a lookup or resume after the answer: it told that answer
        if _learned(t, e, told, tasks, resumed_after=told):
            e.unreceived = None
    for e in t.entries:
        if e.kind not in ("call", "resume") or e.unreceived or e.session_id not in owned:
            continue
        went = gone_at(t.sessions.get(e.session_id or ""))
        if went is not None and went < e.time and not _learned(t, e, went, tasks):
            e.unreceived = True


def _learned(t: "Transcript", e: "Entry", went: float, tasks: Sequence[int] | None,
             resumed_after: float = float("-inf")) -> bool:
    """Whether the agent learned e's call another way: its task looked it up after `went`, or
    resumed it (after `resumed_after`) on a connection that was still there. (A lookup's
    connection is not asked after: older logs name no session for it, and the one guessed could be
    the dead process's.)"""
    cid = e.correlation_id
    for x in t.entries:
        if x.unreceived or x is e or not _same_task(tasks, e.agent_index, x.agent_index):
            continue
        if x.kind == "lookup" and _names(t, x, e) and x.time > went:
            return True
        if x.kind == "resume" and x.correlation_id == cid and x.time > resumed_after and _there(t, x):
            return True
    return False


def _names(t: "Transcript", x: "Entry", e: "Entry") -> bool:
    """Lookup x asked about e's call. An older daemon's notifications (the fallback transcript) did
    not say which call a lookup named: there one of e's operation is given the benefit of the doubt."""
    if x.lookup_of is None and t.source == "activity" and not t.lookups_linked:
        return x.operation == e.operation
    return x.lookup_of == e.correlation_id


def _same_task(tasks: Sequence[int] | None, a: int | None, b: int | None) -> bool:
    """Agents a and b run one task (an index the record could not attribute is given the benefit)."""
    if tasks is None or a is None or b is None or not (0 <= a < len(tasks) and 0 <= b < len(tasks)):
        return True
    return tasks[a] == tasks[b]


def _there(t: "Transcript", x: "Entry") -> bool:
    """x's answer was written while its connection was still there."""
    went = gone_at(t.sessions.get(x.session_id or ""))
    return went is None or went >= x.time
