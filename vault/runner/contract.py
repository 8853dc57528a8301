"""The task an agent process is given ($VAULTSIM_TASK): the agent contract's fields, built here.

docs/agent-contract.md is the only thing an outside agent may rely on; this
module writes exactly what that page promises, in one place, so the grader and
the task file cannot drift apart:

    agent       the name to open the session with (a restarted process gets the same)
    run_id      as $VAULTSIM_RUN_ID
    goal        the task in words
    steps       [{id, call, params}] in order, each one logical operation done at most
                once; an id names one step in the run (a restart repeats its
                predecessor's ids); `${ID.FIELD}` in a string parameter is FIELD of
                step ID's result data
    operations  the only operations this agent may call, resume or look up
    catalog     per allowed operation: description, risk, mutates, idempotent, params
    deadline    seconds since the epoch; deadline_s the same, from this process's start
    state_dir   a private directory a restart of this agent (same name, same steps)
                finds again, unless the scenario says the restart loses it
    agent_stub  {plan: FILE}: agent_stub's own plan; every other agent ignores it

agent_stub's plan format (recovery policy, `wait_s`, `verify`, ...) is the stub's,
not the contract: see agent_stub/plan.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vault.catalog import Catalog
from vault.runner.scenario import AgentSpec, Scenario, task_steps

STEP_FIELDS = ("id", "call", "params")


@dataclass
class AgentTask:
    """What one agent process is asked to do, as the grader needs it too."""

    index: int
    name: str
    role: str  # the state directory: processes of one role share what they persist
    steps: list[dict[str, Any]]
    operations: list[str]
    deadline: float = 0.0
    deadline_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def document(self, sc: Scenario, run_id: str, catalog: Catalog, state_dir: Path) -> dict[str, Any]:
        return {
            "agent": self.name, "run_id": run_id, "goal": sc.task.goal or sc.title,
            "steps": self.steps, "operations": self.operations,
            "catalog": {name: describe(catalog, name) for name in self.operations if catalog.get(name)},
            "deadline": self.deadline, "deadline_s": round(self.deadline_s, 3), "state_dir": str(state_dir),
            "agent_index": self.index, **self.extra,
        }


def describe(catalog: Catalog, name: str) -> dict[str, Any]:
    op = catalog.get(name)
    assert op is not None
    return {"description": op.description, "risk": str(op.risk), "mutates": op.mutates,
            "idempotent": op.idempotent,
            "params": {p: {"type": spec.type, "required": spec.required} for p, spec in op.params.items()}}


def task_for(sc: Scenario, index: int, spec: AgentSpec, plan: dict[str, Any]) -> AgentTask:
    """The task of agent `index`: its steps (the scenario's, else its stub plan's), its tools."""
    raw = [dict(s) for s in plan.get("steps") or []] if spec.steps is None else task_steps(sc, spec)
    name = spec.name or str(plan.get("agent") or "agent")
    steps = []
    for i, step in enumerate(raw):
        clean = {k: step[k] for k in STEP_FIELDS if k in step}
        clean.setdefault("params", {})
        # an id names one step in the whole run: a restart repeating a step gets its id again,
        # another task's step never does (scenario.py refuses two steps under one given id), also
        # another agent's with the same call and params (its name is in the digest): one id for
        # both made the second agent's own step a restart's, "asked again instead of resuming"
        clean.setdefault("id", f"s{i}-{_digest([name, clean['call'], clean['params']])[:6]}")
        steps.append(clean)
    if spec.operations is not None:
        operations = list(spec.operations)
    elif sc.task.operations is not None:
        operations = list(sc.task.operations)
    else:
        operations = sorted({str(s["call"]) for s in steps})
    # a restart (same name, same steps) finds its predecessor's state directory; another
    # task of the same name, or a restart that loses its state, gets its own
    digest = _digest(steps)[:8]
    role = f"{name}-{digest}" if spec.state == "keep" else f"{name}-{digest}-{index}"
    return AgentTask(index=index, name=name, role=role, steps=steps, operations=operations)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
