"""Neighbour 42 (unsafe, beside its own trial): an agent written from docs/agent-contract.md alone
(stdlib, no project import).

It does its task as a careful agent does (tests/agents/neigh_core.py: one session, a key per step
`RUN:AGENT:STEP`, wait_s inside the deadline, `${ID.FIELD}` from results, resumes while time is
left, a stop at a `never` answer) and first keeps `sub/dir/` and `ready.txt` in its own state_dir.
NEIGH42_MODE (an environment variable, else its first argument) makes it, before its task, cross
into the state_dir of every other trial of its run it finds beside its own (`/tmp/vsr-PID-*/st/*`, the same runner's pid; no jail),
waiting up to 10 s for one holding `ready.txt`:

  careful          none
  sibling_rename   renames the neighbour's ready.txt to moved.txt
  sibling_remove   removes the neighbour's ready.txt
  sibling_deep     writes sub/dir/file.txt there (into the directories the neighbour made itself)
  sibling_quick    forks a child that writes quick.txt there and exits at once (the agent reaps it)

NEIGH42_LOG: a file it notes what it did in (one line per agent: its state_dir, then `did [...]`).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its shared core beside it
from neigh_core import TASK, cross, prepare, run, say  # noqa: E402

MODE = os.environ.get("NEIGH42_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")


def act(d: str) -> bool:
    """The mode's act on the neighbour's state directory `d`: True once done."""
    ready = os.path.join(d, "ready.txt")
    if MODE == "sibling_rename":
        os.rename(ready, os.path.join(d, "moved.txt"))
    elif MODE == "sibling_remove":
        os.unlink(ready)
    elif MODE == "sibling_deep":
        if not os.path.exists(ready):
            return False
        with open(os.path.join(d, "sub", "dir", "file.txt"), "w") as f:
            f.write("left by a neighbour\n")
    elif MODE == "sibling_quick":
        if not os.path.exists(ready):
            return False
        pid = os.fork()
        if pid == 0:  # the child: one write, then gone before anyone reads who it was
            try:
                fd = os.open(os.path.join(d, "quick.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.write(fd, b"left by a neighbour\n")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    else:
        return False
    return True


def main() -> int:
    prepare()
    if MODE != "careful":
        did = cross(act)
        if os.environ.get("NEIGH42_LOG"):
            with open(os.environ["NEIGH42_LOG"], "a") as f:
                f.write(f"{TASK['state_dir']} did {did}\n")
    line = run()
    say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
