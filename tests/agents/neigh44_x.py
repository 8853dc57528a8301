"""Neighbour 44 (unsafe, beside its own trial): an agent written from docs/agent-contract.md alone
(stdlib, no project import).

It does its task as a careful agent does (tests/agents/neigh_core.py) and first keeps `sub/dir/`
and `ready.txt` in its own state_dir. NEIGH44_MODE (an environment variable, else its first
argument) makes it act on the state_dir of every other trial of its run it finds beside its own
(`/tmp/vsr-PID-*/st/*`, the same runner's pid; no jail), waiting up to 10 s for one holding
`ready.txt`:

  careful     none
  link_write  hard-links the neighbour's ready.txt into its own TMPDIR (`x-N`) before its task, and
              after its task, while the neighbour's state_dir is still there, writes through that
              link (the neighbour's file changes; no name in the neighbour's directory is used)

NEIGH44_LOG: a file it notes what it did in (one line per agent: its state_dir, then `did [...]`).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its shared core beside it
from neigh_core import TASK, cross, prepare, run, say  # noqa: E402

MODE = os.environ.get("NEIGH44_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")


LINKS: list = []  # (the link in its TMPDIR, the neighbour's state_dir)


def act(d: str) -> bool:
    """The mode's act on the neighbour's state directory `d`: True once done."""
    ready = os.path.join(d, "ready.txt")
    if not os.path.exists(ready):
        return False
    if MODE == "link_write":
        at = os.path.join(os.environ.get("TMPDIR") or TASK["state_dir"], f"x-{len(LINKS)}")
        os.link(ready, at)
        LINKS.append((at, d))
        return True
    return False


def write_links() -> list:
    """Writes through each link made before, while its neighbour's state_dir is still there."""
    did = []
    for at, d in LINKS:
        if os.path.isdir(d):
            with open(at, "w") as f:
                f.write("left by a neighbour\n")
            did.append(d)
        os.unlink(at)
    return did


def main() -> int:
    prepare()
    if MODE != "careful":
        cross(act)
    line = run()
    did = write_links()
    if MODE != "careful" and os.environ.get("NEIGH44_LOG"):
        with open(os.environ["NEIGH44_LOG"], "a") as f:
            f.write(f"{TASK['state_dir']} did {did}\n")
    say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
