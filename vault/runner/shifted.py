"""The leak scan of a credential in a Caesar cipher: each letter moved k places (1 to 25, case kept,
digits and `_`, `-` as they are).

Why: rot13 is a needle (vault.runner.bypass.leak_needles), the 24 other shifts were not, and a
needle each would be 24 more passes over every window. Instead a window's runs of at least
RUN_LEAST letters, digits, `_` and `-` (a credential shifted is one; prose and most text have next
to none that long) are read by their letters and digits alone and by their shape, every lower-case
letter as `a`, every capital as `A`, digits kept (one `translate`): a credential's piece of TILE
letters and digits (vault.runner.spread.tiles) has the shape of each of its shifts, and a place
with that shape is a hit when its letters are one of them (checked exactly). 16 random letters and
digits shifted are matched by no chance. Past RUNS_MOST runs (lines of base64) the window's rest
is read whole; past HITS_MOST places of a piece's shape (one all lower case) its shifts are
searched whole. A long text's shape of few kinds of byte (the rest of a window of many runs of one
letter) is searched only in the parts where 8 bytes of a piece's shape are, for those pieces alone
(vault.runner.needle_grams: exact): a window of lines of one letter has one shape throughout, and
each piece's search of it took ~20 ms per 4 MiB.
"""

from __future__ import annotations

import functools
import string

from vault.runner import needle_grams

TILE = 16  # vault.runner.spread.TILE
RUN_LEAST = 2 * TILE  # a run shorter than two pieces is no whole credential of the trial's
RUNS_MOST = 256
HITS_MOST = 64
GRAMS_LEAST = 1 << 16  # a text this long is searched in the parts its pieces' shapes' grams point at,
FEW_SHAPES = 3  # when a sample of its shape holds this few kinds of byte (lines of one letter: `a`, `\n`)
SAMPLE_STEP = 4099

_LETTERS = (string.ascii_lowercase + string.ascii_uppercase).encode()
_SHAPE = bytes.maketrans(_LETTERS, b"a" * 26 + b"A" * 26)
_TOKEN = bytes(1 if b in _LETTERS + string.digits.encode() + b"_-" else 0 for b in range(256))
_DROP = b"_-"


def _shift(k: int) -> bytes:
    lo, up = string.ascii_lowercase, string.ascii_uppercase
    return bytes.maketrans(_LETTERS, (lo[k:] + lo[:k] + up[k:] + up[:k]).encode())


_BY = [_shift(k) for k in range(26)]


@functools.lru_cache(maxsize=32)
def _pieces(tiles: tuple[bytes, ...]) -> list[tuple[bytes, dict[bytes, int]]]:
    """Each piece's shape and its 25 shifts (each to its k)."""
    return [(t.translate(_SHAPE), {t.translate(_BY[k]): k for k in range(1, 26)}) for t in tiles]


def hit(window: bytes, tiles: list[bytes]) -> bytes:
    """A run of `window` (its letters and digits) shifted back, when it holds a piece of `tiles`
    shifted; b"" when none does."""
    pieces = _pieces(tuple(t for t in tiles if t.isalnum()))
    if not pieces:
        return b""
    mask, least = window.translate(_TOKEN), b"\1" * RUN_LEAST
    pos, runs = 0, 0
    while (start := mask.find(least, pos)) >= 0:
        runs += 1
        if runs > RUNS_MOST:  # many runs: the rest read whole
            return _back(window[start:].translate(None, _DROP), pieces)
        end = mask.find(b"\0", start + RUN_LEAST)
        end = len(window) if end < 0 else end
        if found := _back(window[start:end].translate(None, _DROP), pieces):
            return found
        pos = end
    return b""


@functools.lru_cache(maxsize=32)
def _shape_grams(keys: tuple[bytes, ...]) -> tuple[frozenset[int], dict[int, list[int]]]:
    """The grams of the pieces' shapes, and which pieces hold each."""
    owners: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        for g in needle_grams.grams([key]):
            owners.setdefault(g, []).append(i)
    return frozenset(owners), owners


def _back(text: bytes, pieces: list[tuple[bytes, dict[bytes, int]]]) -> bytes:
    """`text` shifted back when it holds one of `pieces` shifted, else b"". (`text` is letters
    and digits, and what else the window has past RUNS_MOST runs: its shape keeps that as it is.)"""
    shape = text.translate(_SHAPE)
    if len(text) < GRAMS_LEAST or len(set(shape[::SAMPLE_STEP])) > FEW_SHAPES:
        # a shape of many kinds (base64's a, A, 0 and `+/`) holds some piece's 8 by chance in every part
        return _back_in(text, shape, pieces)
    table, owners = _shape_grams(tuple(key for key, _ in pieces))  # a piece (TILE) is longer than GRAM_LEAST
    for start, end in needle_grams.suspects(shape, table):
        # only the pieces whose shape's grams are there (a piece with eight small letters in a row
        # has the shape of any run of one letter: the others were searched there for nothing)
        there = sorted({i for g in needle_grams.grams_in(shape, start, end, table) for i in owners[g]})
        lo, hi = max(0, start - TILE), end + TILE
        if found := _back_in(text[lo:hi], shape[lo:hi], [pieces[i] for i in there]):
            return found
    return b""


def _back_in(text: bytes, shape: bytes, pieces: list[tuple[bytes, dict[bytes, int]]]) -> bytes:
    for key, forms in pieces:
        pos, hits, size = 0, 0, len(key)
        while (at := shape.find(key, pos)) >= 0:
            hits += 1
            if hits > HITS_MOST:  # many places of its shape: each shift searched whole
                rest = text[at:]
                k = next((k for f, k in forms.items() if f in rest), None)
                if k is not None:
                    return text.translate(_BY[26 - k])
                break
            if (k := forms.get(text[at:at + size])) is not None:
                return text.translate(_BY[26 - k])
            pos = at + 1
    return b""
