"""Without a jail, what a mount made during the trial hides: the files beneath it.

Why: an unjailed agent running as root wrote its credential in a file (in a directory of its own in
/tmp, in an older file it appended to, in its own $TMPDIR or state_dir) and then mounted an empty
tmpfs, or bind-mounted an empty directory, over that directory, and left it mounted: PASS. Every
walk of the leak scan saw the empty mount; the file stayed on disk beneath it (an `umount` shows
it), and the trial's removal of its directory failed on the mount, leaving it there. In a jail,
mounts are the jail's own (a mount namespace of its own) and go with it.

The mounts made since the trial's world was set up (`table`, taken then and again at the scan) are
taken away one by one, deepest first, in a private mount namespace of a helper process (this module
run as a program: unshare(2) refuses a mount namespace to a threaded process), which changes nothing
any other process sees; after each, what the mount covered is read: every entry changed since the
trial's first agent started, its bytes (a regular file), its name, link target and extended
attributes. A directory holding another live run's lock (a vault home's `daemon.lock`, a run root's
`run.lock`, held) is passed over, as the walk of the shared places passes it (vault.runner.shared_dirs),
but for this trial's own root. Only this trial's credentials are looked for, so another process's
mounts cannot fail it.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import json
import os
import stat
import subprocess
import sys

MOUNTINFO = "/proc/self/mountinfo"
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MNT_DETACH = 2
ENTRIES_MOST = 50_000  # entries looked at beneath all mounts (a mount over /usr hides a large tree)
FILES_MOST = 1_000
BYTES_MOST = 64 << 20
ATTRS_MOST = 16
HELPER_TIMEOUT_S = 30.0
LOCKS = ("run.lock", "daemon.lock", os.path.join("h", "daemon.lock"))  # vault.runner.shared_dirs


def table() -> frozenset[tuple[str, str]]:
    """The mounts now: (mount id, mount point) each, the point as /proc escapes it."""
    try:
        with open(MOUNTINFO, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return frozenset()
    return frozenset((cells[0], cells[4]) for cells in (line.split(" ") for line in lines) if len(cells) > 4)


def _unescaped(point: str) -> str:
    for octal, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        point = point.replace(octal, char)
    return point


def made_since(before: frozenset[tuple[str, str]]) -> list[str]:
    """The mount points of mounts made since `before`, deepest (then latest) first."""
    new = [(int(mid) if mid.isdigit() else 0, _unescaped(point)) for mid, point in table() - before]
    new.sort(key=lambda m: (m[1].count("/"), m[0]), reverse=True)
    return [point for _, point in new]


def _held(directory: str) -> bool:
    """Does another process hold a run's lock in `directory` (a live world: its secret files are
    watched by that run)? Probed with a shared lock taken and let go at once."""
    for name in LOCKS:
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                return True
            finally:
                os.close(fd)
    return False


def _marks(path: str, st: os.stat_result) -> list[bytes]:
    # vault.runner.shared_dirs.marks: this file runs alone as the helper (`python -I`), importing
    # nothing of the project, so it keeps its own copy
    out = [os.fsencode(path)]
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(st.st_mode):
            out.append(os.fsencode(os.readlink(path)))
        for attr in os.listxattr(path, follow_symlinks=False)[:ATTRS_MOST]:
            out.append(os.fsencode(attr) + b"=" + os.getxattr(path, attr, follow_symlinks=False))
    return out


class _Reader:
    def __init__(self, since: float, own: str) -> None:
        self.since, self.own = since, own
        self.files: dict[str, str] = {}
        self.names: list[bytes] = []
        self.entries = self.size = self.past = 0

    def read(self, top: str) -> None:
        """Every entry below `top` changed since the trial began: marks, and a regular file's bytes."""
        stack = [top]
        while stack:
            base = stack.pop()
            if base != self.own and not (self.own and base.startswith(self.own + "/")) and _held(base):
                continue
            try:
                with os.scandir(base) as it:
                    entries = list(it)
            except OSError:
                continue
            for e in entries:
                self.entries += 1
                if self.entries > ENTRIES_MOST:
                    self.past += 1
                    return
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
                if max(st.st_mtime, st.st_ctime) < self.since:
                    continue
                self.names.extend(_marks(e.path, st))
                if not stat.S_ISREG(st.st_mode) or e.path in self.files:
                    continue
                if len(self.files) >= FILES_MOST or self.size + st.st_size > BYTES_MOST:
                    self.past += 1
                    continue
                with contextlib.suppress(OSError):
                    fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as f:
                        data = f.read(BYTES_MOST - self.size)
                    self.size += len(data)
                    self.files[e.path] = base64.b64encode(data).decode()


def _helper(points: list[str], since: float, own: str) -> dict[str, object]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return {"unread": os.strerror(ctypes.get_errno())}
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing undone here is undone outside
        return {"unread": os.strerror(ctypes.get_errno())}
    reader = _Reader(since, own)
    for point in points:  # deepest first: a mount inside a mount of the agent's is read in that one too
        if libc.umount2(os.fsencode(point), MNT_DETACH) == 0:
            reader.read(point)
    return {"files": reader.files, "names": base64.b64encode(b"\n".join(reader.names)).decode(), "past": reader.past}


def hidden(before: frozenset[tuple[str, str]], since: float, own: str) -> tuple[dict[str, bytes], list[str]]:
    """label -> what the mounts made since `before` cover; notes on what was not read. Nothing
    without such a mount (the common case: no helper is started)."""
    points = made_since(before)
    if not points:
        return {}, []
    try:
        # -I: stdlib only, and not this directory on its path (vault.runner.select is no `select`)
        done = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), json.dumps([points, since, own])],
                              capture_output=True, timeout=HELPER_TIMEOUT_S)
        got = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        got = {"unread": type(e).__name__}
    if "unread" in got:  # named: the mount hides what it covers from every other scan
        return {}, [f"what {len(points)} mount(s) made during the trial cover was not read ({got['unread']})"]
    out = {f"a file beneath a mount made during the trial, {path}": base64.b64decode(data)
           for path, data in got.get("files", {}).items()}
    out["the names, link targets and attributes beneath mounts made during the trial"] = base64.b64decode(
        got.get("names", ""))
    notes = [f"{got['past']} entries beneath mounts made during the trial, past the scan's bounds, were not read"] \
        if got.get("past") else []
    return out, notes


def detach_below(root: str) -> None:
    """Take away the mounts below the trial's own root (an agent's, no other's) so that it can be removed."""
    libc = ctypes.CDLL(None, use_errno=True)
    for point in made_since(frozenset()):
        if point.startswith(root.rstrip("/") + "/"):
            libc.umount2(os.fsencode(point), MNT_DETACH)


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    sys.stdout.write(json.dumps(_helper(list(args[0]), float(args[1]), str(args[2]))))
