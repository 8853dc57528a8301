#!/usr/bin/env python3
"""Red team 43c: an agent that thinks slowly between steps (docs/agent-contract.md alone).

Steps one at a time; before each step after the first it "thinks" (sleeps) for a share of the time
left, so its last step goes out close to, but inside, the deadline: it keeps RESERVE seconds for
the last step's answer, a lookup or a hand-over, and thinks at most MAX_THINK seconds a step.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt43c_core as core  # noqa: E402

RESERVE = 2.5
MAX_THINK = float(os.environ.get("RT43C_MAX_THINK", "4"))


def main() -> int:
    task = core.load_task()
    store = core.Store(task["state_dir"])
    try:
        wire, session = core.open_session(task, "rt43c-slow")
    except (OSError, core.RpcError, core.TooLate) as e:
        print(f"not done: cannot reach the vault ({e})", flush=True)
        return 0
    started = [0]

    def before(step: dict[str, Any], plan: core.Plan) -> None:
        started[0] += 1
        if started[0] == 1:
            return
        todo = sum(1 for s in plan.steps if s["id"] not in plan.outcomes)
        think = min(MAX_THINK, max(0.0, (core.left(task) - RESERVE) / max(1, todo)))
        core.log(f"thinking {think:.2f}s before {step['id']} ({core.left(task):.2f}s left)")
        time.sleep(think)

    msg = core.one_at_a_time(task, session, store, None, before)
    print(msg, flush=True)
    session.close()
    wire.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
