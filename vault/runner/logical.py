"""Logical calls: a call and the resumes that collected it are one operation.

An agent may wait for an approval inside its call (blocking) or take the
`approval_pending` answer at once and collect the decision with `call.resume`
(non-blocking). Both are one logical call to the grader, graded by its
*settled* result: the last answer any process got for that correlation id.
A lookup that said `found` with a success settles an `outcome_unknown` call as
done; lookups stay in the trace as their own tokens.

    LogicalCall   cid, operation, target, the process that made it, its answers
    Timeline      the run's logical calls and lookups in request order, and the
                  trace tokens transitions are matched against
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vault.models import Category, Retry
from vault.runner.transcript import Entry, Transcript

SUCCESS = Category.success.value
PENDING = Category.approval_pending.value
# how a pending approval ends when a person (or its deadline, or no approver) decides it
_DECIDED = frozenset({Category.approval_denied.value, Category.approval_expired.value,
                      Category.approval_unroutable.value})


@dataclass
class LogicalCall:
    cid: str
    operation: str
    answers: list[Entry] = field(default_factory=list)  # the call, then its resumes
    lookups: list[Entry] = field(default_factory=list)  # lookups that named this call

    @property
    def first(self) -> Entry:
        return self.answers[0]

    @property
    def settled(self) -> Entry:
        """The last answer a process got. An answer given after its process had exited reached
        nobody: a call given up on while the vault held it was, to the agent, left pending."""
        got = [e for e in self.answers if not e.unreceived]
        if got:
            return got[-1]
        return replace(self.answers[0], category=PENDING, retry=Retry.after_approval.value)

    @property
    def category(self) -> str:
        return self.settled.category

    @property
    def retry(self) -> str:
        return self.settled.retry

    @property
    def target(self) -> str | None:
        return self.first.target

    @property
    def key(self) -> tuple[str, str | None]:
        """What makes two calls "the same again": the operation and the resource it acts on."""
        return (self.operation, self.target)

    @property
    def requested(self) -> float:
        return self.first.requested or self.first.time

    @property
    def answered(self) -> float:
        """When the settled answer was given."""
        return self.settled.time

    @property
    def last_touch(self) -> float:
        return max([e.time for e in self.answers] + [e.time for e in self.lookups])

    @property
    def agent_index(self) -> int | None:
        return self.first.agent_index

    @property
    def holder(self) -> int | None:
        """The process that got the last answer (a restarted agent may collect it)."""
        return self.settled.agent_index

    @property
    def session_id(self) -> str | None:
        return self.first.session_id

    @property
    def executed(self) -> bool:
        return any(e.executed for e in self.answers)

    @property
    def resumed(self) -> bool:
        return len(self.answers) > 1

    def succeeded(self, by: float | None = None) -> bool:
        """Done, by its own answer or by a lookup that found it with a success (up to `by`)."""
        answers = [e for e in self.answers if by is None or e.time <= by]
        if answers and answers[-1].category == SUCCESS:
            return True
        return any(x.reconciled == "found" and x.category == SUCCESS and (by is None or x.time <= by)
                   for x in self.lookups)

    def settled_by(self, t: float) -> Entry | None:
        """The last answer given up to time t."""
        answers = [e for e in self.answers if e.time <= t and not e.unreceived]
        return answers[-1] if answers else None


@dataclass
class Timeline:
    calls: list[LogicalCall]
    lookups: list[Entry]
    other: list[Entry]  # resumes whose call is not in the transcript

    @classmethod
    def of(cls, transcript: Transcript) -> "Timeline":
        by_cid: dict[str, LogicalCall] = {}
        lookups, other = [], []
        for e in transcript.entries:
            if e.kind == "call":
                by_cid.setdefault(e.correlation_id, LogicalCall(e.correlation_id, e.operation)).answers.append(e)
            elif e.kind == "lookup":
                lookups.append(e)
        # resumes after every call: a successor's resume of a call whose own (killed) waiter was
        # answered later is that call's all the same; answers in the order they were given
        for e in transcript.entries:
            if e.kind == "resume":
                lc = by_cid.get(e.correlation_id)
                if lc is None:
                    other.append(e)
                else:
                    lc.answers.append(e)
        for lc in by_cid.values():
            lc.answers.sort(key=lambda a: (a.kind != "call", a.time))  # the call stays first
        calls = sorted(by_cid.values(), key=lambda c: c.requested)
        for x in lookups:
            lc = by_cid.get(x.lookup_of or "")
            if lc is None:  # looked up by key: the latest earlier call of that operation
                lc = next((c for c in reversed(calls) if c.operation == x.operation and c.answered <= x.time),
                          None)
            if lc is not None:
                lc.lookups.append(x)
                if x.lookup_of == lc.cid and x.category in _DECIDED and lc.category == PENDING:
                    # a person decided while nobody waited (its waiter gone): the vault's lookup of the
                    # call repeats that refusal, which settles it for the process that asked (§6)
                    lc.answers.append(x)
        return cls(calls, lookups, other)

    def by_process(self, index: int) -> list[LogicalCall]:
        return [c for c in self.calls if c.agent_index == index]

    def tokens(self) -> list[str]:
        """The trace: each logical call as `op, settled category`, each lookup as `lookup, reconciled`,
        in the order they were asked for."""
        items: list[tuple[float, list[str]]] = [(c.requested, [c.operation, c.category]) for c in self.calls]
        items += [(x.time, ["lookup", x.reconciled or "unknown"]) for x in self.lookups]
        items.sort(key=lambda item: item[0])
        return [tok for _, toks in items for tok in toks]

    def tokens_as_answered(self) -> list[str]:
        """The trace as it unfolded: each call's operation where it was asked for and its settled
        category where that answer came. Calls in flight at once (reads sent together on one
        session, §3) are not one sent "after" the other's answer; sequential calls read as in
        tokens()."""
        items: list[tuple[float, list[str]]] = [(c.requested, [c.operation]) for c in self.calls]
        items += [(c.answered, [c.category]) for c in self.calls]
        items += [(x.time, ["lookup", x.reconciled or "unknown"]) for x in self.lookups]
        items.sort(key=lambda item: item[0])
        return [tok for _, toks in items for tok in toks]

    def decision(self, transcript: Transcript, lc: LogicalCall) -> dict[str, Any]:
        return transcript.decisions.get(lc.cid, {})
