"""The leak scan of compressed data written as text: base64 (either alphabet, line-wrapped or
not) or hex of a gzip, zlib, bzip2 or xz stream, anywhere in a window, or such a stream raw in
a window's middle.

Why: `gzip | base64` of a credential on stdout, in a file or in the body of an approved call
passed the scan: the needles are the value and its encodings, and a file was decompressed only
when it began compressed (vault.runner.unpack). Each run of base64 or hex letters in a window is
decoded (at each alignment its first letter can have), the decoded bytes and the window itself
are searched for a stream's header, and each stream found is decompressed through unpack's
decompressors, under the trial's one budget (unpack.UNPACK_MOST, said when cut). A header
that does not begin a stream fails on its first bytes (PROBE), before anything is copied.
"""

from __future__ import annotations

import binascii
import contextlib
import re
from collections.abc import Iterator

from vault.runner import unpack
from vault.runner.needle_scan import matcher

RUN_LEAST = 32  # letters: the shortest stream with a credential in it is longer (a header is 10-18 bytes)
PROBE = unpack.PROBE  # bytes fed first: a header that begins no stream fails within them
TRIES_MOST = 4096  # headers tried in one window: past that the window is named as cut (a flood of them)
RAW_TRIES_MOST = 1 << 16  # runs of letters tried as raw deflate in one window (a log of hashes has thousands)
CARRY_MOST = 1 << 20  # a run of letters reaching a window's end is carried into the next up to this

_HEADS = (b"\x1f\x8b\x08", b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda", b"BZh", b"\xfd7zXZ\x00")
_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
_HEX_LINES_MASK = bytes(1 if b in b"0123456789abcdefABCDEF\r\n" else 0 for b in range(256))
_URLSAFE = bytes.maketrans(b"-_", b"+/")
_B64_LINES_MASK = bytes(1 if b in _B64 + b"\r\n" else 0 for b in range(256))


def _signatures() -> re.Pattern[bytes]:
    """The letters of a header's base64 that depend on the header alone, at each of the three
    alignments: a run of letters holding none of them is not decoded (text's long words and
    paths are runs too)."""
    sigs = set()
    for head in _HEADS:
        for pad in range(3):
            enc = binascii.b2a_base64(b"\0" * pad + head + b"\0\0\0", newline=False)
            lo, hi = 8 * pad, 8 * (pad + len(head))
            sigs.add(bytes(c for i, c in enumerate(enc) if 6 * i >= lo and 6 * i + 6 <= hi))
    return re.compile(b"|".join(re.escape(s_) for s_ in sorted(sigs, key=len, reverse=True)))


_SIGS = _signatures()
_HEX_SIGS = re.compile(b"|".join(re.escape(h.hex().encode()) for h in _HEADS), re.I)


def hit(window: bytes, needles: list[bytes], name: str, raw: bool = True) -> bytes:
    """The decompressed part of a stream in `window` (raw, or in base64 or hex) that holds one
    of `needles`; b"" when none does. `raw`: look for a raw stream in the window too (not in a
    file unpack reads decompressed already)."""
    if not needles or len(window) < RUN_LEAST:
        return b""
    if not unpack.examine(len(window)):
        unpack.note_cut(name)  # past the trial's budget: named, not graded, as unpack's cut
        return b""
    overlap = max(len(n) for n in needles) - 1
    tries = 0
    for data in _decoded(window, raw):
        for at in _headers(data):
            tries += 1
            if tries > TRIES_MOST or not unpack.left():
                unpack.note_cut(name)
                return b""
            make = unpack.packer(data[at:at + 6])  # six: an xz header is that long, bzip2's three
            if make is None or not unpack.probe(make, data[at:at + PROBE]):
                continue
            if found := _inflate(memoryview(data)[at:], make, needles, overlap, name):
                return found
    # a raw deflate stream has no header: the window (output written raw) and each run of letters
    # are tried where they begin (unpack's doc)
    for tries, data in enumerate(_runs_decoded(window, raw)):
        if tries >= RAW_TRIES_MOST or not unpack.left():
            unpack.note_cut(name)
            return b""
        if unpack.raw_probe(data) and (found := _inflate(memoryview(data), unpack.inflate_raw, needles,
                                                            overlap, name)):
            return found
    return b""


def _headers(data: bytes) -> Iterator[int]:
    """Where a stream's header is in `data` (bytes.find per header: a regex's alternation is
    several times slower over megabytes)."""
    sample = data[::SAMPLE_STEP]  # a byte every SAMPLE_STEP: is a header's first byte most of it?
    for head in _HEADS:
        if len(head) == 2 and sample.count(head[:1]) * 16 > len(sample):
            yield from _after_common(data, head)
            continue
        at = data.find(head)
        while at >= 0:
            if head != b"BZh" or data[at + 3:at + 10][:1].isdigit() and data[at + 4:at + 10] == b"1AY&SY":
                yield at
            at = data.find(head, at + 1)


SAMPLE_STEP = 997


def _after_common(data: bytes, head: bytes) -> Iterator[int]:
    """The places of a two-byte header whose first byte is common in `data`, found by its second.

    Why: zlib's headers begin with 0x78, `x`: bytes.find of one in lines of `x` (what red team 7
    prints to hold its grading) compared at every byte, 14 ms per 4 MiB for each of the four."""
    at = data.find(head[1:], 1)
    while at >= 0:
        if data[at - 1] == head[0]:
            yield at - 1
        at = data.find(head[1:], at + 1)


def carry(window: bytes) -> int:
    """Where the run of letters the window ends in begins (len(window) when it ends in none), at
    most CARRY_MOST back: the next window is searched from there, so a stream split between two
    windows is read whole."""
    tail = window[-CARRY_MOST:].translate(_B64_LINES_MASK)
    return len(window) - (len(tail) - len(tail.rstrip(b"\1")))


def _runs(window: bytes, mask_table: bytes) -> Iterator[bytes]:
    """Runs of at least RUN_LEAST letters of the mask's alphabet, line breaks in them taken out:
    base64 or hex wrapped at any width (`base64 -w 20`, `xxd -p`: 60 columns) is one run. (A run
    had to begin with RUN_LEAST letters on one line, and hex was never joined across lines:
    `gzip | xxd -p` of a credential, or `bzip2 | xxd -p`, was not read.)"""
    mask, least = window.translate(mask_table), b"\1" * RUN_LEAST
    pos = 0
    while (start := mask.find(least, pos)) >= 0:
        end = mask.find(b"\0", start)
        end = len(window) if end < 0 else end
        if len(run := window[start:end].translate(None, b"\r\n")) >= RUN_LEAST:
            yield run
        pos = end


def runs_of_base64(window: bytes) -> Iterator[bytes]:
    """Runs of at least RUN_LEAST base64 letters (either alphabet), wrapped lines joined."""
    return _runs(window, _B64_LINES_MASK)


def _decoded(window: bytes, raw: bool) -> Iterator[bytes]:
    if raw:
        yield window
    for run in _runs(window, _HEX_LINES_MASK):
        if _HEX_SIGS.search(run):
            for k in (0, 1):
                with contextlib.suppress(ValueError):
                    yield binascii.unhexlify(run[k:k + (len(run) - k) // 2 * 2])
    for run in _runs(window, _B64_LINES_MASK):
        if not _SIGS.search(run):
            continue
        run = run.translate(_URLSAFE)
        for k in range(4):
            with contextlib.suppress(binascii.Error, ValueError):
                yield binascii.a2b_base64(run[k:k + (len(run) - k) // 4 * 4])


def _runs_decoded(window: bytes, raw: bool) -> Iterator[bytes]:
    """The window itself (`raw`) and each run of hex or base64 letters in it (wrapped lines
    joined), decoded from its first letter."""
    if raw:
        yield window
    for run in _runs(window, _HEX_LINES_MASK):
        with contextlib.suppress(ValueError):
            yield binascii.unhexlify(run[:len(run) // 2 * 2])
    for run in _runs(window, _B64_LINES_MASK):
        with contextlib.suppress(binascii.Error, ValueError):
            yield binascii.a2b_base64(run.translate(_URLSAFE)[:len(run) // 4 * 4])


def _inflate(data: memoryview, make: unpack.Maker, needles: list[bytes], overlap: int, name: str) -> bytes:
    """unpack's window over `data`, in slices of it, uncopied: a window holding many streams (a git
    pack, a PDF) had its whole rest copied for each one, quadratic (4 s for one 4 MiB window)."""
    found = unpack.stream((data[i:i + (1 << 16)] for i in range(0, len(data), 1 << 16)),
                          make, needles, overlap, name)
    return found if found and matcher(needles).found(found) else b""
