"""The leak scan of a credential spread out: its characters with others between them.

Why: the needles are a credential's forms written whole, and its 12-character fragments. Written
with something between its characters (`od -c`, four columns a character; a list of its characters,
`['v', 's', ...]`; `-`.join; wrapped at 8 columns, `fold -w 8`) no fragment is whole, and such a
leak passed. Here a window's letters and digits are read alone (all else dropped, one `translate`;
a dump's line offsets too, which `od -c` puts every 16 characters)
and searched for a credential's letters and digits in pieces of TILE, cut end to end
(bypass.spread_needles: so 2 * TILE - 1 of them in order always hold one piece). Few needles, so
one pass over the window costs little; 16 random letters and digits are ~95 bits, never by chance.
"""

from __future__ import annotations

import re

from vault.runner.needle_scan import matcher

_OFFSET = re.compile(rb"^[0-9a-fA-F]{6,8}:?(?=[ \t])", re.M)  # od's, hexdump's and xxd's, at a line's start
TILE = 16  # letters and digits a spread needle holds: no other needle is alphanumeric at that length
_DROP = bytes(b for b in range(256) if not (0x30 <= b <= 0x39 or 0x41 <= b <= 0x5a or 0x61 <= b <= 0x7a))


def tiles(value: str) -> list[bytes]:
    """A one-line credential's letters and digits, cut end to end into pieces of TILE."""
    bare = value.encode("ascii", "ignore").translate(None, _DROP)
    return [bare[i:i + TILE] for i in range(0, len(bare) - TILE + 1, TILE)]


def hit(window: bytes, needles: list[bytes]) -> bytes:
    """The window's letters and digits alone, when they hold a spread needle (b"" when none do)."""
    mine = [n for n in needles if len(n) == TILE and n.isalnum()]
    if not mine or len(window) < TILE:
        return b""
    bare = window.translate(None, _DROP)
    if len(bare) == len(window):  # nothing was between them: the ordinary scan read it as it is
        return b""
    found = matcher(mine).found
    if found(bare):
        return bare
    if b"\n0" in window or window.startswith(b"0"):  # a dump's offsets (`od -c`) cut it every 16 characters
        bare = _OFFSET.sub(b"", window).translate(None, _DROP)
        return bare if found(bare) else b""
    return b""
