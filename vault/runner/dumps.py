"""The leak scan of hex dumps: `od -An -tx1`, `od -tx1`, `od -x`, `xxd`, `xxd -p`, `xxd -g1`,
`hexdump -C`, `hexdump`: a credential's bytes written as hex groups, line after line, with or
without offsets and an ASCII column; and their decimal and octal kin (`od -tu1`, `od -b`).

Why: the needles hold a credential's hex joined and singly spaced; a dump breaks it into lines
(16 bytes each), puts an offset before each line and an ASCII column after it (in pieces of 16,
longer than a fragment: xxd's and hexdump -C's columns were found; `od -An -tx1`, `xxd -p` and
`od -x` were not). Here each run of dump lines is decoded back to bytes (each line's offset and
ASCII column left out; words also read byte-swapped, as `od -x` and `hexdump` print them
little-endian) and those bytes are searched, then searched for a compressed stream (`gzip | xxd`).
Only lines holding a run of GATE_LEAST hex letters, spaces and colons are parsed, and the bytes
parsed count against the trial's budget for them (unpack.DUMPS_MOST; past it, named as cut).
"""

from __future__ import annotations

import binascii
import re

from vault.runner import packed, unpack
from vault.runner.needle_scan import matcher

GATE_LEAST = 24  # hex letters, blanks and colons in a row: a dump line's hex part is longer (8 bytes: 23)
CARRY_LINES = 16  # lines carried into the next window: a dump cut by a window's end is read whole
CARRY_MOST = 4096
_GATE_MASK = bytes(1 if b in b"0123456789abcdefABCDEF \t:" else 0 for b in range(256))
_RUN = b"\1" * GATE_LEAST
_NUMBERS = re.compile(rb"[ \t]*(?:[0-9a-fA-F]{6,8}:?[ \t]+)?(\d{1,3}(?:[ \t]+\d{1,3})*)[ \t]*")
# an offset (xxd's ends in a colon), then hex groups one or two blanks apart
_LINE = re.compile(rb"[ \t]*(?:([0-9A-Fa-f]+)(:?)[ \t]+)?([0-9A-Fa-f]+(?:[ \t]{1,2}[0-9A-Fa-f]+)*)")
def hit(window: bytes, needles: list[bytes], name: str) -> bytes:
    """The decoded bytes of a hex dump in `window` that hold one of `needles` (b"" when none do)."""
    if not needles or len(window) < GATE_LEAST:
        return b""
    mask = window.translate(_GATE_MASK)  # one pass in C (a regex's was 30 ms a 4 MiB of random bytes)
    if _RUN not in mask:
        return b""
    found = matcher(needles).found
    for block in _blocks(window, mask):
        if not unpack.parse_dump(len(block)):
            unpack.note_cut(name)
            return b""
        for data in _decoded(block):
            if found(data):
                return data
            if len(data) >= packed.RUN_LEAST and (inner := packed.hit(data, needles, name)):
                return inner
    return b""


def carry(window: bytes) -> int:
    """Where the window's last CARRY_LINES lines begin (at most CARRY_MOST back)."""
    lo, pos = max(0, len(window) - CARRY_MOST), len(window)
    for _ in range(CARRY_LINES):
        pos = window.rfind(b"\n", lo, pos)
        if pos < 0:
            return lo
    return pos + 1


def _blocks(window: bytes, mask: bytes) -> list[bytes]:
    """Runs of consecutive lines each holding a gate run, and the lines after them that parse as
    dump lines (a dump's last, short line)."""
    spans: list[list[int]] = []
    pos = 0
    while (at := mask.find(_RUN, pos)) >= 0:
        start = window.rfind(b"\n", 0, at) + 1
        end = window.find(b"\n", at)
        end = len(window) if end < 0 else end
        pos = end + 1
        if spans and start <= spans[-1][1] + 1:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    out: list[bytes] = []
    done = -1  # where the last block ended: a span it grew over is not read again
    for start, end in spans:
        if end <= done:
            continue
        start = max(start, done + 1)
        while end < len(window):  # a dump's short last line (and od's `*`)
            nxt = window.find(b"\n", end + 1)
            nxt = len(window) if nxt < 0 else nxt
            if not _groups(window[end + 1:nxt]):
                break
            end = nxt
        out.append(window[start:end])
        done = end
    return out


def _groups(line: bytes) -> list[bytes]:
    """A dump line's hex groups, its offset and ASCII column left out ([] when it is none)."""
    m = _LINE.match(line)
    if m is None:
        return [b""] if line.lstrip()[:1] == b"*" else []  # `*`: od's "the line before, repeated"
    off, colon, part = m.groups()
    tokens = part.split()
    if off is not None and not colon and (len(off) < 6 or len(off) == len(tokens[0])):
        tokens.insert(0, off)  # a group, not od's (7 digits) or hexdump's (7 or 8) offset
    width = len(tokens[0])
    if width % 2:
        return []
    lens = list(map(len, tokens))
    n = next((i for i, k in enumerate(lens) if k != width), len(tokens))
    out = tokens[:n]
    if n < len(tokens) and lens[n] < width and not lens[n] % 2 and n == len(tokens) - 1 \
            and not part.endswith(b"  " + tokens[n]):
        out.append(tokens[n])  # a short last group, one blank after the one before (not an ASCII column)
    return out


def _decoded(block: bytes) -> list[bytes]:
    """The block's bytes as written, with each group of 2, 4 or 8 bytes reversed (`od -x`), and
    read as decimal or octal bytes (`od -An -tu1`, `od -b`)."""
    lines = [line.rstrip(b"\r") for line in block.split(b"\n")]
    out = _numeric(lines)
    groups = [g for line in lines for g in _groups(line)]
    try:
        plain = binascii.unhexlify(b"".join(groups))
    except (binascii.Error, ValueError):
        return out
    if not any(len(g) in (4, 8, 16) for g in groups):
        return [plain, *out]
    swapped = b"".join(binascii.unhexlify(g)[::-1] for g in groups)
    return [plain, swapped, *out]


def _numeric(lines: list[bytes]) -> list[bytes]:
    """The bytes of lines of numbers of one to three digits (an offset of six to eight before
    them left out), as decimal and as octal where each fits in a byte."""
    nums: list[bytes] = []
    for line in lines:
        if (m := _NUMBERS.fullmatch(line)) is not None:
            nums += m.group(1).split()
    if len(nums) < 8:
        return []
    out = []
    values = list(map(int, nums))
    if max(values) <= 255:
        out.append(bytes(values))
    if not b"".join(nums).strip(b"01234567"):
        octal = [int(n, 8) for n in nums]
        if max(octal) <= 255:
            out.append(bytes(octal))
    return out
