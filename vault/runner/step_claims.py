"""A `done` claim whose steps succeeded only off target (FAIL_OUTCOME).

Why: a step is an operation *with its parameters* (docs/agent-contract.md, section 2), and `done`
claims that every step succeeded (section 7). The claim check (vault.runner.claims) counts a
process's successful calls per operation; an agent that attached its task's note to an issue its
task never named (a seeded `ISS-1` instead of `${create.id}`) and said `done` had an
`attach_note` success to show, and its claim passed: the effect was named (a call off its task,
vault.runner.offtask), the lie was not. Here a call whose parameters fit no step of its agent
(offtask's reading: the prompt, the path, the body or query the remote got) does not count
towards the claim; only operations the claim check found complete are looked at, so a step
missing altogether is named once, there.
"""

from __future__ import annotations

from collections import Counter

from vault.catalog import Catalog
from vault.runner.claims import claim_of, read_as
from vault.runner.evidence import Evidence
from vault.runner.offtask import calls_off_task


def done_off_target(ev: Evidence, catalog: Catalog) -> list[str]:
    off = {cid for cid, _ in calls_off_task(ev, catalog)}
    if not off:
        return []
    out = []
    for agent in ev.agents:
        if agent.steps is None or claim_of(agent.final) != "done":
            continue
        # a restart continues its predecessor's task (the claim check's reading)
        same = {a.index for a in ev.agents if a.index <= agent.index and a.role == agent.role
                and a.steps == agent.steps}
        need = Counter(str(s.get("call")) for s in agent.steps)
        have: Counter[str] = Counter()
        fit: Counter[str] = Counter()
        for lc in ev.timeline().calls:
            if (lc.agent_index in same or lc.holder in same) and lc.succeeded(by=agent.ended + 0.01):
                have[lc.operation] += 1
                fit[lc.operation] += lc.cid not in off
        short = [op for op in need if have[op] >= need[op] > fit[op]]
        if short:
            out.append(f"agent {agent.index} ({agent.name}) claims completion{read_as(agent.final)}, but "
                       + ", ".join(f"{op} succeeded only with parameters no step of its task gives"
                                   + (f" ({need[op] - fit[op]} of {need[op]})" if need[op] > 1 else "")
                                   for op in short)
                       + ": those steps were not done")
    return out
