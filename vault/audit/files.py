"""The files of one audit log set: segment names, safe reads, all-or-nothing writes.

Why a module of its own: the writer, verify and show all need to find the
segments of a log the same way, and every file the audit package writes
besides the log itself (``NAME.head``, ``NAME.pub``, ``audit.key``) must be
replaced all-or-nothing, while every file it reads must be a regular file (a
FIFO or a device named as a log would hang or feed verify forever).

A log set, for ``NAME.log``::

    NAME.000000000000.log   the oldest kept segment (named by its first seq)
    NAME.000000150213.log   ...
    NAME.log                the active segment, the only one ever appended to
    NAME.pub  NAME.head     the public key; the newest durable signed head
    .NAME.log.next          a segment being started (exists only mid-rotation)

A log that never rotated is just ``NAME.log``. Segment numbers are the seq of
the segment's first record, zero-padded to 12 digits (wider past 10^12).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from vault import regular
from vault.atomic import write_private
from vault.errors import BadInput

SEGMENT_RE = re.compile(r"(?P<stem>.+)\.(?P<first>[0-9]{12,})\.log")


def _a(what: str) -> str:
    """What was expected, with its article: an audit log, a public key."""
    return ("an " if what[:1].lower() in "aeiou" else "a ") + what


def stem(base: Path) -> str:
    """``audit`` for ``audit.log`` (a base without ``.log`` keeps its whole name)."""
    return base.name[:-4] if base.name.endswith(".log") else base.name


def segment_path(base: Path, first_seq: int) -> Path:
    """Where the rotated segment of `base` whose first record is `first_seq` lives."""
    return base.with_name(f"{stem(base)}.{first_seq:012d}.log")


def next_path(base: Path) -> Path:
    """The temporary name of a segment being started (renamed to `base` when complete)."""
    return base.with_name(f".{base.name}.next")


def base_of(path: Path) -> Path:
    """The set a file belongs to: ``audit.log`` for ``audit.000000001000.log`` and for itself."""
    m = SEGMENT_RE.fullmatch(path.name)
    return path.with_name(f"{m['stem']}.log") if m else path


def rotated(base: Path) -> list[tuple[int, Path]]:
    """The rotated segments of `base`, oldest first: (first seq from the name, path)."""
    prefix = stem(base) + "."
    out = []
    try:
        names = os.listdir(base.parent)
    except OSError:
        return []
    for name in names:
        if not name.startswith(prefix):
            continue
        m = SEGMENT_RE.fullmatch(name)
        if m and m["stem"] == stem(base):
            out.append((int(m["first"]), base.parent / name))
    out.sort()
    return out


def set_bytes(base: Path) -> int:
    """Bytes on disk of the whole set (the active segment and every rotated one)."""
    total = 0
    for p in [path for _, path in rotated(base)] + [base]:
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def open_regular(path: Path, what: str = "audit log") -> int:
    """A read-only fd on `path`, which must be a regular file (vault.regular). BadInput otherwise."""
    try:
        return regular.open_fd(path)
    except FileNotFoundError:
        raise BadInput(f"no {what} at {path}") from None
    except regular.NotRegular as exc:
        if exc.is_dir:
            raise BadInput(f"{path} is a directory, not {_a(what)}") from None
        raise BadInput(f"{path} is not a regular file (a FIFO, socket or device), not {_a(what)}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {what} {path}: {exc.strerror}") from None


def read_small(path: Path, what: str, limit: int = 1 << 20) -> bytes:
    """The whole of a small regular file (a head file, a public key). FileNotFoundError
    passes through; a FIFO, device or oversized file is BadInput."""
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    fd = open_regular(path, what)
    try:
        if os.fstat(fd).st_size > limit:
            raise BadInput(f"{what} {path} is larger than {limit} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise BadInput(f"{what} {path} is larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise BadInput(f"cannot read {what} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, 0600, all or nothing; OSError if it could not be done
    (vault.atomic: temp file, every byte, fsync, rename, directory fsync; the old file
    untouched and no temp file left on failure)."""
    write_private(path, data)


def fsync_dir(directory: Path, *, strict: bool = False) -> None:
    """Make renames and unlinks in `directory` durable. `strict`: OSError if it fails."""
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(dfd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(dfd)
