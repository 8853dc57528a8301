"""What an unjailed agent left running, as its pids cgroup tells it: the net under the keeper's count.

Why: without a jail the agent's keeper (vault.jail.keeper) counts and ends what the agent left, and
signs its report with a seal the agent never sees. But a root agent can read what a process's
/proc shows (the environment block the keeper was exec'd with, where the runner execs it without
its fork server: `--no-fork-server`), forge a sealed "left nothing" line, kill its keeper, and leave
a process in a session of its own with an empty environment, which `end_escaped` (a search by
task file) does not find. Every process the agent starts is born in the pids cgroup its keeper
joined (vault.jail.pids), whatever session or environment it takes: what is still there once the
keeper is done was left running. (Leaving the cgroup itself takes writing to cgroup files, which
only the jail prevents.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from vault.jail.keeper import threads_run
from vault.runner.thaw import thaw

GRACE_S = 2.0  # as the keeper's ESCAPE_GRACE_S: one ending by itself meanwhile was not left running


# sub-cgroups looked at below an agent's cgroup (a root agent can make them: mkdir)
MADE_MOST = 1000


def _members(cgroup: str) -> set[int]:
    """The processes in `cgroup` and in every cgroup below it: a root agent without a jail can make
    cgroups inside its own (mkdir) and move processes there, out of its cgroup.procs."""
    out: set[int] = set()
    for d in [cgroup, *(str(Path(cgroup, sub)) for sub in made(cgroup))]:
        with contextlib.suppress(OSError):
            for line in Path(d, "cgroup.procs").read_text().split():
                with contextlib.suppress(ValueError):
                    out.add(int(line))
    return out


def made(cgroup: str) -> list[str]:
    """The cgroups below `cgroup` (paths relative to it, parents first): none unless the agent made
    them. cgroupfs is listed by every user of the machine, so their names show (and the runner's
    rmdir of a cgroup with one inside fails: it would stay after the run)."""
    out: list[str] = []
    for base, subdirs, _ in os.walk(cgroup):
        for d in sorted(subdirs):
            if len(out) >= MADE_MOST:
                return out
            out.append(os.path.relpath(os.path.join(base, d), cgroup))
    return out


def remove_made(cgroup: str) -> None:
    """Remove the cgroups below `cgroup`, deepest first (each empty once its processes ended), so
    that the agent's own cgroup can be removed."""
    for sub in reversed(made(cgroup)):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(cgroup, sub))


def _running(pid: int) -> bool:
    try:  # a zombie (waiting for its parent, init included) runs nothing
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            return True
    except (OSError, IndexError):
        return False
    # unless only its main thread ended (pthread_exit): its other threads run on
    return threads_run(pid)


def end_left(cgroup: str, grace_s: float = GRACE_S) -> int:
    """End every process still running in the agent's pids cgroup once its keeper is done (the
    agent's own group was killed before this); return how many there were after `grace_s`."""
    end = time.monotonic() + grace_s
    while (left := {p for p in _members(cgroup) if _running(p)}) and time.monotonic() < end:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        thaw(pid)  # one the agent froze (a cgroup freezer) dies of it only once thawed
    # a fork between the read and the kill: its members until the cgroup runs nothing
    stop = time.monotonic() + 1.0
    while (more := {p for p in _members(cgroup) if _running(p)}) and time.monotonic() < stop:
        for pid in more:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return len(left)
