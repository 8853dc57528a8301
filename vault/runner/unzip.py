"""The leak scan of a zip archive: each member decompressed, within the trial's budget.

Why: a file an agent left holding a credential, archived (`zip state.zip state.json`, Python's
`shutil.make_archive(..., "zip")`, a `.jar` or `.whl`), passed: its members are raw deflate (or
bzip2, lzma) streams behind zip's own headers, and only files beginning with a gzip, zlib, bzip2 or
xz header were read decompressed (vault.runner.unpack). A file beginning with a zip's local header
is read as an archive: each member (up to MEMBERS_MOST) through unpack.stream, so its bytes count
against the same per-trial budget and a member the budget cuts is named.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from vault.runner import unpack

HEAD = b"PK\x03\x04"
MEMBERS_MOST = 10_000
READ = 1 << 16
# a member that is encrypted, packed by a method this Python lacks, or damaged (its stream's own errors)
_MEMBER_ERRORS: tuple[type[Exception], ...] = (RuntimeError, NotImplementedError, zipfile.BadZipFile,
                                               *unpack.DECODE_ERRORS)


class _Same:
    """A decompressor that passes its input through (a zip member is read decompressed already)."""

    eof = False
    unused_data = b""
    needs_input = True

    def __init__(self) -> None:
        self.unconsumed_tail: Any = b""

    def decompress(self, data: Any, max_length: int) -> Any:
        self.unconsumed_tail = data[max_length:]
        return data[:max_length]


def window(fd: int, needles: list[bytes], overlap: int, name: str) -> bytes:
    """The decompressed part of a member of the zip at `fd` that holds one of `needles` (b"" when
    none does, or it is no readable zip: what its bytes show was scanned as they are)."""
    try:
        with os.fdopen(os.dup(fd), "rb") as f, zipfile.ZipFile(f) as z:
            members = [i for i in z.infolist() if not i.is_dir()]
            if len(members) > MEMBERS_MOST:
                unpack.note_cut(name)
            for info in members[:MEMBERS_MOST]:
                if unpack.left() <= 0:
                    break  # the stream that spent it named the file
                try:
                    with z.open(info) as member:
                        chunks = iter(lambda: member.read(READ), b"")
                        if hit := unpack.stream(chunks, _Same, needles, overlap, name):
                            return hit
                except _MEMBER_ERRORS:
                    continue  # encrypted, a method this Python lacks, or damaged: its bytes were scanned raw
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError):
        pass
    return b""
