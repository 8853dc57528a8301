"""FAIL_DUPLICATE_EFFECT: one step of a task that took effect more often than the task has it.

The effect count per operation (`grade.duplicate_effect`) and the parameter check
(`vault.runner.offtask`) each miss a task whose steps call one operation with different
parameters when an agent files the first step's twice and the second's never: as many effects
as steps, each with a step's parameters. The contract's words (section 9): "made a step take
effect twice". So each request that changed the remote is matched to the steps of its task
(the agent's and its restarts': the same name and steps) that it fits, as `offtask` reads a
request, and a set of fitting steps that took effect more times than it holds steps is named.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from vault.catalog import Catalog, Operation
from vault.runner.evidence import Evidence
from vault.runner.offtask import (_BODY_METHODS, _body_fits, _created, _nothing, _path_fits, _query_fits,
                                  _shown, who)


def steps_twice(ev: Evidence, catalog: Catalog) -> list[str]:
    by_cid = {e.correlation_id: e.agent_index for e in ev.transcript.entries if e.correlation_id}
    op_by_cid: dict[str, str] = {}
    for x in ev.transcript.entries:
        op_by_cid.setdefault(x.correlation_id, x.operation)
    committed = ev.committed_cids()
    created_by = _created(ev, by_cid)
    counts: dict[tuple[str, tuple[int, ...]], list[int | None]] = {}
    seen: set[str] = set()
    for r in ev.requests_sent:
        cid = str(r.get("correlation_id") or "")
        if cid not in committed or cid in seen:
            continue
        seen.add(cid)
        agent = ev.agent(by_cid.get(cid))
        op = catalog.get(op_by_cid.get(cid, ""))
        if agent is None or not agent.steps or op is None or op.executor != "http" or not op.path:
            continue
        created = created_by.get(agent.name, _nothing())
        sent, _, qs = str(r.get("target") or "").partition("?")
        body = r.get("body")
        fits = tuple(i for i, s in enumerate(agent.steps) if s.get("call") == op.name
                     and _fits(op, s, r.get("method"), sent, qs, body, created))
        if fits:  # none: an effect no step asked for, offtask's finding
            task = json.dumps([agent.name, agent.steps], sort_keys=True, default=str)
            counts.setdefault((task, fits), []).append(agent.index)
    out = []
    for (task, fits), agents in counts.items():
        if len(agents) > len(fits):
            steps = json.loads(task)[1]
            step = steps[fits[0]]
            out.append(f"{who(ev, agents[-1])} made one step take effect {len(agents)} times: "
                       f"{step.get('call')} with {_shown(step.get('params') or {})} "
                       f"(step {step.get('id')!s}; its task has it {len(fits)} time(s))")
    return out


def _fits(op: Operation, step: dict[str, Any], method: Any, sent: str, qs: str, body: Any,
          created: dict[str, set[str]]) -> bool:
    if not _path_fits(op, step, sent, created):
        return False
    if method in _BODY_METHODS:
        return isinstance(body, dict) and _body_fits(op, step, body, created)
    return _query_fits(op, step, parse_qsl(qs, keep_blank_values=True), created)
