"""Red team 44c: an agent slow on purpose, written from docs/agent-contract.md alone (stdlib).

It starts late (a model loading: RT44C_SLOW_START seconds, default 1.0, never more than a fifth
of its time), thinks between steps (up to 1.5 s, shrunk so every remaining step keeps 2.5 s of
the deadline), asks with `wait_s: 0` and then long-polls: one `call.resume` holding as long as the
deadline allows (4: blocking and non-blocking agents are graded alike), again until it settles or
the deadline is near, and hands the wait over with its token kept. It keeps a wider margin (1.5 s)
for its slow exit: it flushes and syncs its journal and sleeps 0.3 s more after its last request.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402


class LongPoll(lib.Runner):
    def wait_s(self) -> float:
        return 0.0                           # every call asks at once; the resume holds the wait

    def collect(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | str:
        self.blocking = True                 # the resumes are long polls
        try:
            return super().collect(step, rec, res)
        finally:
            self.blocking = False

    def request(self, method: str, **params: Any) -> dict[str, Any]:
        if method == "call.resume" and self.blocking:
            params["wait_s"] = round(max(0.0, self.left() - 0.3), 2)
        return super().request(method, **params)


def main() -> int:
    task = lib.load_task()
    start = time.time()
    total = float(task["deadline"]) - start
    time.sleep(min(float(os.environ.get("RT44C_SLOW_START", "1.0")), total / 5))
    try:
        runner = LongPoll(task, client="rt44c-slow", blocking=False, margin=1.5)
        steps = task.get("steps") or []

        def think(step: dict[str, Any]) -> None:
            remaining = sum(1 for s in steps if runner.outcome.get(s["id"]) != "done")
            spare = runner.left() - 2.5 * remaining
            pause = max(0.0, min(1.5, spare / (remaining + 1)))
            runner.log(f"thinking {pause:.2f}s before {step['id']}")
            time.sleep(pause)

        final = runner.run_all(think)
        runner.close()
    except lib.Finish as f:
        final = str(f)
    time.sleep(0.3)
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
