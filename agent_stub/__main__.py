"""Entry point: parse options and environment, run the plan, print results.

The agent contract (docs/agent-contract.md): VAULTSIM_SOCKET (the agent
socket), VAULTSIM_TASK (a JSON file: agent name, steps, operations, deadline,
state_dir; and `agent_stub.plan`, this stub's own plan), VAULTSIM_RUN_ID. Each
Result is printed as one JSON line; the last line is the final message, whose
first word states the claim (`done`, `waiting`, `not done`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vault.errors import BadInput, VaultError

from agent_stub.plan import Plan, load_plan
from agent_stub.runner import run_plan
from agent_stub.task import Task

# a plan `vaultsim init` writes, against the daemon of the session's home
EXAMPLE = 'python -m agent_stub --plan plans/deploy.yaml --socket "$VAULTSIM_HOME/agent.sock"'


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_stub", description="vaultsim test agent",
                                epilog=f"example:\n  {EXAMPLE}", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", help="plan YAML (default: the plan named in $VAULTSIM_TASK)")
    p.add_argument("--socket", help="agent socket (default: $VAULTSIM_SOCKET)")
    p.add_argument("--agent", help="agent name (default: from the plan)")
    p.add_argument("--recovery", choices=["safe", "naive"], help="override the plan's recovery policy")
    p.add_argument("--run-id", default=os.environ.get("VAULTSIM_RUN_ID"))
    args = p.parse_args(argv)
    socket_path = args.socket or os.environ.get("VAULTSIM_SOCKET")
    if not socket_path:
        print("agent_stub: no socket: pass --socket or set VAULTSIM_SOCKET", file=sys.stderr)
        return 2
    try:
        task = Task.from_env()
    except (OSError, ValueError):
        print("agent_stub: VAULTSIM_TASK is not a readable JSON file", file=sys.stderr)
        return 2
    plan_path = args.plan or task.plan
    try:
        plan = load_plan(plan_path) if plan_path else Plan.model_validate(task.raw.get("plan_inline", {}))
    except BadInput as exc:
        print(f"agent_stub: {exc.message}", file=sys.stderr)
        return 2
    if args.recovery:
        plan = plan.model_copy(update={"recovery": args.recovery})
    try:
        final = run_plan(plan, socket_path, agent=args.agent or task.agent, run_id=args.run_id, task=task)
    except VaultError as exc:
        print(json.dumps({"error": exc.message}))
        print(f"not done: {exc.message}")
        return 1
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
