"""Red team 45c: an agent whose waits come from a retry/backoff habit (stdlib), written from
docs/agent-contract.md.

A `Backoff` policy (exponential, full jitter on top of a floor, capped) drives every wait before
something is asked again, as tenacity or backoff decorators do in outside code, with the
contract's rules as the floor: a `rate_limited` answer's `retry_after_s` is waited out in full
(jitter only adds), a bounded failure is resent under the same key at most 3 attempts in all, an
unknown outcome is never resent before a lookup says `not_found`, and nothing is waited past the
deadline. Connecting retries only EAGAIN (the vault's accept queue full, section 3) the same way.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt45c_lib as lib  # noqa: E402


class Backoff:
    def __init__(self, base: float = 0.1, factor: float = 2.0, cap: float = 2.0, jitter: float = 0.15) -> None:
        self.base, self.factor, self.cap, self.jitter = base, factor, cap, jitter
        self.tries: dict[str, int] = {}

    def delay(self, kind: str, floor: float) -> float:
        n = self.tries.get(kind, 0)
        self.tries[kind] = n + 1
        grown = min(self.cap, self.base * self.factor ** n)
        return max(floor, grown) + random.uniform(0, self.jitter)


class BackoffRunner(lib.Runner):
    def __init__(self, task: dict[str, Any], **kw: Any) -> None:
        super().__init__(task, **kw)
        self.policy = Backoff()

    def pause(self, kind: str, seconds: float) -> None:
        if kind == "lookup":
            # the contract's own pace for an unknown lookup (0.1, 0.2, 0.4 s): jitter only adds
            wait = seconds + random.uniform(0, 0.05)
        else:
            wait = self.policy.delay(kind, seconds)
        if kind == "rate_limited" and wait > self.left():
            wait = seconds                      # the jitter must not cost the retry its time
        self.log(f"backoff {kind}: {wait:.2f}s")
        self.sleep(wait)


def main() -> int:
    random.seed(os.getpid() ^ int(time.time()))
    task = lib.load_task()
    runner = BackoffRunner(task, client="rt45c-backoff")
    try:
        message = runner.run_all()
    except lib.Finish as f:
        message = str(f)
    finally:
        runner.close()
    print(message, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
