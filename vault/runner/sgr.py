"""What an SGR sequence (CSI ... m) leaves hidden: text a terminal draws but a person cannot see.

Concealed text (SGR 8, until 28 or a reset) shows as blanks, and so does text whose foreground and
background are set to the same colour (`ESC[30;40m`, `ESC[38;5;0;48;5;0m`, `ESC[38;2;9;9;9;48;2;9;9;9m`):
drawn, but in the colour it is drawn on. Only colours set explicitly are compared, by palette index
(30-37 and 90-97 are indices 0-15, as 38;5;N names them) or by 24-bit value: a colour left at the
terminal's default, or an index against an RGB value, is unknown and hides nothing.
"""

from __future__ import annotations

from typing import NamedTuple

from vault.runner.csi_param import number

Colour = tuple[int, ...] | None  # (index,) or (r, g, b); None: the terminal's default


class Pen(NamedTuple):
    concealed: bool = False
    fg: Colour = None
    bg: Colour = None

    @property
    def hidden(self) -> bool:
        return self.concealed or (self.fg is not None and self.fg == self.bg)


def _colour(ps: list[str], i: int) -> tuple[Colour, int]:
    """The extended colour whose `38`/`48` is at ps[i]: the colour and the index past it."""
    kind = ps[i + 1] if i + 1 < len(ps) else ""
    if kind == "5":
        n = ps[i + 2] if i + 2 < len(ps) else ""
        return ((number(n),) if n.isdigit() else None), i + 3
    if kind == "2":
        rgb = ps[i + 2:i + 5]
        if len(rgb) == 3 and all(c.isdigit() for c in rgb):
            return (number(rgb[0]), number(rgb[1]), number(rgb[2])), i + 5
        return None, i + 5
    return None, i + 2


def after(params: str, pen: Pen) -> Pen:
    """The pen after SGR `params` (`;`-separated; a colour's `:` sub-parameters, as in
    `38:2::R:G:B`, read as its own: the empty colour-space id dropped)."""
    ps: list[str] = []
    for p in params.split(";"):
        if ":" in p:
            sub = p.split(":")
            if len(sub) > 5 and sub[1] == "2":  # 38:2:CS:R:G:B, the colour space id before R
                sub = sub[:2] + sub[3:]
            ps.extend(sub)
        else:
            ps.append(p)
    concealed, fg, bg = pen
    i = 0
    while i < len(ps):
        p = ps[i]
        if p in ("38", "48"):
            c, i = _colour(ps, i)
            if p == "38":
                fg = c
            else:
                bg = c
            continue
        if p == "58":  # an underline's colour: skipped, nothing hidden by it
            i = _colour(ps, i)[1]
            continue
        n = number(p) if p.isdigit() else 0 if p == "" else -1
        if n == 0:
            concealed, fg, bg = False, None, None
        elif n == 8:
            concealed = True
        elif n == 28:
            concealed = False
        elif 30 <= n <= 37 or 90 <= n <= 97:
            fg = (n - 30,) if n < 90 else (n - 82,)
        elif n == 39:
            fg = None
        elif 40 <= n <= 47 or 100 <= n <= 107:
            bg = (n - 40,) if n < 100 else (n - 92,)
        elif n == 49:
            bg = None
        i += 1
    return Pen(concealed, fg, bg)
