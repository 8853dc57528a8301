#!/usr/bin/env python3
"""Red team 43c: a thread-pool agent (concurrent.futures) written from docs/agent-contract.md alone.

One session per process (section 3), shared by the pool's threads over one pipelined connection:
the contract binds a session to the process, not to a thread. Independent `auto` steps run side by
side; gated steps one at a time in order; a step naming `${ID.FIELD}` once step ID is done (see
rt43c_core.Plan). The final message is printed after the pool is joined.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt43c_core as core  # noqa: E402


def main() -> int:
    task = core.load_task()
    store = core.Store(task["state_dir"])
    try:
        wire = core.Wire(os.environ["VAULTSIM_SOCKET"], task)
        session = core.Session(wire, task, "rt43c-threads")
    except (OSError, core.RpcError, core.TooLate) as e:
        print(f"not done: cannot reach the vault ({e})", flush=True)
        return 0
    try:
        gated = core.gated_ops_from(session.plain("catalog", {}))
    except (core.RpcError, OSError):
        gated = None
    plan = core.Plan(task, store, gated)

    def one(flow: core.Flow) -> tuple[str, Any]:
        return core.run_flow(flow, lambda op: core.execute(op, session, store))

    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="step") as pool:
        futs: dict[Future[tuple[str, Any]], tuple[dict[str, Any], dict[str, Any]]] = {}
        while True:
            for step, params, rec in plan.ready():
                futs[pool.submit(one, core.step_flow(task, step, params, rec))] = (step, rec)
            if not futs:
                break
            finished, _ = wait(futs, return_when=FIRST_COMPLETED)
            for f in finished:
                step, rec = futs.pop(f)
                out = f.result()
                core.record_outcome(store, rec, out)
                plan.finish(step["id"], out)
    print(plan.message(), flush=True)
    session.close()
    wire.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
