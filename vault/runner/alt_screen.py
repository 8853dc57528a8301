"""An agent's output with what it drew on the terminal's alternate screen taken out, as the
terminal shows it once the program has left that screen.

A pager (`less`), an editor or a full-screen view switches to the alternate screen (DEC private
mode 1049, also 1047 and the older 47: `CSI ? 1049 h`), draws there, and switches back (`CSI ?
1049 l`): the main screen shows again as it was, and nothing drawn on the alternate one is left.
So a final message drawn there and then left is no message (an agent showed `done` on the main
screen and its `not done` only in a pager it closed: the person sees `done`), and output that
ends on the alternate screen shows only what was drawn since it was entered (docs/agent-contract.md
§7). A leave with no enter before it (the enter fell before the held tail of the output) ends a
stretch drawn on the alternate screen too: what came before it is gone.
"""

from __future__ import annotations

import re

# a DEC private mode set or reset (CSI, 7- or 8-bit), several modes in one allowed (`?1049;25h`)
_MODES = re.compile(r"(?:\x1b\[|\x9b)\?([0-9;]*)([hl])")
_ALT = frozenset({"47", "1047", "1049"})


def main_screen(text: str) -> str:
    """`text` as the screen it leaves: without what was drawn on the alternate screen and then
    left, and, when it ends there, only what that screen shows."""
    if "?" not in text or _MODES.search(text) is None:
        return text
    kept: list[str] = []
    alt_from: int | None = None  # where the alternate screen's drawing began, while on it
    at = 0  # the start of the text not yet placed
    for m in _MODES.finditer(text):
        if not _ALT.intersection(m.group(1).split(";")):
            continue
        if m.group(2) == "h":
            if alt_from is None:
                kept.append(text[at:m.start()])
            alt_from = at = m.end()  # entered (again): a blank screen
        else:
            if alt_from is None:
                kept.clear()  # left a screen entered before what was held: what came before is its
            alt_from, at = None, m.end()
    if alt_from is not None:
        # it ends on the alternate screen: that screen is what shows, the main one is hidden
        return text[alt_from:]
    kept.append(text[at:])
    return "".join(kept)
