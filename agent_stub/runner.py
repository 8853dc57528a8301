"""Run a plan against the agent socket: one session, the plan's recovery policy."""

from __future__ import annotations

import os
import sys

from vault.client import AgentClient

from agent_stub.plan import Plan
from agent_stub.receipts import Receipts
from agent_stub.recovery import POLICIES, Agent, emit
from agent_stub.task import Task

__all__ = ["emit", "run_plan"]


def run_plan(plan: Plan, socket_path: str, *, agent: str | None = None, run_id: str | None = None,
             task: Task | None = None) -> str:
    task = task or Task()
    if plan.debug_env:
        # the careless habit leak scenarios reproduce: dumping the environment to a log
        for name, value in sorted(os.environ.items()):
            print(f"env {name}={value}", file=sys.stderr)
    client = AgentClient(socket_path, until=task.deadline)
    try:
        name = agent or plan.agent
        client.open_session(name, run_id)
        state = Agent(client=client, socket_path=socket_path, plan=plan, task=task, name=name,
                      run_id=run_id, receipts=Receipts(task.state_dir))
        return POLICIES[plan.recovery](state).run()
    finally:
        client.close()
