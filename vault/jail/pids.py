"""A cap on how many processes (and threads) one jailed agent may run: a pids cgroup.

The jail drops every capability, but run as root its processes still count as
root, for whom the kernel does not enforce RLIMIT_NPROC: a fork bomb in the
jail would fill the machine's process table before its deadline and take the
runner, the daemon and every other trial with it. A pids cgroup limits the
whole tree whatever its uid. The runner makes one per jailed agent where a
pids controller is writable (cgroup v1 `pids`, or v2 with `pids` enabled
for our cgroup's children); the agent's keeper moves itself into it before it
builds the jail, so everything below it counts. Where none is writable, there
is no cap, and the trial's isolation says so.

Only the standard library: the keeper imports this on its cheap path.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

MAX_PIDS = 1024  # processes and threads of one agent's tree: far past any agent's need


def _bases() -> list[Path]:
    """Where a child cgroup of ours could be made: the v1 pids hierarchy, or our own v2 cgroup."""
    out: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            out.append(Path("/sys/fs/cgroup/pids") / path.lstrip("/"))
        elif controllers == "" and _enabled_v2(Path("/sys/fs/cgroup") / path.lstrip("/")):
            out.append(Path("/sys/fs/cgroup") / path.lstrip("/"))
    return out


def create(name: str, limit: int = MAX_PIDS) -> str | None:
    """A new pids cgroup limited to `limit` tasks, named for this process and `name`; None where
    none can be made. Those of processes gone are removed first (`vaultsim exec` cannot remove
    its own: it has joined the jail's mount namespace; a runner killed with SIGKILL could not)."""
    for base in _bases():
        _sweep(base)
        path = base / f"vaultsim-{os.getpid()}-{name}"
        try:
            path.mkdir()
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            (path / "pids.max").write_text(str(limit))
            return str(path)
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
    return None


def _sweep(base: Path) -> None:
    for path in base.glob("vaultsim-*"):
        try:
            os.kill(int(path.name.split("-")[1]), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.rmdir()  # empty once its tree is gone; else kept until then
        except (ValueError, IndexError, OSError):
            continue


def _enabled_v2(base: Path) -> bool:
    try:
        return "pids" in (base / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def enter(path: str) -> None:
    """Move this process into `path` (its children from now on start there)."""
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def refused(path: str) -> int:
    """How many forks the cap refused (pids.events `max`)."""
    try:
        for line in Path(path, "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def remove(path: str, timeout: float = 10.0) -> None:
    """Remove the cgroup once its last task is gone (a killed tree takes a moment to exit)."""
    end = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > end:
                return
            time.sleep(0.02)
