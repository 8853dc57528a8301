"""Durable gated calls per second: 8 agent processes against one daemon.

Every call passes the gate, is audited (intent on disk before the remote is
touched, the result on disk before the answer; group commit shares fdatasync
between concurrent calls) and reaches the fake remote. Prints calls/s for 1
and 8 agents. Target (issue #5): 8 agents >= 8k calls/s.

    .venv/bin/python bench/gated_calls.py [CALLS_PER_AGENT]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

from _procs import vault_with_remote

N = int(sys.argv[1]) if len(sys.argv) > 1 else 400


def agent(sock: str, n: int, start: "mp.synchronize.Barrier", done: "mp.Queue[int]") -> None:
    from vault.client import AgentClient

    client = AgentClient(sock)
    client.open_session("bench")
    start.wait()
    ok = sum(client.call("read_issue", {"issue_id": "ISS-1"}).ok for _ in range(n))
    done.put(ok)


def measure(sock: str, agents: int) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    # the clock starts once every agent has connected and opened its session
    start, done = ctx.Barrier(agents + 1), ctx.Queue()
    procs = [ctx.Process(target=agent, args=(sock, N, start, done)) for _ in range(agents)]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    ok = sum(done.get() for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return ok / elapsed, ok


def main() -> None:
    with vault_with_remote(*sys.argv[2:]) as (box, url):
        sock = str(box.agent_sock)
        for agents in (1, 8):
            rate, ok = measure(sock, agents)
            print(f"{agents} agent(s) x {N} read_issue: {rate:,.0f} durable gated calls/s ({ok} succeeded)")
        print("target: 8 agents >= 8,000 calls/s")


if __name__ == "__main__":
    main()
