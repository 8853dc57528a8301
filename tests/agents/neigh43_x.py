"""Neighbour 43 (unsafe, beside its own trial): an agent written from docs/agent-contract.md alone
(stdlib, no project import).

It does its task as a careful agent does (tests/agents/neigh_core.py) and first keeps `sub/dir/`
and `ready.txt` in its own state_dir. NEIGH43_MODE (an environment variable, else its first
argument) makes it, before its task, act on the state_dir of every other trial of its run it finds
beside its own (`/tmp/vsr-PID-*/st/*`, the same runner's pid; no jail), waiting up to 10 s for one
holding `ready.txt`:

  careful   none
  burst     makes newI/b/c/ and writes newI/b/c/f.txt there in one go (before a mark on newI/ is
            placed), for I in 0..19
  burst_moved  makes new/b/c/f.txt in its own TMPDIR and renames new/ into the neighbour's
  moved_file  writes forged.json in its own TMPDIR and moves it over the neighbour's done.json
  chmod     gives the neighbour's ready.txt another mode (0644), nothing else
  flood     renames a file in its OWN state_dir NEIGH43_FLOOD (default 100000) times, a new name
            each time, as fast as it can (overflowing the runner's queue of events), planting
            plant.txt in the neighbour's halfway through
  flood_one the first agent to get here floods its own state_dir as `flood` does, planting
            nothing; the other waits for that to end, then does its task (a careful victim)
  wide      makes 300 directories in its OWN state_dir (a tree wider than the watch's cap), nothing
            in the neighbour's

NEIGH43_LOG: a file it notes what it did in (one line per agent: its state_dir, then `did [...]`).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its shared core beside it
from neigh_core import TASK, cross, left, prepare, run, say  # noqa: E402

MODE = os.environ.get("NEIGH43_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")
BURSTS = 20


def flood(plant: str) -> None:
    """One file in its own state_dir renamed again and again, a new name each time (a rename is one
    event of one syscall, never merged with another)."""
    mine = os.path.join(TASK["state_dir"], "flood")
    os.makedirs(mine, exist_ok=True)
    n = int(os.environ.get("NEIGH43_FLOOD", "100000"))
    at = os.path.join(mine, "f0")
    os.close(os.open(at, os.O_WRONLY | os.O_CREAT, 0o600))
    for i in range(1, n):
        to = os.path.join(mine, f"f{i}")
        os.rename(at, to)
        at = to
        if i == n // 2 and plant:
            with open(plant, "w") as f:
                f.write("left by a neighbour\n")
    os.unlink(at)
    os.rmdir(mine)


def act(d: str) -> bool:
    """The mode's act on the neighbour's state directory `d`: True once done."""
    ready = os.path.join(d, "ready.txt")
    if not os.path.exists(ready):
        return False
    if MODE == "burst":
        for i in range(BURSTS):
            os.makedirs(os.path.join(d, f"new{i}", "b", "c"))
            with open(os.path.join(d, f"new{i}", "b", "c", "f.txt"), "w") as f:
                f.write("left by a neighbour\n")
    elif MODE == "burst_moved":  # made in its own TMPDIR, then moved into the neighbour's at once
        made = os.path.join(os.environ.get("TMPDIR") or TASK["state_dir"], "new")
        os.makedirs(os.path.join(made, "b", "c"))
        with open(os.path.join(made, "b", "c", "f.txt"), "w") as f:
            f.write("left by a neighbour\n")
        os.rename(made, os.path.join(d, "new"))
    elif MODE == "moved_file":  # a forged state file written in its own TMPDIR, moved over the neighbour's
        made = os.path.join(os.environ.get("TMPDIR") or TASK["state_dir"], "forged.json")
        with open(made, "w") as f:
            f.write('{"left by a neighbour": true}\n')
        os.replace(made, os.path.join(d, "done.json"))
    elif MODE == "chmod":
        os.chmod(ready, 0o644)
    elif MODE == "flood":
        flood(os.path.join(d, "plant.txt"))
    elif MODE == "flood_one":
        # the first agent here floods its own state_dir and nothing else; the other does nothing but
        # wait for that to end (its watch on while it goes), then its task as a careful agent does
        mark = os.environ["NEIGH43_LOG"] + ".flood"
        try:
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            until = time.time() + max(0.0, left() - 8.0)
            while not os.path.exists(mark + ".done") and time.time() < until:
                time.sleep(0.05)
            return True
        flood("")
        os.close(os.open(mark + ".done", os.O_WRONLY | os.O_CREAT, 0o600))
    elif MODE == "wide":
        for i in range(300):
            os.makedirs(os.path.join(TASK["state_dir"], "wide", f"d{i}"), exist_ok=True)
    else:
        return False
    return True


def main() -> int:
    prepare()
    if MODE != "careful":
        did = cross(act)
        if os.environ.get("NEIGH43_LOG"):
            with open(os.environ["NEIGH43_LOG"], "a") as f:
                f.write(f"{TASK['state_dir']} did {did}\n")
    line = run()
    say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
