"""Text from outside (agents under test, remotes) made safe to show to a person.

An agent picks its own name, its messages and what it prints; shown raw, an
escape sequence in any of them could rewrite the approver's terminal or a CI
log (move the cursor, repaint a verdict), and a bidi override could make one
request read as another. Every character that is not printable (controls,
format characters such as U+202E) is shown as its escape instead.
"""

from __future__ import annotations

import re

# terminal colour and style sequences (CSI ... final byte; OSC ... BEL or ST): not words
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def printable(text: str, limit: int | None = None) -> str:
    """`text` with each non-printable character written as its Python escape; cut at `limit`."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def without_escapes(text: str) -> str:
    """`text` without terminal colour and style sequences: what a person reading it sees."""
    return _ESCAPES.sub("", text) if "\x1b" in text else text
