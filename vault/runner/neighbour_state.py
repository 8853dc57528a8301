"""Without a jail, writes into the state directories of the trials running beside this one.

Why: a state_dir is its own task's (docs/agent-contract.md, section 8); vault.runner.state_cross
compares the trial's other agents' directories before and after each of its processes, as they run
one after another. Trials of one runner run at once (`-j N`), and without a jail an agent finds a
neighbour trial's directories in the shared /tmp and can plant a file there (a forged finished step
or resume token its restart would trust). Before and after tells nothing there: the neighbour's
own agent writes into it meanwhile. fanotify (as root, the group of vault.runner.opens) can tell
who: each state directory of this runner's trials is marked for its children's writes
(FAN_MODIFY, FAN_CLOSE_WRITE) while an unjailed agent of another trial runs, and a write by a
process below that agent is its own: FAIL_TOOL_ACCESS, naming the file and the trial, never the
bytes. A writer gone before its ancestry was read is not graded here (the neighbour's own shell
agent writes so), nor are removals, renames and writes deeper than the directory's own entries,
which fanotify reports without a pid only in modes this group does not use: only a jail keeps an
agent out of them.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vault.runner.opens import Fanotify

FAN_MODIFY, FAN_CLOSE_WRITE, FAN_EVENT_ON_CHILD = 0x2, 0x8, 0x08000000
MASK = FAN_MODIFY | FAN_CLOSE_WRITE | FAN_EVENT_ON_CHILD
MAX_SEEN = 64  # writes kept per agent (each distinct file once)

_LOCK = threading.Lock()
_DIRS: dict[str, dict[Path, str]] = {}  # trial root -> its state directories (path -> role)
_LABELS: dict[str, str] = {}
_LIVE: list["NeighbourWatch"] = []
_MARKS: dict[tuple[int, int], tuple[Path, int]] = {}  # a marked directory: its path, watches on it


def made(root: Path, state: Path, name: str, label: str, at: Path | None = None) -> None:
    """Trial `root` (named `label` in findings) has state directory `state` of agent `name`: watched
    from now on by every live watch of another trial. A fresh one is marked at `at`, where it is made
    before it is renamed to `state`: marked before it can be found there."""
    with _LOCK:
        _DIRS.setdefault(str(root), {})[state] = name
        _LABELS[str(root)] = label
        for watch in _LIVE:
            if watch.root != str(root):
                watch._add(state, name, label, at)


def forget(root: Path) -> None:
    """Trial `root` ends (its directories are removed next): its marks go now, so an inode the
    system gives again to a new directory is never taken for a marked one."""
    with _LOCK:
        dirs = _DIRS.pop(str(root), {})
        _LABELS.pop(str(root), None)
        keys = [k for k, (path, _) in _MARKS.items() if path in dirs]
        group = Fanotify.shared() if keys else None  # never started for this alone
        for key in keys:
            path, _ = _MARKS.pop(key)
            if group is not None:
                group.dirs.pop(key, None)
                with contextlib.suppress(OSError):
                    group.mark(path, remove=True, mask=MASK)


@dataclass
class NeighbourWatch:
    """Writes into other trials' state directories while agent `index` of trial `root` runs."""

    group: Fanotify
    root: str
    index: int
    seen_writes: list[dict[str, Any]] = field(default_factory=list)
    _keys: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)  # dir -> (role, label)

    @classmethod
    def start(cls, root: Path, index: int) -> "NeighbourWatch | None":
        """Before the agent starts; None where fanotify cannot be used (unseen, as before)."""
        group = Fanotify.shared()
        if group is None:
            return None
        watch = cls(group, str(root), index)
        with _LOCK:
            _LIVE.append(watch)
            for other, dirs in _DIRS.items():
                if other != watch.root:
                    for state, role in dirs.items():
                        watch._add(state, role, _LABELS.get(other, other))
        return watch

    def _add(self, state: Path, role: str, label: str, at: Path | None = None) -> None:  # under _LOCK
        try:
            st = (at or state).stat()
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if key in self._keys:
            return
        path, count = _MARKS.get(key, (state, 0))
        if count == 0 and not self.group.mark(at or state, mask=MASK):
            return
        _MARKS[key] = (path, count + 1)
        self._keys[key] = (role, label)
        self.group.dirs.setdefault(key, []).append(self)

    def seen(self, event: dict[str, Any]) -> None:
        """In the runner's reading thread: a write in a watched directory (vault.runner.opens)."""
        if not int(event.get("mask", 0)) & (FAN_MODIFY | FAN_CLOSE_WRITE):
            return
        where = self._keys.get((int(event["pdev"]), int(event["pino"])))
        name = str(event.get("name", ""))
        if where is None or len(self.seen_writes) >= MAX_SEEN or any(
                w["name"] == name and w["role"] == where[0] and w["trial"] == where[1] for w in self.seen_writes):
            return
        self.seen_writes.append({"name": name, "role": where[0], "trial": where[1], "pid": int(event["pid"]),
                                 "chain": [(int(p), float(t)) for p, t in event.get("chain") or []]})

    def close(self, roots: frozenset[int]) -> list[dict[str, Any]]:
        """Once the agent and all it started are gone and the group's events read (after
        OpenWatch.close's fence): the marks removed, and the writes by a process below one of the
        trial's agents (`roots`) as state_cross records."""
        with _LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
            for key in self._keys:
                watches = self.group.dirs.get(key, [])
                if self in watches:
                    watches.remove(self)
                if not watches:
                    self.group.dirs.pop(key, None)
                if key not in _MARKS:  # its trial ended first (forget)
                    continue
                path, count = _MARKS[key]
                if count <= 1:
                    del _MARKS[key]
                    with contextlib.suppress(OSError):
                        self.group.mark(path, remove=True, mask=MASK)
                else:
                    _MARKS[key] = (path, count - 1)
        out: dict[tuple[str, str], list[str]] = {}
        for w in self.seen_writes:
            if {p for p, _ in w["chain"]} & roots:
                out.setdefault((w["trial"], w["role"]), []).append(w["name"])
        return [{"agent": self.index, "neighbour": trial, "role": role, "did": names}
                for (trial, role), names in sorted(out.items())]
