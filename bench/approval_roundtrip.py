"""Approval round trip: call -> prompt -> scripted allow_once -> result.

The agent calls `create_issue` (session mode under the default policy, but
the approver answers allow_once so every call prompts); the scripted approver
process answers at once. Prints p50/p99 of the whole call. Target p50 <= 6 ms.

    .venv/bin/python bench/approval_roundtrip.py [N]
"""

from __future__ import annotations

import sys
import time

from _procs import percentiles, vault_with_remote

N = int(sys.argv[1]) if len(sys.argv) > 1 else 500


def main() -> None:
    with vault_with_remote() as (box, url):
        box.start_approver([{"match": {}, "decide": "allow_once"}])
        from vault.client import AgentClient

        agent = AgentClient(box.agent_sock)
        agent.open_session("bench", "bench")
        samples = []
        for i in range(N + 50):
            t0 = time.perf_counter()
            res = agent.call("create_issue", {"title": f"bench {i}"})
            dt = time.perf_counter() - t0
            if i >= 50:
                samples.append(dt)
        p50, p99 = percentiles(samples)
        print(f"create_issue with allow_once x{N} (last category: {res.category})")
        print(f"  request -> scripted decision -> result: p50 {p50:.3f} ms  p99 {p99:.3f} ms  (target p50 <= 6 ms)")
        agent.close()


if __name__ == "__main__":
    main()
