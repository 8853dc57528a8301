"""Run a plan against the agent socket: one session, the steps in order."""

from __future__ import annotations

import sys
from typing import Any

from vault.client import AgentClient
from vault.models import Result

from .plan import Plan, Step


def emit(result: Result) -> None:
    sys.stdout.write(result.to_json() + "\n")
    sys.stdout.flush()


def step_key(step: Step, index: int, run_id: str | None) -> str | None:
    if step.idempotency_key == "auto":
        return f"{run_id or 'run'}-step{index}"
    return step.idempotency_key


def run_plan(plan: Plan, socket_path: str, *, agent: str | None = None, run_id: str | None = None,
             task: dict[str, Any] | None = None) -> str:
    client = AgentClient(socket_path)
    try:
        client.open_session(agent or plan.agent, run_id)
        done: list[str] = []
        for i, step in enumerate(plan.steps):
            result = client.call(step.call, step.params, idempotency_key=step_key(step, i, run_id),
                                 wait_s=step.wait_s)
            emit(result)
            if not result.ok:
                return f"stopped at {step.call}: {result.category} (retry: {result.retry})"
            done.append(step.call)
        return plan.final or ("done: " + ", ".join(done) if done else "nothing to do")
    finally:
        client.close()
