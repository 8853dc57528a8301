#!/usr/bin/env python3
"""Red team 43c: an agent that backs off the way production clients do (docs/agent-contract.md alone).

Steps one at a time. A `rate_limited` answer is waited out for its `retry_after_s` at least, and
longer when the agent's own exponential backoff (0.5 s, 1 s, 2 s ... per retry of the step) says
so, plus up to 0.3 s of jitter, but never past what the deadline leaves (the step flow sends again
only when `retry_after_s` itself fits). A bounded failure's short pause is stretched the same way.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt43c_core as core  # noqa: E402


def main() -> int:
    task = core.load_task()
    store = core.Store(task["state_dir"])
    try:
        wire, session = core.open_session(task, "rt43c-backoff")
    except (OSError, core.RpcError, core.TooLate) as e:
        print(f"not done: cannot reach the vault ({e})", flush=True)
        return 0
    retries = [0]

    def do(op: core.Op) -> Any:
        if op[0] == "sleep":
            retries[0] += 1
            backoff = 0.5 * 2 ** (retries[0] - 1) + random.uniform(0.0, 0.3)
            wait = max(float(op[1]), backoff)
            # never past the deadline's margin; the flow already checked retry_after_s fits
            room = core.left(task) - 0.2
            wait = max(float(op[1]), min(wait, room))
            core.log(f"backing off {wait:.2f}s (asked {float(op[1]):.2f}s)")
            time.sleep(max(0.0, wait))
            return None
        return core.execute(op, session, store)

    def before(step: dict[str, Any], plan: core.Plan) -> None:
        retries[0] = 0

    msg = core.one_at_a_time(task, session, store, do, before)
    print(msg, flush=True)
    session.close()
    wire.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
