"""One daemon per vault home: the home lock, stale sockets, the approver token.

A second daemon on a home is refused with the pid of the one serving it; a
socket left by a killed daemon is removed only if nothing answers on it and
it really is a socket. A file of the home's that is not the kind of file the
daemon keeps there (a directory or FIFO for its pid file, token, credentials
or one of the audit log's files; anything but a socket at a socket's path) makes the home
unusable: the start is refused before anything is written (`UnusableHome`,
exit 2, README), naming it, and nothing is removed or replaced.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import stat
import time
from pathlib import Path

from vault import regular
from vault.audit import files as F
from vault.audit import records as R
from vault.audit.keys import KEY_FILE
from vault.errors import AlreadyRunning
from vault.home import UnusableHome, VaultHome, write_private
from vault.ids import token

log = logging.getLogger("vaultsim.daemon")


# The daemon's thread name (/proc/PID/comm) once it has begun to stop: `status` and `stop` tell a
# daemon on its way out from one still starting (both listen on no socket) by it, without
# connecting and without a file (a full disk may be why it stops)
STOPPING_COMM = "vaultsim-stop"


def mark_stopping() -> None:
    """Name this process (its main thread: the caller's) as stopping; best effort."""
    try:
        with open("/proc/self/comm", "w", encoding="ascii") as f:
            f.write(STOPPING_COMM)
    except OSError:  # not Linux, or /proc not mounted: `status` says "starting or stopping"
        pass


def is_stopping(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as f:
            return f.read(64).strip() == STOPPING_COMM
    except OSError:
        return False


def acquire_home_lock(home: VaultHome) -> int:
    """Take the one-daemon-per-home lock, or explain who holds it."""
    fd = os.open(home.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = _holder_pid(home)
        who = f" (pid {pid})" if pid else ""
        raise AlreadyRunning(f"a vaultsim daemon{who} already serves {home.root}; "
                             "stop it with `vaultsim stop` first") from None
    return fd


def lock_holder(home: VaultHome) -> int | None:
    """The pid of the process holding the home's lock, from the kernel's table (/proc/locks),
    without taking the lock (a start at that moment must not see it held); None when no one
    holds it or it cannot be told. A daemon whose socket files were removed or replaced still
    holds it: `status` and `stop` find it here."""
    try:
        st = os.lstat(home.lock_file)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return flock_holders().get(lock_key(st))


def lock_key(st: os.stat_result) -> str:
    """How /proc/locks names a file: "major:minor:inode", the numbers of its device in hex."""
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def flock_holders() -> dict[str, int]:
    """Every file an flock is held on (by lock_key), and the pid holding it; empty when the
    kernel's table cannot be read."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            table = f.read(1 << 20)
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2155008 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit():
            out.setdefault(fields[5], int(fields[4]))
    return out


def _holder_pid(home: VaultHome, wait_s: float = 2.0) -> int | None:
    """The pid of the daemon holding the lock. A daemon that has just taken it writes its
    pid file a moment later (two racing starts): wait a little for that, not forever."""
    deadline = time.monotonic() + wait_s
    while True:
        pid = _read_pid(home)
        if pid is not None or time.monotonic() > deadline:
            return pid
        time.sleep(0.02)


def live_pid(home: VaultHome) -> int | None:
    """The pid in the home's pid file if that process lives (None: no file, stale or unreadable)."""
    return _read_pid(home)


def _read_pid(home: VaultHome) -> int | None:
    try:
        # non-blocking and regular files only: a FIFO in its place made a second start wait
        # forever for a writer, never saying that a daemon already serves the home
        pid = int(regular.read_bytes(home.pid_file, 64, follow=False))
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a stale file from a killed daemon
    except PermissionError:
        pass
    return pid


def check_home_files(home: VaultHome) -> None:
    """Refuse a home where a file the daemon keeps is of another kind (module doc): UnusableHome
    naming the first, before the pid file or anything else is written. Symlinks are not followed
    (the file itself is what the daemon would open or replace)."""
    log = home.audit_log
    files = [home.pid_file, home.approver_token_file, home.credentials_file, log, F.next_path(log),
             R.pub_path(log), R.head_path(log), home.root / KEY_FILE, *(p for _, p in F.rotated(log))]
    for path, want in [(p, "regular file") for p in files] + [(home.agent_sock, "socket"),
                                                               (home.approver_sock, "socket")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UnusableHome(f"cannot start: {path}: {exc.strerror}") from None
        if want == "socket" and not stat.S_ISSOCK(mode):
            raise UnusableHome(f"cannot start: {path} exists and is not a socket; refusing to remove it")
        if want == "regular file" and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise UnusableHome(f"cannot start: {path} is {regular.kind(mode)}, not a regular file; the vault will not "
                               "use or replace it: move it out of the vault home")


def clear_stale_socket(path: Path) -> None:
    """A socket left by a killed daemon is removed, but only if nobody answers on it."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UnusableHome(f"{path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        log.info("removed stale socket %s", path)
        return
    except OSError:
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise AlreadyRunning(f"another process answers on {path}; refusing to take it over")


def approver_token(home: VaultHome) -> str:
    """The approver token, minted on first start. One that is not a whole token (an empty
    or cut-short file from an older, non-atomic write) is replaced: accepting it would let
    an approver in with an empty or guessable token."""
    path = home.approver_token_file
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise UnusableHome(f"{path} exists and is not a regular file; refusing to use it as the "
                               "approver token")
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.chmod(path, 0o600)
        with open(path, "rb") as f:  # bounded: a GiB file there is no token, not a start's memory
            value = f.read(4096).decode(errors="replace").strip()
        if _TOKEN.fullmatch(value):
            return value
        log.warning("the approver token in %s was damaged; a new one was made", home.root)
    value = token(32)
    write_private(path, value.encode())  # all or nothing; an OSError names the file
    return value


# secrets.token_urlsafe(32): 43 characters of the URL-safe base64 alphabet
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43,512}")  # up to what approver.hello (and its clients) accept
