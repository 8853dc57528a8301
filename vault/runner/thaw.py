"""Let go of one of the runner's own processes that a cgroup freezer holds.

Why: without a jail, a root agent moved a process of the runner's (its keeper, the runner's fanotify
reader) into a cgroup v1 freezer group of its own and froze it. A frozen process runs nothing and
does not die of SIGKILL until it is thawed, so the runner waited on it for ever: the run never
ended and nothing was graded. The runner never freezes anything: a process of its own found in a
freezer group not the runner's is moved back into the runner's (a task moved out of a frozen v1
group is thawed), and a frozen cgroup v2 group it sits in is thawed in place (its other
controllers, such as the agent's pids cgroup, stay as they are).
"""

from __future__ import annotations

import contextlib
import os


def _groups(who: str) -> dict[str, str]:
    """controller list ("" for cgroup v2) -> the group's path, from /proc/WHO/cgroup."""
    with contextlib.suppress(OSError), open(f"/proc/{who}/cgroup") as f:
        return {cells[1]: cells[2] for cells in (line.rstrip("\n").split(":", 2) for line in f) if len(cells) == 3}
    return {}


def _roots() -> dict[str, str]:
    """"freezer" and "" (cgroup v2) -> where that hierarchy is mounted."""
    roots: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fstype, _, options = (tail.split() + ["", "", ""])[:3]
            if fstype == "cgroup2":
                roots.setdefault("", head.split()[4])
            elif fstype == "cgroup" and "freezer" in options.split(","):
                roots.setdefault("freezer", head.split()[4])
    return roots


def thaw(pid: int) -> str:
    """Thaw `pid` if a freezer holds it, or could (module doc); how, or "" if nothing was done."""
    mine, theirs = _groups("self"), _groups(str(pid))
    done = []
    for controller, root in _roots().items():
        where = theirs.get(controller)
        if where is None:
            continue
        if controller == "freezer" and where != mine.get(controller, where):
            with contextlib.suppress(OSError), open(os.path.join(root, mine[controller].lstrip("/"), "cgroup.procs"),
                                                    "w") as f:
                f.write(str(pid))
                done.append(f"moved out of freezer group {where}")
        elif controller == "":
            freeze = os.path.join(root, where.lstrip("/"), "cgroup.freeze")
            with contextlib.suppress(OSError):
                with open(freeze) as f:
                    frozen = f.read().strip() == "1"
                if frozen:
                    with open(freeze, "w") as f:
                        f.write("0")
                    done.append(f"its cgroup {where} thawed")
    return "; ".join(done)


def thaw_group(pgid: int) -> str:
    """`thaw` each process of process group `pgid`; what was done, for the first one it was done to."""
    told = ""
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError):
                if os.getpgid(int(name)) == pgid and (how := thaw(int(name))) and not told:
                    told = f"process {name}: {how}"
    return told
