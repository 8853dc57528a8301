"""The leak scan of a compressed file: its contents, decompressed, bounded per trial.

Why: a state file kept gzipped (`state.json.gz`) that held a credential passed the scan of its
bytes. A file an agent left that begins with a gzip, zlib, bzip2, xz or legacy .lzma header is read
decompressed too (members one after another, as `gzip a >> f` makes), at most SCAN_CHUNK out of
the decompressor at a time and UNPACK_MOST in one trial: a decompression bomb, or ten thousand
of them, stops there, and a compressed file not read whole because of it is said (`cut`), so a
leak behind a bomb is not vouched for. The budget is the collecting thread's (one trial's).

A raw deflate stream (no header: .NET's DeflateStream, Node's deflateRawSync, PHP's gzdeflate,
Java's Deflater(nowrap), zlib at wbits -15) is read too where a file, or a run of base64 or hex
letters (vault.runner.packed), begins with one: it has no header to find, so its first bytes are
fed to an inflater (`raw_probe`); random or text data fails within them (0.5% of random 64-byte
starts pass and then decode a few hundred bytes at most).
"""

from __future__ import annotations

import bz2
import lzma
import os
import threading
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from vault.runner.needle_scan import matcher

UNPACK_MOST = 64 << 20
EXAMINE_MOST = 256 << 20  # text searched for encoded streams in one trial (vault.runner.packed: ~30 MB/s)
DUMPS_MOST = 32 << 20  # hex dump lines parsed in one trial (vault.runner.dumps: ~6 MB/s)
SPREAD_MOST = 256 << 20  # text read unwrapped or by its letters alone in one trial (vault.runner.spread)
RECODE_MOST = 256 << 20  # base64 decoded, text read with its HTML references decoded (vault.runner.recoded)
SCAN_CHUNK = 4 << 20
_trial = threading.local()
Maker = Callable[[], Any]  # a new decompressor
# what a decompressor raises on bytes that are not (or no longer) its stream: lzma's own error is
# no OSError, and one escaping ended a trial as a harness ERROR (a corrupt .xz left in /tmp)
DECODE_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)


def start() -> None:
    """A trial's scan begins: its whole budget, nothing cut."""
    _trial.left, _trial.cut, _trial.examine, _trial.dumps = UNPACK_MOST, [], EXAMINE_MOST, DUMPS_MOST
    _trial.spread, _trial.recode = SPREAD_MOST, RECODE_MOST


def cut() -> list[str]:
    """The compressed files the budget left unread, in this thread's trial."""
    return list(getattr(_trial, "cut", []))


def left() -> int:
    """What this thread's trial may still decompress."""
    return int(getattr(_trial, "left", UNPACK_MOST))


def _take(budget: str, whole: int, size: int) -> bool:
    """Take `size` bytes from this thread's trial's `budget` (`whole` before its scan began), if left."""
    left_ = int(getattr(_trial, budget, whole))
    if left_ < size:
        return False
    setattr(_trial, budget, left_ - size)
    return True


def examine(size: int) -> bool:
    """May this thread's trial search `size` more bytes for encoded streams (taken if so)?"""
    return _take("examine", EXAMINE_MOST, size)


def parse_dump(size: int) -> bool:
    """May this thread's trial parse `size` more bytes of hex dump lines (taken if so)?"""
    return _take("dumps", DUMPS_MOST, size)


def spread(size: int) -> bool:
    """May this thread's trial read `size` more bytes spread out (taken if so)?"""
    return _take("spread", SPREAD_MOST, size)


def recode(size: int) -> bool:
    """May this thread's trial decode `size` more bytes of base64 or HTML (taken if so)?"""
    return _take("recode", RECODE_MOST, size)


def note_cut(name: str) -> None:
    """A stream in `name` was left unread for the budget (vault.runner.packed)."""
    getattr(_trial, "cut", []).append(name)  # each time: leak_window counts them to vouch for a file


PROBE = 64  # bytes fed first: what begins no stream fails within them


def inflate_raw() -> Any:
    """A decompressor of a raw deflate stream (module doc)."""
    return zlib.decompressobj(-zlib.MAX_WBITS)


def probe(make: Maker, head: bytes) -> bool:
    """Do `head` (a stream's first PROBE bytes) decompress without an error?"""
    try:
        make().decompress(head, 1 << 16)
    except DECODE_ERRORS:
        return False
    return True


def raw_probe(head: bytes) -> bool:
    """Could `head` begin a raw deflate stream (module doc)?"""
    return len(head) >= 2 and probe(inflate_raw, head[:PROBE])


def packer(head: bytes) -> Maker | None:
    """A decompressor factory for a file beginning with `head`, or None."""
    if head.startswith(b"\x1f\x8b"):
        return lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)
    if head[:1] == b"\x78" and len(head) > 1 and (head[0] << 8 | head[1]) % 31 == 0:
        return lambda: zlib.decompressobj()
    if head.startswith(b"BZh"):
        return bz2.BZ2Decompressor
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMADecompressor
    if alone(head):
        return lambda: lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)
    return None


def alone(head: bytes) -> bool:
    """Does `head` begin a legacy .lzma stream (`xz --format=lzma`, `lzma`, Python's
    `lzma.FORMAT_ALONE`, the LZMA SDK)? It has no magic: a 13-byte header of its properties byte
    (lc, lp, pb: below 225), its dictionary size (2^n or 2^n + 2^(n-1), 4 KiB to 1.5 GiB, as xz
    writes it) and its uncompressed size (all ones when unknown). A state file kept so passed."""
    if len(head) < 13 or head[0] >= 225:
        return False
    size = int.from_bytes(head[1:5], "little")
    if not (1 << 12) <= size <= (3 << 29) or not any(size in (1 << n, 3 << (n - 1)) for n in range(12, 31)):
        return False
    length = int.from_bytes(head[5:13], "little")
    return length == (1 << 64) - 1 or length < (1 << 40)


def window(fd: int, make: Maker, needles: list[bytes], overlap: int, name: str) -> bytes:
    """The decompressed part of the file at `fd` (read from its start) that holds one of
    `needles`, b"" when none does; each window overlaps the last by a needle's length."""
    return stream(iter(lambda: os.read(fd, 1 << 16), b""), make, needles, overlap, name)


def stream(chunks: Iterable[bytes | memoryview], make: Maker, needles: list[bytes], overlap: int,
           name: str) -> bytes:
    """`window` over `chunks` (vault.runner.packed hands slices of a window it holds, uncopied)."""
    found = matcher(needles).found
    d = make()
    tail, total = b"", UNPACK_MOST - getattr(_trial, "left", UNPACK_MOST)

    def seen(data: bytes) -> bytes:
        nonlocal tail, total
        total += len(data)
        win = tail + data
        tail = win[-overlap:] if overlap else b""
        return win if found(win) else b""
    try:
        for pending in chunks:
            if total >= UNPACK_MOST:
                break
            while pending and total < UNPACK_MOST:
                if hit := seen(bytes(d.decompress(pending, SCAN_CHUNK))):
                    return hit
                # what the decompressor has not taken yet: zlib hands it back, bz2 and lzma keep it
                pending = getattr(d, "unconsumed_tail", b"")
                while not d.eof and not getattr(d, "needs_input", True) and total < UNPACK_MOST:
                    if hit := seen(bytes(d.decompress(b"", SCAN_CHUNK))):
                        return hit
                if d.eof:
                    pending = d.unused_data + pending  # another member may follow (gzip a >> f)
                    d = make()
    except DECODE_ERRORS:
        pass  # not (or no longer) a stream of that kind: what was read is what it shows
    finally:
        _trial.left = max(0, UNPACK_MOST - total)
    if total >= UNPACK_MOST:
        getattr(_trial, "cut", []).append(name)
    return b""
