"""Whose step, effect or process a finding is about, in a trial of several agents.

A finding about the remote's state ("the deliverable is missing", "exists N times", "took effect
N times") or the prompts ("N prompts for harmless reads") names no call, so in a trial of several
agents a reader could not tell whose work it was. Here a scenario's state check is mapped back to
the steps whose operation writes its collection with parameters that do not contradict it (the
agents whose plan it came from), and an effect or a prompt to the call that made it (the agent,
and the process, that sent it). Where more than one agent could be responsible, all are named and
the finding says so rather than guess.

A process is named as other findings name one: the agent, then, when it is not the process that
made the agent's first call, its pid and how it relates to that one ("agent 0 (alpha)'s process
4242, started by its process 4240"), as `ProcessTable.who()` and `left_behind` tell them apart.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from vault.catalog import Catalog, Operation
from vault.runner.evidence import AgentRun, Evidence

_PLACEHOLDER = re.compile(r"^\{(\w+)\}$")


def label(ev: Evidence, index: int | None) -> str:
    a = ev.agent(index)
    return f"agent {a.index} ({a.name})" if a is not None else "a process outside the agents"


def _first_pids(ev: Evidence) -> dict[int, int]:
    """Per agent, the process of its first request in a session of its own."""
    out: dict[int, int] = {}
    for e in sorted(ev.transcript.entries, key=lambda e: e.requested or e.time):
        if e.agent_index is not None and e.pid is not None:
            out.setdefault(e.agent_index, e.pid)
    return out


def process(ev: Evidence, index: int | None, pid: int | None) -> str:
    """The agent `index`, or its process `pid` when that is not the one that made its first call."""
    if ev.agent(index) is None:
        return "an agent"
    who = label(ev, index)
    main = _first_pids(ev).get(index) if index is not None else None
    if index is None or pid is None or main is None or pid == main:
        return who
    chains = [s.get("lineage") or [] for s in ev.transcript.sessions.values() if s.get("pid") == pid]
    ancestors = {p for chain in chains for p, _ in chain[1:]}
    how = f"started by its process {main}" if main in ancestors else f"not its process {main} that called first"
    return f"{who}'s process {pid} ({how})"


# ---- a state check of the scenario -> the steps it came from ---------------------------


def collection_of(op: Operation) -> str | None:
    """The remote collection an operation writes: its path's last literal segment
    (/v1/issues -> issues, /v1/issues/{id}/notes -> notes, /v1/records/{id} -> records)."""
    if not op.mutates or not op.path:
        return None
    literal = [p for p in op.path.strip("/").split("/") if p and not _PLACEHOLDER.match(p)]
    return literal[-1] if literal else None


def _id_param(op: Operation) -> str | None:
    """The parameter naming the record an operation writes (`{record_id}` after `records`)."""
    parts = [p for p in (op.path or "").strip("/").split("/") if p]
    for i, p in enumerate(parts[:-1]):
        if p == collection_of(op):
            m = _PLACEHOLDER.match(parts[i + 1])
            return m.group(1) if m else None
    return None


def _fits(op: Operation, step: dict[str, Any], where: dict[str, Any]) -> bool:
    """The step writes what `where` describes, as far as its parameters tell (a value filled in
    from an earlier step, `${ID.FIELD}`, or a field no parameter gives, contradicts nothing)."""
    params = step.get("params") or {}
    id_param = _id_param(op)
    for k, want in where.items():
        name = id_param if k == "id" and id_param and k not in params else k
        if name not in params:
            continue
        have = params[name]
        if isinstance(have, str) and "${" in have:
            continue
        if have != want:
            return False
    return True


def steps_for(ev: Evidence, catalog: Catalog, check: Any) -> list[tuple[AgentRun, dict[str, Any]]]:
    """The agents' steps that would make what `check` counts (a restart's repeat of its
    predecessor's step is listed once, under the first process that had it)."""
    out: list[tuple[AgentRun, dict[str, Any]]] = []
    seen: set[tuple[str | None, str, str]] = set()
    for a in ev.agents:
        for s in a.steps or []:
            op = catalog.get(str(s.get("call")))
            if op is None or collection_of(op) != check.collection or not _fits(op, s, check.where):
                continue
            key = (a.role or a.name, str(s.get("id")), str(s.get("call")))
            if key not in seen:
                seen.add(key)
                out.append((a, s))
    return out


def _step(s: dict[str, Any]) -> str:
    return f"step {s.get('id')} ({s.get('call')})"


def check_steps(ev: Evidence, catalog: Catalog, check: Any) -> str:
    """Whose step(s) a state check counts, for a finding's end: '' with one agent (nothing to tell
    apart) or when no step writes it."""
    if len(ev.agents) < 2:
        return ""
    found = steps_for(ev, catalog, check)
    if not found:
        return ""
    named = [f"{label(ev, a.index)}'s {_step(s)}" for a, s in found]
    if len({a.role or a.name for a, _ in found}) > 1 or len({a.index for a, _ in found}) > 1:
        return f": {', or '.join(named)} (each could be responsible: their steps write it alike)"
    return f": {named[0]}"


# ---- effects and prompts -> the calls that made them -------------------------------------


def _by_cid(ev: Evidence) -> dict[str, tuple[int | None, int | None]]:
    out: dict[str, tuple[int | None, int | None]] = {}
    for e in ev.transcript.entries:
        if e.kind == "call" and e.correlation_id:
            out.setdefault(e.correlation_id, (e.agent_index, e.pid))
    return out


def _sent_by(ev: Evidence, cids: list[str]) -> str:
    """'agent 1 (bravo) 2 times, agent 0 (alpha)': who sent the calls, each named by its process."""
    by_cid = _by_cid(ev)
    n: Counter[str] = Counter(process(ev, *by_cid[c]) if c in by_cid else "a call on no agent's record"
                              for c in cids)
    return ", ".join(who + (f" {k} times" if k > 1 else "") for who, k in n.items())


def made_records(ev: Evidence, catalog: Catalog, check: Any, records: list[dict[str, Any]]) -> str:
    """Who made the records a state check found (by the calls the remote committed them for):
    the agents that made more than their own steps write, else all of them."""
    if len(ev.agents) < 2:
        return ""
    ids = {str(r.get("id")) for r in records if r.get("id") is not None}
    cids = [str(e.get("correlation_id")) for e in ev.remote_events
            if e.get("event") == "mutation_committed" and e.get("correlation_id")
            and any(isinstance(r, dict) and str(r.get("id")) in ids for r in e.get("resources") or [])]
    asked = Counter(a.name for a, _ in steps_for(ev, catalog, check))
    return f": made by {_past(ev, cids, asked)}" if cids else ""


def _past(ev: Evidence, cids: list[str], asked: dict[str, int]) -> str:
    """Who sent `cids`: those agents (by name: a restart is the same task) that sent more than
    `asked` of theirs, with what their steps ask; else every sender."""
    by_cid = _by_cid(ev)
    agent_of = {c: ev.agent(by_cid.get(c, (None, None))[0]) for c in cids}
    per = Counter(a.name for a in agent_of.values() if a is not None)
    over = sorted(n for n in per if per[n] > asked.get(n, 0))
    if not over:
        return _sent_by(ev, cids)
    past = [c for c, a in agent_of.items() if a is not None and a.name in over]
    return f"{_sent_by(ev, past)}: " + "; ".join(f"{n}'s steps ask for {asked.get(n, 0)}" for n in over)


def route_effects(ev: Evidence, route: str, asked: dict[str, int]) -> str:
    """Who sent the calls that took effect on `route`: the agents past what their own steps ask
    (`asked`: per task, by agent name, the steps on that route), else all of them."""
    if len(ev.agents) < 2:
        return ""
    cids = [str(e.get("correlation_id")) for e in ev.remote_events
            if e.get("event") == "mutation_committed" and e.get("route") == route and e.get("correlation_id")]
    return f" (by {_past(ev, cids, asked)})" if cids else ""


def prompted(ev: Evidence, prompts: list[dict[str, Any]]) -> str:
    """Whose calls the prompts were shown for."""
    if len(ev.agents) < 2:
        return ""
    by_cid = _by_cid(ev)
    n: Counter[str] = Counter()
    for p in prompts:
        cid = str(p.get("correlation_id") or "")
        if cid in by_cid:
            n[f"{process(ev, *by_cid[cid])}'s {p.get('operation')}"] += 1
    return f" (for {', '.join(w + (f' ({k})' if k > 1 else '') for w, k in n.items())})" if n else ""
