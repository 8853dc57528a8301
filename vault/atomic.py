"""All-or-nothing private files: the one way the vault replaces a file it keeps.

Why: a file that is rewritten in place (or with one unchecked `write`) is
lost on a full disk. `os.write` may write fewer bytes than asked when the
device fills mid-way, and the old code took that as done: `secret set`
printed "set" and left half a `credentials.enc`, which took every stored
credential with it. So every private file (credentials, approver token,
keyring file, diagnostics, pid file, audit head and keys) is written here:

    1. a new temp file beside the target (same directory, so the rename is
       atomic), created exclusively, 0600, never through a planted symlink
    2. every byte written, short writes continued, a write that makes no
       progress taken as a full device
    3. fsync of the temp file, then close (both may report a failed write)
    4. rename over the old file (readers see the old or the new, never half)
    5. fsync of the directory, so the rename survives a crash

A failure in 1-4 removes the temp file and leaves the old file as it was;
the OSError goes to the caller, which reports it and exits non-zero. A
failure in 5 means the new content is in place but may not survive a power
cut; that is reported too.

`private_dir` is the matching rule for directories: create one 0700, or
accept an existing one only if it is a real directory (not a symlink), ours,
and not open to others. A directory the vault did not create is never
chmod'ed: the error says what is wrong and how to fix it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, continuing after short writes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # no progress and no error: the device took nothing
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def append_whole(fd: int, data: bytes) -> None:
    """Append `data` to the file open on `fd` (O_APPEND) whole or not at all: what a full disk
    took of it is cut off again, so a log of lines never ends in a torn one (one writer)."""
    before = os.fstat(fd).st_size
    try:
        write_all(fd, data)
    except OSError:
        try:
            if os.fstat(fd).st_size > before:
                os.ftruncate(fd, before)
        except OSError:
            pass
        raise


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A log file opened to append, never waited on: a FIFO with no reader (one an agent put
    there) raises at once (ENXIO, its message naming a FIFO) instead of blocking the open
    forever; one with a reader, a file or a terminal opens as before, writes blocking as usual."""
    import fcntl
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO that no process reads", os.fspath(path)) from None
        raise
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def temp_name(path: Path) -> Path:
    """The temp file for one write of `path`: hidden, per process, never reused."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def write_private(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data`, all or nothing (see the module docstring).

    Raises OSError whose `filename` is `path` (never the temp file's name)."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, _OPEN_FLAGS, mode)
    except OSError as exc:
        exc.filename, exc.filename2 = str(path), None
        raise
    try:
        try:
            os.fchmod(fd, mode)  # whatever the umask
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)  # may itself report the failed write (e.g. on NFS)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            exc.filename, exc.filename2 = str(path), None  # the file the user knows, not the temp
        raise
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        raise NotDurable(exc.errno, exc.strerror, str(path)) from None


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NotDurable(OSError):
    """The new content is in place, but syncing its directory failed: a crash may undo it."""


def failure(path: str | os.PathLike[str], exc: OSError) -> str:
    """A one-line account of a failed write_private, for the user."""
    why = exc.strerror or type(exc).__name__
    if isinstance(exc, NotDurable):
        return (f"wrote {path} but could not sync its directory ({why}); "
                "the new content may not survive a crash")
    return f"cannot write {path}: {why}; the previous content is unchanged"


class UnsafeDirectory(Exception):
    """A directory the vault will not keep secrets in; the message says why and the fix."""


def private_dir(path: Path, what: str) -> bool:
    """Create `path` 0700, or check an existing one is private and ours.

    Returns True when this call created it. Raises UnsafeDirectory (the reason
    and the fix) or OSError (could not create it)."""
    created = False
    try:
        path.mkdir(mode=0o700)
        created = True
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = True
    if created:
        os.chmod(path, 0o700)  # ours: mkdir's mode went through the umask
        return True
    check_private_dir(path, what)
    return False


def check_private_dir(path: Path, what: str) -> None:
    """An existing directory must be a real directory, ours, closed to others."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        raise UnsafeDirectory(f"{what} {path} is a symlink (to {target}); give the real directory, "
                              "so nobody can point it elsewhere")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{what} {path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDirectory(f"{what} {path} belongs to uid {st.st_uid}, not to you (uid "
                              f"{os.getuid()}); use a directory of your own")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        # a shared directory (/tmp) or a system or home one (/, /usr, ~) must not be "fixed"
        # with chmod: point at a new one inside it instead
        fix = ("use a directory of its own that the vault creates, e.g. "
               f"{path / 'vaultsim'}" if mode & (stat.S_IWOTH | stat.S_ISVTX) or _not_to_close(path) else
               f"run `chmod 700 {path}` if it is meant for this, or use a new directory")
        raise UnsafeDirectory(f"{what} {path} is open to others (mode {mode:04o}) and the vault does "
                              f"not change a directory it did not create: {fix}")


def _not_to_close(path: Path) -> bool:
    """The root, a top-level directory or a home directory: closing it to others breaks the system."""
    real = path.resolve()
    return len(real.parts) <= 2 or real == Path.home().resolve() or real.parent == Path("/home")
