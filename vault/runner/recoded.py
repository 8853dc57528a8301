"""The leak scan of a credential encoded twice, or as HTML writes it: base64 read decoded, and
HTML character references read as the characters they stand for.

Why: the needles are a credential's forms written once (vault.runner.bypass.leak_needles). Its
base64 encoded again (`base64 | base64`), the base64 of it reversed, or of its UTF-16 (PowerShell's
`-EncodedCommand`, `[Convert]::ToBase64String([Text.Encoding]::Unicode...)`, with a byte order mark
or not) held none of them; nor did `&#115;&#107;...`, `&#x73;...` or `&lowbar;`. Each passed. A
window's runs of base64 letters (line breaks in them taken out) are decoded here at each of the
four alignments their first letter can have, and what decodes mostly to text (its first PROBE
letters tell: a wrong alignment or a binary blob decodes to noise, not read further) is read
against every needle, then decoded again, up to DEPTH times; a run of TILE or more references in a
row is read with them replaced. Each byte so read counts against the trial's budget
(unpack.recode): past it, named, not graded.
"""

from __future__ import annotations

import binascii
import contextlib
import html.entities
import re
from collections.abc import Callable

from vault.runner import packed, unpack
from vault.runner.needle_scan import matcher

RUN_LEAST = packed.RUN_LEAST  # base64 letters: 24 bytes decoded, less than any credential's form encoded again
PROBE = 64  # letters decoded first at each alignment: only one that decodes to text is decoded whole
DEPTH = 3  # base64 of base64 of base64 of it is read; one more layer is not
TILE = 16  # references in a row read decoded (a credential written so has more)
_URLSAFE = bytes.maketrans(b"-_", b"+/")
# what text decodes to: printable ASCII, whitespace, and NUL (every other byte of UTF-16)
_TEXT = bytes(b for b in range(256) if 0x20 <= b < 0x7f or b in b"\0\t\n\r")
_REF = re.compile(rb"&(?:#([0-9]{1,7});?|#[xX]([0-9a-fA-F]{1,6});?|([A-Za-z][A-Za-z0-9]{1,31};))")
_Found = Callable[[bytes], bool]
_REFS = re.compile(rb"(?:&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?){%d,}" % TILE)
_NAMED = {k.encode(): v.encode("utf-8") for k, v in html.entities.html5.items() if k.endswith(";")}


def hit(window: bytes, needles: list[bytes], name: str) -> bytes:
    """What `window` decodes to (its base64, its HTML references) when that holds a needle; b"" when
    nothing does."""
    if not needles or len(window) < RUN_LEAST:
        return b""
    found = matcher(needles).found
    if found_ := _base64(window, found, name, DEPTH):
        return found_
    # references in a row (text has them one at a time; its letters and digits are numbers, named
    # or not): none to read. Binary data has no long runs of base64 letters, nor this.
    if window.count(b";&#") < TILE:
        return b""
    for m in _REFS.finditer(window):
        if not unpack.recode(m.end() - m.start()):
            unpack.note_cut(name)
            return b""
        if found(text := _REF.sub(_char, m.group(0))):
            return text
    return b""


def _base64(window: bytes, found: _Found, name: str, depth: int) -> bytes:
    for run in packed.runs_of_base64(window):
        if not unpack.recode(len(run)):
            unpack.note_cut(name)
            return b""
        run = run.translate(_URLSAFE)
        for k in range(4):
            with contextlib.suppress(binascii.Error, ValueError):
                if not _text(binascii.a2b_base64(_padded(run[k:k + PROBE]))):
                    continue  # noise: the wrong alignment, or a binary blob's base64 (its first letters tell)
                data = binascii.a2b_base64(_padded(run[k:]))
                if found(data):
                    return data
                if b"\n" in data and found(unwrapped := data.translate(None, b"\r\n")):
                    return unwrapped  # it wrapped (`base64` at 76 columns), then encoded again
                if depth > 1 and (deeper := _base64(data, found, name, depth - 1)):
                    return deeper
    return b""


def _text(data: bytes) -> bool:
    return len(data.translate(None, _TEXT)) * 4 <= len(data)


def _padded(run: bytes) -> bytes:
    """`run` with its last, partial group decodable: its padding (where the run ended) put back."""
    part = len(run) % 4
    return run[:-1] if part == 1 else run + b"=" * ((4 - part) % 4)


def _char(m: re.Match[bytes]) -> bytes:
    """The character a reference stands for (UTF-8), the reference itself if it stands for none."""
    dec, hex_, named = m.groups()
    if named is not None:
        return _NAMED.get(named, m.group(0))
    code = int(dec) if dec is not None else int(hex_, 16)
    try:
        return chr(code).encode("utf-8")
    except (ValueError, UnicodeEncodeError):  # past U+10FFFF, or a lone surrogate
        return m.group(0)

