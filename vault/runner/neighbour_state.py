"""Without a jail, what is done in the state directories of the trials running beside this one.

Why: a state_dir is its own task's (docs/agent-contract.md, section 8); vault.runner.state_cross
compares the trial's other agents' directories before and after each of its processes, as they run
one after another. Trials of one runner run at once (`-j N`), and without a jail an agent finds a
neighbour trial's directories in the shared /tmp and can plant, rename or remove a file there (a
forged finished step or resume token its restart would trust, or a lost one). Before and after
tells nothing there: the neighbour's own agent changes it meanwhile. fanotify (as root, the
directory-entry group of vault.runner.opens, FAN_REPORT_DFID_NAME) can tell who: every directory of
each state tree of this runner's trials is marked (entries made, removed, renamed, written) while an
unjailed agent of another trial runs, a subdirectory as soon as it is made (and what it holds by
then, walked), and a change by a process below that agent is its own: FAIL_TOOL_ACCESS, naming
what was done to which entry, never the bytes. Below that agent means its pid and start time in
the writer's ancestry (a later process given the agent's pid is not it). A writer gone before its
ancestry was read is told by the forks the reader heard of (vault.runner.forks).

A subdirectory made (or moved in) is walked as soon as its mark is placed, and what it holds by
then is taken as made by the hand that made it (`mkdir -p a/b/c && touch a/b/c/f` in one go was
done before the mark). An entry moved in from a directory nobody watches is seen by FAN_MOVED_TO
(the kernel sends no FAN_RENAME then). A change of an entry's mode, owner or times (FAN_ATTRIB) is
named too.
Evidence that could not be kept is said: the group's queue overflowed (the kernel dropped events)
or a tree past MAX_DIRS directories only partly marked. Where a share of the events just before
and after the overflow were the agent's own (it flooded the watch, evidence lost by its own hand)
the trial fails; a flood by anyone else is said in the trial's errors, never graded (a careful
trial is not failed by another's flood).

Before Linux 5.9 (no FAN_REPORT_DFID_NAME group; forced by VAULTSIM_TEST_NO_DFID=1, a test seam
of vault.runner.opens) the older watch is used: the opens group's writes (FAN_MODIFY,
FAN_CLOSE_WRITE) in every directory of the trees, by directory inode, a subdirectory made since
marked at the next write seen beside it; it does not see entries removed, renamed or made without
a write, a mode change, a write in a subdirectory made since the last write beside it, nor who
made a directory.

A write through a hard link of a neighbour's file made elsewhere (`ln st/x/done.json $TMPDIR/y`,
then a write to `y`) is reported by the kernel to the directory it was opened through, not to the
neighbour's: each regular file of a watched tree is therefore marked by inode too (the opens group's
writes, routed by the file's handle, MAX_FILES a tree), a file made or moved in later as its entry
event is read, and a write by a process below the agent through a name outside the watched
directories is named "wrote F through a link to it elsewhere". Not seen: the link's making alone (a
link count changing is no write), a write to a file made or moved in within the moment before its
mark is placed (the older watch: before the next write seen beside it), and another `vaultsim run`'s
trials (the README says why). Only a jail keeps an
agent out of all of them.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vault.lineage import same_start
from vault.runner.file_handle import handle
from vault.runner.opens import Fanotify

FAN_MODIFY, FAN_ATTRIB, FAN_CLOSE_WRITE, FAN_CREATE, FAN_DELETE = 0x2, 0x4, 0x8, 0x100, 0x200
FAN_RENAME, FAN_EVENT_ON_CHILD, FAN_ONDIR = 0x10000000, 0x08000000, 0x40000000
FAN_MOVED_TO = 0x80
# FAN_MOVED_TO too: this kernel (6.18) reports no FAN_RENAME for an entry moved in from an
# unwatched directory, only the move's arrival
MASK = FAN_MODIFY | FAN_ATTRIB | FAN_CLOSE_WRITE | FAN_CREATE | FAN_DELETE | FAN_RENAME | FAN_MOVED_TO \
    | FAN_EVENT_ON_CHILD | FAN_ONDIR
# before 5.9: the opens group, writes of a directory's children only (no FID: no entry events)
OLD_MASK = FAN_MODIFY | FAN_CLOSE_WRITE | FAN_EVENT_ON_CHILD
MAX_SEEN = 256  # changes kept per agent (each distinct change by each writer once)
MAX_DIRS = 256  # directories of one state tree marked (a wider one: the rest unwatched)
MAX_FILES = 1024  # files of one state tree marked by inode (a write through a link elsewhere)
FILE_MASK = FAN_MODIFY | FAN_CLOSE_WRITE  # in the opens group: told by the written file's handle
# of the events sampled around an overflow (up to 4,096: vault.runner.opens.FLOOD_TAIL each way), this
# many of the agent's make the flood its own: a flooder has hundreds (two flooding at once, each its
# turns' share), a careful agent's state file written then (about 5 events each) never
FLOOD_SHARE = 32

_LOCK = threading.Lock()
_DIRS: dict[str, dict[Path, str]] = {}  # trial root -> its state directories (path -> role)
_LABELS: dict[str, str] = {}
_LIVE: list["NeighbourWatch"] = []
_MARKS: dict[str, tuple[Path, int, str]] = {}  # a marked directory's handle: its path, watches on it, its trial root
# a file marked by inode, by its handle (vault.runner.file_handle: an inode number is soon another
# file's): its path when marked, watches on it, its trial root. No fd is held (a removed file's room
# stays taken while one is): its mark goes with its last link, or is removed by its path
_FILES: dict[str, tuple[Path, int, str]] = {}


def itself(rel: str, name: str) -> str:
    """An entry's name, or a marked directory's own (its event is named "." or not at all)."""
    if name in (rel, f"{rel}."):
        return rel.rstrip("/") or "the state directory itself"
    return name


def made(root: Path, state: Path, name: str, label: str, at: Path | None = None) -> None:
    """Trial `root` (named `label` in findings) has state directory `state` of agent `name`: watched
    from now on by every live watch of another trial. A fresh one is marked at `at`, where it is made
    before it is renamed to `state`: marked before it can be found there."""
    with _LOCK:
        _DIRS.setdefault(str(root), {})[state] = name
        _LABELS[str(root)] = label
        for watch in _LIVE:
            if watch.root != str(root):
                watch._tree(at or state, state, name, label, str(root))


def forget(root: Path) -> None:
    """Trial `root` ends: no watch started from now on marks its directories, nor a subdirectory
    made in them. The live watches keep their marks until they close (`NeighbourWatch.close`), as
    runner_files_beside's do: its directories are removed only after this, and an agent beside it
    that found them before (a look, then a `chmod`) changes them meanwhile; with the marks gone at
    once that change went unseen (CI at -n 3: 1 of 2 acting agents named). The removal's own
    changes are the runner's, no agent's."""
    with _LOCK:
        _DIRS.pop(str(root), None)
        _LABELS.pop(str(root), None)


def _mark(group: Fanotify, path: Path, remove: bool = False) -> bool:
    """A mark on directory `path`: in the entry group, or the opens group's writes before 5.9."""
    if group.dir_fd >= 0:
        return group.mark_dir(path, MASK, remove=remove)
    with contextlib.suppress(OSError):
        return group.mark(path, remove=remove, mask=OLD_MASK)
    return False


NAME_LOOKS_MOST = 4096  # entries of its directory looked at for a marked file's name now


def _now_named(key: str, rel: str) -> str:
    """The name below its state directory that file `key` (marked as `rel`) has now, in the
    directory it was marked in. A rename the watch did not see (the older watch, before Linux 5.9,
    sees none: a state file written as `x.tmp` and renamed over `x` was named `x.tmp`) leaves `rel`
    stale; `rel` when it is not found there (moved away, or gone)."""
    known = _FILES.get(key)
    if known is None:
        return rel
    folder, head = known[0].parent, rel.rpartition("/")[0]
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return rel
    try:
        for n, name in enumerate(os.listdir(dir_fd)):
            if n >= NAME_LOOKS_MOST:
                break
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                if handle(fd) == key:
                    return f"{head}/{name}" if head else name
            finally:
                os.close(fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return rel


def _unmark_file(group: Fanotify, path: Path, key: str) -> None:
    """The mark of the file of handle `key` removed by `path`, if that still names it (else it went with
    its last link, or it lives on under another name, its events no longer routed anywhere)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if handle(fd) == key:
            group.mark(Path(f"/proc/self/fd/{fd}"), remove=True, mask=FILE_MASK)
    finally:
        os.close(fd)


@dataclass
class NeighbourWatch:
    """Changes in other trials' state directories while agent `index` of trial `root` runs."""

    group: Fanotify
    root: str
    index: int
    seen_writes: list[dict[str, Any]] = field(default_factory=list)
    older: bool = False  # no entry group (before Linux 5.9): the opens group's writes (module doc)
    lost: bool = False  # the group's queue overflowed while it watched (Fanotify._route)
    flood: list[list[Any]] = field(default_factory=list)  # per overflow, the ancestries of events around it
    partial: set[str] = field(default_factory=set)  # trials whose tree was marked only in part (MAX_DIRS)
    files_partial: set[str] = field(default_factory=set)  # trials with files past MAX_FILES unmarked
    # marked directory -> (role, label, path below the state directory, its path, its trial root)
    _keys: dict[str, tuple[str, str, str, Path, str]] = field(default_factory=dict)
    _count: dict[tuple[str, str], int] = field(default_factory=dict)  # directories marked per tree
    # a file marked by inode, by its handle -> (role, label, its name below the state directory, its trial root)
    _files: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)
    _file_count: dict[tuple[str, str], int] = field(default_factory=dict)  # files marked per tree
    _dir_ids: set[tuple[int, int]] = field(default_factory=set)  # the marked directories' device and inode
    _listed: dict[Path, int] = field(default_factory=dict)  # the older watch: a directory's mtime when last listed

    @classmethod
    def start(cls, root: Path, index: int) -> "NeighbourWatch | None":
        """Before the agent starts; None where fanotify cannot be used (unseen, as before)."""
        group = Fanotify.shared()
        if group is None:
            return None
        watch = cls(group, str(root), index, older=group.dir_fd < 0)
        with _LOCK:
            _LIVE.append(watch)
            for other, dirs in _DIRS.items():
                if other != watch.root:
                    for state, role in dirs.items():
                        watch._tree(state, state, role, _LABELS.get(other, other), other)
        return watch

    def _tree(self, at: Path, state: Path, role: str, label: str, owner: str, rel: str = "") -> list[str]:
        """Marks directory `at` (known as `state`, `rel` below its state directory) and every
        directory below it, marked before it is listed: one made meanwhile is seen made. What it
        holds by then, by names below the state directory (a directory's with a `/`)."""
        try:
            fd = os.open(at, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            if not self.older:
                key = handle(fd)
            else:  # the opens group tells a write's directory by device and inode (opens_reader)
                st = os.fstat(fd)
                key = f"i{st.st_dev}:{st.st_ino}"
            if key is None or key in self._keys:
                return []
            if self._count.get((owner, role), 0) >= MAX_DIRS:  # a directory more than it marks
                self.partial.add(label)
                return []
            path, count, _ = _MARKS.get(key, (state, 0, owner))
            if count == 0 and not _mark(self.group, Path(f"/proc/self/fd/{fd}")):
                return []
            _MARKS[key] = (path, count + 1, owner)
            self._keys[key] = (role, label, rel, state, owner)
            self._count[(owner, role)] = self._count.get((owner, role), 0) + 1
            self.group.dirs.setdefault(key, []).append(self)
            st = os.fstat(fd)
            self._dir_ids.add((st.st_dev, st.st_ino))
            with os.scandir(fd) as entries:
                held = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
            for name, sub in held:
                if not sub:
                    self._file(fd, name, state / name, role, label, f"{rel}{name}", owner)
        except OSError:
            return []
        finally:
            os.close(fd)
        found = [f"{rel}{name}" + ("/" if sub else "") for name, sub in held]
        for name, sub in held:
            if sub:
                found += self._tree(at / name, state / name, role, label, owner, f"{rel}{name}/")
        return found

    def _file(self, at: int | Path, name: str, known: Path, role: str, label: str, rel: str, owner: str) -> None:
        """Marks regular file `name` of directory `at` (an fd, or its path; `known` as the file's path
        its mark is removed by) by inode: a write to it through any name is told by its handle
        (Fanotify.files), a link elsewhere's too. The file that had its name before is let go: no
        longer the neighbour's (a state file is kept by a write elsewhere and a rename over it)."""
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at) if isinstance(at, int) else \
                os.open(at / name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            key = handle(fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode) or key is None:
                return
            if key not in self._files and self._file_count.get((owner, role), 0) >= MAX_FILES:
                self.files_partial.add(label)
                return
            if not self.group.mark(Path(f"/proc/self/fd/{fd}"), mask=FILE_MASK):
                return
        except OSError:
            return
        finally:
            os.close(fd)
        if key in self._files:
            self._files[key] = (role, label, rel, owner)
            return
        for was in [k for k, w in self._files.items() if w == (role, label, rel, owner)]:
            self._let_go(was)
        _, count, _ = _FILES.get(key, (known, 0, owner))
        _FILES[key] = (known, count + 1, owner)
        self._files[key] = (role, label, rel, owner)
        self._file_count[(owner, role)] = self._file_count.get((owner, role), 0) + 1
        self.group.files.setdefault(key, []).append(self)

    def _let_go(self, key: str) -> None:
        """File `key` no longer watched by this watch (under _LOCK); its mark removed once no watch has it."""
        where = self._files.pop(key, None)
        if where is not None:
            self._file_count[(where[3], where[0])] = self._file_count.get((where[3], where[0]), 1) - 1
        watches = self.group.files.get(key, [])
        if self in watches:
            watches.remove(self)
        if not watches:
            self.group.files.pop(key, None)
        if key not in _FILES:  # let go already
            return
        file, count, owner = _FILES[key]
        if count <= 1:
            del _FILES[key]
            _unmark_file(self.group, file, key)
        else:
            _FILES[key] = (file, count - 1, owner)

    def seen_file(self, event: dict[str, Any]) -> None:
        """In the runner's reading thread: a marked file was written (vault.runner.opens: the opens
        group's event, with the directory of the name it was opened by, `pdev`/`pino`, where told)."""
        where = self._files.get(str(event.get("fh")))
        if where is None:
            return
        # through a watched directory: its entry event says so already (the same words, kept once)
        through = (int(event.get("pdev", -1)), int(event.get("pino", -1)))
        if through in self._dir_ids:
            did = f"wrote {where[2]}"
        else:
            did = f"wrote {_now_named(str(event.get('fh')), where[2])} through a link to it elsewhere"
        self._keep(did, where[0], where[1], event)

    def _keep(self, did: str, role: str, label: str, event: dict[str, Any]) -> None:
        chain = [(int(p), float(t)) for p, t in event.get("chain") or []]
        top = tuple(chain[:2])
        # no ancestry (the runner's own, as its removal of an ended trial's tree): never named (close),
        # so it takes none of the MAX_SEEN places a change below an agent needs
        if not chain or len(self.seen_writes) >= MAX_SEEN or any(
                w["did"] == did and w["role"] == role and w["trial"] == label and w["top"] == top
                for w in self.seen_writes):
            return
        self.seen_writes.append({"did": did, "role": role, "trial": label, "pid": int(event["pid"]),
                                 "chain": chain, "top": top})

    def seen(self, event: dict[str, Any]) -> None:
        """In the runner's reading thread: an entry of a watched directory changed (vault.runner.opens)."""
        mask = int(event.get("mask", 0))
        old, new = self._keys.get(str(event.get("dfid"))), self._keys.get(str(event.get("dfid2")))
        where = old or new
        if where is None:
            return
        name = f"{where[2]}{event.get('name', '')}" if old else ""
        name2 = f"{new[2]}{event.get('name2', '')}" if new else ""
        # events on one entry still queued are merged into one (made, written and removed, say)
        dids = ([f"made {name}" + ("/" if mask & FAN_ONDIR else "")] if mask & FAN_CREATE else []) + \
            ([f"wrote {name}"] if mask & (FAN_MODIFY | FAN_CLOSE_WRITE) else []) + \
            ([f"changed the mode, owner or times of {itself(where[2], name)}"] if mask & FAN_ATTRIB else []) + \
            ([f"removed {name}"] if mask & FAN_DELETE else [])
        if mask & FAN_RENAME:
            dids.append(f"renamed {name} to {name2}" if old and new else f"moved {name} away" if old
                        else f"moved {name2} in")
        elif mask & FAN_MOVED_TO:  # a rename inside the trees is said by its FAN_RENAME (close)
            dids.append(f"moved {name}{'/' if mask & FAN_ONDIR else ''} in")
        into, entry = (new, event.get("name2")) if mask & FAN_RENAME else (old, event.get("name"))
        held: list[str] = []
        if mask & FAN_ONDIR and mask & (FAN_CREATE | FAN_RENAME | FAN_MOVED_TO) and into is not None and entry:
            with _LOCK:  # marked (and walked) now: what is made in it next is seen too
                if into[4] in _DIRS:  # its trial is still there
                    sub = into[3] / str(entry)
                    held = self._tree(sub, sub, into[0], into[1], into[4], f"{into[2]}{entry}/")
            # what it held when marked was put there before: by the hand that made it (or moved it in;
            # one renamed inside the tree was marked and walked already, and holds nothing new)
            verb = "made {}" if mask & FAN_CREATE else "moved {} in"
            dids += [verb.format(h) for h in held]
        elif not mask & FAN_ONDIR and mask & (FAN_CREATE | FAN_RENAME | FAN_MOVED_TO) and into is not None and entry:
            with _LOCK:  # a file made or moved in: marked by inode now (a link to it elsewhere written later)
                if into[4] in _DIRS:
                    self._file(into[3], str(entry), into[3] / str(entry), into[0], into[1], f"{into[2]}{entry}", into[4])
        if self.older and old is not None:
            self._rescan(old)
        for did in dids:
            self._keep(did, where[0], where[1], event)

    def _rescan(self, where: tuple[str, str, str, Path, str]) -> None:
        """The older watch sees no entry made: at a write in a directory, its subdirectories not yet
        marked are (a write in one made since is seen from then on; who made it is not told), and
        its files by inode (one written and renamed in place, as a state file is kept)."""
        role, label, rel, at, owner = where
        try:
            # at each write: listed again only when its entries changed since (its mtime)
            mtime = os.stat(at).st_mtime_ns
            if self._listed.get(at) == mtime:
                return
            self._listed[at] = mtime
            with os.scandir(at) as entries:
                held = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        except OSError:
            return
        with _LOCK:
            if owner in _DIRS:
                for name, sub in held:
                    if sub:
                        self._tree(at / name, at / name, role, label, owner, f"{rel}{name}/")
                    else:
                        self._file(at, name, at / name, role, label, f"{rel}{name}", owner)

    def close(self, roots: dict[int, float | None]) -> list[dict[str, Any]]:
        """Once the agent and all it started are gone and the group's events read (after
        OpenWatch.close's fence, which every event of the runner's reader queued before its own
        answers): the marks removed, and the changes by a process below one of the trial's agents
        (`roots`: pid -> start time, None where it was gone when started) as state_cross records."""
        with _LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
            for key in self._keys:
                watches = self.group.dirs.get(key, [])
                if self in watches:
                    watches.remove(self)
                if not watches:
                    self.group.dirs.pop(key, None)
                if key not in _MARKS:  # let go already
                    continue
                path, count, owner = _MARKS[key]
                if count <= 1:
                    del _MARKS[key]
                    _mark(self.group, path, remove=True)
                else:
                    _MARKS[key] = (path, count - 1, owner)
            for key in list(self._files):
                self._let_go(key)
        out: dict[tuple[str, str], list[str]] = {}
        for w in self.seen_writes:
            if any(p in roots and (roots[p] is None or same_start(t, roots[p] or 0.0)) for p, t in w["chain"]):
                did = out.setdefault((w["trial"], w["role"]), [])
                if w["did"] not in did:
                    did.append(w["did"])
        for did in out.values():  # a file made and written was written; one renamed was not also moved in
            to = {d.rsplit(" to ", 1)[1] for d in did if d.startswith("renamed ") and " to " in d}
            did[:] = [d for d in did if not (d.startswith("made ") and f"wrote {d[5:]}" in did)
                      and not (d.startswith("moved ") and d.endswith(" in") and d[6:-3].rstrip("/") in to)]
        said: list[dict[str, Any]] = [{"agent": self.index, "neighbour": trial, "role": role, "did": names}
                                      for (trial, role), names in sorted(out.items())]
        if self.lost:  # events dropped: its own flood (a share of the events around the loss) is its act
            def below(chain: Any) -> bool:
                return any(int(p) in roots and (roots[int(p)] is None or same_start(float(t), roots[int(p)] or 0.0))
                           for p, t in chain or [])
            flooded = any(sum(map(below, sample)) >= FLOOD_SHARE for sample in self.flood)
            said.append({"agent": self.index, "watch_lost": True, "flooded": flooded})
        if self.partial:
            said.append({"agent": self.index, "watch_partial": sorted(self.partial), "most": MAX_DIRS})
        if self.files_partial:
            said.append({"agent": self.index, "watch_partial": sorted(self.files_partial), "most": MAX_FILES,
                         "files": True})
        return said
