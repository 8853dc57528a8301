"""How much an agent held in its scratch and state directories while the disk was filling.

A disk filled and then freed leaves no file behind for the count taken when the agent is gone
(`AgentRun.scratch_bytes`), and the vault resumes once there is room: the fill must be seen while
it lasts. Checking the free room is one statvfs, so it is done often; the directories are walked
only when the room fell fast since the last look (a fill under way) or is nearly gone, which an
ordinary trial's agent does not make happen. A fill, a refused call and a free quicker than one
look (POLL_S) can still pass unseen: the trial is then ERROR (the log failed), never a PASS.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from vault.runner.collect import footprint

POLL_S = 0.01
WALK_EVERY_S = 0.25  # while the room stays nearly gone (not falling), walked at most this often
NEARLY_FULL = 32 << 20  # free bytes under which the directories are walked
FALLING = 4 << 20  # room lost since the last look that has the directories walked at once


async def watch_scratch(disk: Path, dirs: list[Path], peak: list[int]) -> None:
    """Until cancelled: `peak[0]` is the most `dirs` held while `disk` (the trial's directory,
    theirs and the vault's) was filling or nearly full."""
    walked, last = 0.0, None
    while True:
        try:
            st = os.statvfs(disk)
            free: int | None = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        falling = free is not None and last is not None and last - free >= FALLING
        low = free is not None and free < NEARLY_FULL and time.monotonic() - walked >= WALK_EVERY_S
        if falling or low:
            walked = time.monotonic()
            peak[0] = max(peak[0], await asyncio.to_thread(footprint, dirs))
        last = free
        await asyncio.sleep(POLL_S)
