"""Is a call under a new key another step, or a step sent again? Counted among the steps it fits.

§5: "the gate counts a new key as one [a resend] only when your task has sent more keys for that
operation than it has steps calling it". Counted over the whole operation, a step resent under a
new key hid behind a sibling step the task never sent: two records, the first answered
rate_limited and sent again under a new key, the second never sent, is two keys for two steps.
A step is an operation with its parameters (§2), so the keys are counted among the steps the
request's parameters fit (vault.runner.step_claims.step_fits: the prompt, the path, the body or
query the remote got) and the calls that could be one of those steps. A request with nothing to
compare fits every step of its operation, which is the count over the whole operation again.
"""

from __future__ import annotations

from vault.runner.evidence import Evidence
from vault.runner.logical import LogicalCall

Fits = dict[str, tuple[int, set[int]]]


def another_step(ev: Evidence, lc: LogicalCall, nxt: LogicalCall, calls: list[LogicalCall],
                 sent: dict[str, str], fits: Fits | None) -> bool:
    """`nxt` (under a key other than lc's, both in `sent`) could be a step of its task other than
    lc's: the task's calls of those steps hold no more keys than there are such steps."""
    agent = ev.agent(nxt.agent_index)
    if agent is None or agent.steps is None:
        return False
    same = {a.index for a in ev.agents if a.same_task(agent)}
    mine = {i for i, s in enumerate(agent.steps) if s.get("call") == lc.operation}

    def could(c: LogicalCall) -> set[int]:
        f = (fits or {}).get(c.cid)
        return mine if f is None else f[1] & mine

    room = could(nxt) or mine  # fits no step at all: off-task (offtask names it), counted as before
    keys = {sent[c.cid] for c in calls if c.agent_index in same and c.operation == lc.operation
            and c.cid in sent and could(c) & room}
    return len(keys) <= len(room)
