#!/usr/bin/env python3
"""Red team 43c: a multiprocessing agent written from docs/agent-contract.md alone (stdlib).

`rt43c_procs.py spawn` or `rt43c_procs.py forkserver`: the start method. The parent never calls
the vault (it reads the catalog on a connection without a session); two worker processes, started
before any step, each open their own session (one per process, section 3) and make the calls. All
gated steps go to worker 0, one at a time in order, so its session's grant covers them (a grant
is one session's: section 3); independent `auto` steps go to whichever worker has less to do.
State is one file per step in state_dir, so a worker keeps its own step's token before it waits.
The parent writes the final message after joining the workers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt43c_core as core  # noqa: E402

WORKERS = 2


def worker(index: int, jobs: Any, results: Any) -> None:
    task = core.load_task()
    store = core.Store(task["state_dir"])
    session = None
    wire = None
    try:
        wire = core.Wire(os.environ["VAULTSIM_SOCKET"], task)
        session = core.Session(wire, task, f"rt43c-procs-worker-{index}")
    except (OSError, core.RpcError, core.TooLate) as e:
        core.log(f"worker {index}: cannot reach the vault ({e})")
    while True:
        job = jobs.get()
        if job is None:
            break
        step, params, rec = job
        if session is None:
            out: tuple[str, Any] = ("stop", "the worker could not reach the vault")
        else:
            s = session
            out = core.run_flow(core.step_flow(task, step, params, rec),
                                lambda op: core.execute(op, s, store))
        core.record_outcome(store, rec, out)
        results.put((index, step["id"], out))
    if session is not None:
        session.close()
    if wire is not None:
        wire.close()


def main() -> int:
    method = sys.argv[1] if len(sys.argv) > 1 else "spawn"
    ctx = mp.get_context(method)
    task = core.load_task()
    store = core.Store(task["state_dir"])
    gated: set[str] | None = None
    try:
        wire = core.Wire(os.environ["VAULTSIM_SOCKET"], task)
        try:
            gated = core.gated_ops_from(wire.rpc("catalog", {}))
        finally:
            wire.close()
    except (OSError, core.RpcError, core.TooLate):
        gated = None
    jobs = [ctx.Queue() for _ in range(WORKERS)]
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(i, jobs[i], results), name=f"rt43c-worker-{i}")
             for i in range(WORKERS)]
    for p in procs:
        p.start()
    plan = core.Plan(task, store, gated)
    busy = [0] * WORKERS
    while True:
        for step, params, rec in plan.ready():
            i = 0 if plan.is_gated(step) else min(range(WORKERS), key=lambda k: busy[k])
            busy[i] += 1
            jobs[i].put((step, params, rec))
        if not any(busy):
            break
        try:
            i, sid, out = results.get(timeout=max(1.0, core.left(task) + core.MARGIN + 5))
        except queue.Empty:
            core.log("a worker never answered")
            break
        busy[i] -= 1
        plan.finish(sid, out)
    for q in jobs:
        q.put(None)
    for p in procs:
        p.join(timeout=max(0.5, core.left(task) + core.MARGIN - 0.3))
        if p.is_alive():
            p.terminate()
            p.join()
    print(plan.message(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
