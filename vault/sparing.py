"""A failure that repeats many times a second (accepts refused while descriptors are out) said
once, then at most once a period with how many times it happened since: logged each time, a
flood wrote thousands of lines a second into the host's log."""

from __future__ import annotations

import time
from collections.abc import Callable


class Sparing:
    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.said_at: float | None = None
        self.since = 0

    def due(self) -> int | None:
        """Count one more; how many since it was last said when it is time to say it, else None."""
        self.since += 1
        now = self.clock()
        if self.said_at is not None and now - self.said_at < self.every_s:
            return None
        count, self.said_at, self.since = self.since, now, 0
        return count
