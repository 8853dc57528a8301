"""What the CLI does when its stdout cannot take the output: a reader that left, a full disk.

    vaultsim schema report | head -1     the reader is gone: stop quietly, exit 1 (as rich
                                         does for `run`), no BrokenPipeError traceback
    vaultsim status --json > /dev/full   no room: one line on stderr, exit 3 (an
                                         infrastructure error, not a bug: no traceback)

Either way what is still buffered is sent to /dev/null, so the interpreter's own
flush at exit does not fail a second time ("Exception ignored ...").
"""

from __future__ import annotations

import errno
import os
import select
import sys

# a write the machine could not take: the disk, a quota, a file size limit, the device
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def closed() -> bool:
    """Whether stdout's reader is gone (a pipe or socket with nobody reading: POLLERR or POLLHUP)."""
    fd = _fd()
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def flush() -> None:
    """Flush stdout, if there is one (`vaultsim ... >&-` starts with none: print() writes nothing)."""
    if sys.stdout is not None:
        sys.stdout.flush()


def settle() -> None:
    """Flush stdout; if it cannot take what is buffered, drop that instead of failing again at exit."""
    try:
        flush()
    except OSError:
        discard()


def discard() -> None:
    """Point stdout at /dev/null: what is still buffered for it goes nowhere."""
    fd = _fd()
    if fd is None:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def _fd() -> int | None:
    try:
        return sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by a test's capture: no descriptor
        return None
