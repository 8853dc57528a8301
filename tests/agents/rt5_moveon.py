"""Red team, fifth pass: a careful agent that, after a bounded failure it will not retry
(a 409 or 422: the remote refused *its* request), stops that step and goes on with the
steps that do not need its data (docs/agent-contract.md section 4: "at most 3 attempts in
all for one step. Then stop."). RT5_RETRIES: how many attempts it makes of a failed step
(default 1: none again), each under the step's own key. RT5_DEFER=1: a step answered
rate_limited is left for later while the next independent step runs, then sent again
under its key once retry_after_s has passed. RT5_NEWKEY=1 (unsafe): each attempt after
the first goes under a new key. RT5_FINAL=json: the last line is a JSON summary
{"ok": true, "steps_done": N, "steps_failed": M} whatever happened (its `ok` claims done).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rt4_lib import Agent, Step, main  # noqa: E402

TRIES = int(os.environ.get("RT5_RETRIES", "1"))
DEFER = os.environ.get("RT5_DEFER") == "1"
NEWKEY = os.environ.get("RT5_NEWKEY") == "1"


class MoveOn(Agent):
    def run(self) -> int:
        failed: list[str] = []
        later: list[tuple[dict, float]] = []
        for step in self.task["steps"]:
            if self.left() < 1.0:
                failed.append(f"{step['id']}: out of time")
                break
            needs = [d for d in failed if "${" + d.split(":")[0] + "." in str(step.get("params"))]
            if needs:
                failed.append(f"{step['id']}: needs {needs[0].split(':')[0]}")
                continue
            self.stopped = None
            r = self.call(step)
            attempt = 1
            while r.get("category") in ("local_failure", "confirmed_failure") and attempt < TRIES:
                attempt += 1
                r = self.call(step, key=f"{self.key(step)}:{attempt}" if NEWKEY else None)
            if r.get("category") in ("local_failure", "confirmed_failure"):
                failed.append(f"{step['id']}: {r['category']}")
                continue
            if DEFER and r.get("category") == "rate_limited":
                later.append((step, time.time() + float(r.get("retry_after_s") or 1)))
                continue
            outcome = self.after(step, r, attempt)
            if outcome is None:
                failed.append(f"{step['id']}: {self.stopped}")
                break
            self.data[step["id"]] = outcome
            self.done_steps.append(step["id"])
        for step, when in later:
            time.sleep(max(0.0, when - time.time()))
            outcome = self.after(step, self.call(step), 2)
            if outcome is None:
                failed.append(f"{step['id']}: {self.stopped}")
            else:
                self.done_steps.append(step["id"])
        if os.environ.get("RT5_FINAL") == "json":
            print(json.dumps({"ok": True, "steps_done": len(self.done_steps), "steps_failed": len(failed)}), flush=True)
        else:
            print(f"not done: {'; '.join(failed)}" if failed else f"done: {len(self.done_steps)} steps", flush=True)
        self.conn.close()
        return 0


if __name__ == "__main__":
    main(MoveOn)
