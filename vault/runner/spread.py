"""The leak scan of a credential spread out: its characters with others between them.

Why: the needles are a credential's forms written whole, and its 12-character fragments. Written
with something between its characters (`od -c`, four columns a character; a list of its characters,
`['v', 's', ...]`; `-`.join; wrapped at 8 columns, `fold -w 8`) no fragment is whole, and such a
leak passed. Here a window's letters and digits are read alone (all else dropped, one `translate`;
then escapes too, `\\u00e9` or `%C3%A9` between them, and a dump's line offsets, as `od -c` puts one
every 16 characters) and searched for a credential's letters and digits in pieces of TILE, cut end
to end (`tiles`, needles of vault.runner.bypass.leak_needles: 2 * TILE - 1 of them in order always
hold one piece). Few needles, so a pass over the window costs little; 16 random letters and digits
are ~95 bits, never matched by chance.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vault.runner.needle_scan import matcher

TILE = 16  # letters and digits a spread needle holds (hit searches every alphanumeric needle this long)
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
    for gate, pattern in _READINGS:
        if gate(window):
            bare = pattern.sub(b"", window).translate(None, _DROP)
            if found(bare):
                return bare
    return b""


# what else stands between its characters, dropped whole as its letters would read wrong:
# escapes (`\u00e9`, `%C3%A9`, `\xe9`: a JSON string, a URL, a log of one joined by `é`), and a
# dump's offsets at a line's start (`od -c` puts one every 16 characters)
_READINGS: list[tuple[Callable[[bytes], bool], re.Pattern[bytes]]] = [
    (lambda w: b"\\u" in w or b"%" in w or b"\\x" in w,
     re.compile(rb"\\u[0-9a-fA-F]{4}|%[0-9a-fA-F]{2}|\\x[0-9a-fA-F]{2}")),
    (lambda w: b"\n0" in w or w.startswith(b"0"), re.compile(rb"^[0-9a-fA-F]{6,8}:?(?=[ \t])", re.M)),
]
