"""Approval round trip: call -> prompt -> scripted allow_once -> result.

The agent calls `create_issue` (session mode under the default policy, but
the approver answers allow_once so every call prompts); the scripted approver
process answers at once. Prints p50/p99 of the whole call. Target p50 <= 6 ms.

The agent is its own process, a sibling of the approver: the vault refuses an
approval that comes from the requesting process or one of its ancestors, and
this script is the approver's parent.

    .venv/bin/python bench/approval_roundtrip.py [N]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

from _procs import percentiles, vault_with_remote

N = int(sys.argv[1]) if len(sys.argv) > 1 else 500
WARMUP = 50


def agent(sock: str, n: int, out: "mp.Queue[tuple[list[float], str]]") -> None:
    from vault.client import AgentClient

    client = AgentClient(sock)
    client.open_session("bench", "bench")
    samples, category = [], ""
    for i in range(n + WARMUP):
        t0 = time.perf_counter()
        res = client.call("create_issue", {"title": f"bench {i}"})
        if i >= WARMUP:
            samples.append(time.perf_counter() - t0)
        category = str(res.category)
    client.close()
    out.put((samples, category))


def main() -> None:
    with vault_with_remote() as (box, url):
        box.start_approver([{"match": {}, "decide": "allow_once"}])
        ctx = mp.get_context("spawn")
        out: "mp.Queue[tuple[list[float], str]]" = ctx.Queue()
        proc = ctx.Process(target=agent, args=(str(box.agent_sock), N, out))
        proc.start()
        samples, category = out.get(timeout=600)
        proc.join()
        assert category == "success", f"the bench calls must be approved, the last was {category}"
        p50, p99 = percentiles(samples)
        print(f"create_issue with allow_once x{N} (last category: {category})")
        print(f"  request -> scripted decision -> result: p50 {p50:.3f} ms  p99 {p99:.3f} ms  (target p50 <= 6 ms)")


if __name__ == "__main__":
    main()
