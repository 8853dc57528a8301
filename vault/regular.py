"""Reading a file that someone else can reach: a regular file only, never waited on, never
read without end.

Each of these was a bug once: a FIFO put where a file should be was opened and waited on
for a writer forever (a daemon that never started, a run that ignored TERM, `diag show`
held); a link to /dev/zero was read until memory ran out. Every such read in vault opens
through here; the callers word the error for their own user.

`create_fresh` is the other side: a file the runner writes in a directory an agent can reach.

Only the standard library: the jail's keeper imports this.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from typing import BinaryIO


def kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class NotRegular(OSError):
    """A directory, FIFO, socket or device where a regular file was expected."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind(mode)})", str(path))
        self.kind = kind(mode)
        self.is_dir = stat.S_ISDIR(mode)


class TooLarge(OSError):
    """A file longer than any the reader's kind of file can be (a link to /dev/zero, a GiB)."""

    def __init__(self, path: str | os.PathLike[str], limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes", str(path))
        self.limit = limit


def open_fd(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """A blocking read-only fd on `path`, a regular file (NotRegular otherwise, OSError when it
    cannot be opened). Opened without blocking, so a FIFO opens at once without a writer and is
    refused; checked on the opened fd, so a file swapped after a check cannot slip through.
    `follow=False`: a symbolic link is refused too (ELOOP), for files in a directory an agent
    can write."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(path, mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: str | os.PathLike[str], *, follow: bool = True) -> BinaryIO:
    """`open_fd` as a binary file object."""
    return os.fdopen(open_fd(path, follow=follow), "rb")


def read_bytes(path: str | os.PathLike[str], limit: int | None = None, *, follow: bool = True,
               cut: bool = False) -> bytes:
    """A regular file's bytes, at most `limit` of them: past it TooLarge, or with `cut` the
    first `limit` (a reader that fails closed on what it does not read)."""
    with open_file(path, follow=follow) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        if cut:
            return data[:limit]
        raise TooLarge(path, limit)
    return data


def create_fresh(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A new, empty regular file at `path`, opened to append. Whatever stood there is removed
    first, never opened or followed: an unjailed agent that ran earlier in the trial could put a
    FIFO with no reader where the runner writes the next agent's task, output or keeper report,
    and the open waited forever (the whole run held), or a link, and the runner wrote through it.
    O_EXCL: a file put back between the removal and the creation is refused (FileExistsError)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path)  # never follows a link inside it
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def write_fresh(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """`data` as the whole of a fresh file at `path` (create_fresh)."""
    fd = create_fresh(path, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
