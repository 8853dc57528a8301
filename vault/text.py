"""Text from outside (agents under test, remotes) made safe to show to a person.

An agent picks its own name, its parameters, its messages and what it prints;
shown raw, an escape sequence in any of them could rewrite the approver's
terminal or a CI log (move the cursor, repaint a verdict), and a bidi override
could make one request read as another. Every character that is not printable
(controls, format characters such as U+202E) is shown as its escape instead,
and so are combining marks that draw over their neighbours (overlays such as
U+0336, enclosing marks, stacks of more than two).

What is shown is also never cut silently: `clip` keeps both ends and says how
many characters it left out. `doubts` names what about a value could still
mislead a reader who sees it escaped (look-alike letters of another script,
compatibility forms such as fullwidth letters), and `forms` gives the folded
forms a rule must check so that such spellings cannot slip past it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# ESC and one or two bytes, which draw nothing: a character set chosen (ESC ( B: xterm's and
# terminfo's sgr0, what `tput sgr0` and curses-based colour libraries print to reset colour, is
# ESC ( B ESC [ m), the cursor saved or restored (ESC 7, ESC 8), keypad modes (ESC =, ESC >), a
# reset (ESC c). Not ESC and another letter: a lone ESC before a word leaves the word whole
SHORT_ESCAPES = r"\x1b[!-/]+[0-~]|\x1b[0-?c]"
# terminal colour and style sequences (CSI ... final byte; OSC, DCS, SOS, PM, APC ... BEL or ST; the
# short ones), also in their 8-bit C1 forms (U+009B CSI, U+009D OSC, U+0090 DCS, ... U+009C ST): not words
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
                      # (a string's text stops at ESC and any C1, so an unended one is scanned once)
                      r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x80-\x9f]*(?:\x07|\x1b\\|\x9c)|"
                      + SHORT_ESCAPES)
# how `clip` says it left characters out; `was_clipped` recognises it (an agent that writes
# it on purpose only makes its value look cut, which every reader treats more carefully)
_CUT = re.compile(r"…\[\d+ more chars\]…")
_MARKS_IN_A_ROW = 2  # a base letter with more than this many combining marks is shown escaped


def _escape(c: str) -> str:
    return repr(c)[1:-1] if not c.isprintable() else f"\\u{ord(c):04x}"


def _drawn_over(text: str) -> list[bool]:
    """For each character: a combining mark that paints over others (overlay, enclosing, stacked)."""
    out, run = [], 0
    for c in text:
        cat = unicodedata.category(c)
        if cat in ("Mn", "Me"):
            run += 1
            out.append(cat == "Me" or unicodedata.combining(c) == 1 or run > _MARKS_IN_A_ROW)
        else:
            run = 0
            out.append(False)
    return out


def _escaped(text: str) -> str:
    """`text` with every non-printable character and every mark drawn over others escaped."""
    if not text.isprintable() or any(_drawn_over(text)):
        text = "".join(_escape(c) if not c.isprintable() or over else c
                       for c, over in zip(text, _drawn_over(text)))
    return text


def printable(text: str, limit: int | None = None) -> str:
    """`text` escaped as `shown` escapes it (for reports and logs); cut at `limit`."""
    text = _escaped(text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def shown(value: Any, limit: int | None = None) -> str:
    """Anything an agent sent, as a person should see it: a string with every non-printable
    character and every combining mark that draws over its neighbours escaped (`\\u202e`,
    `\\n`, `\\u0336`); anything else as JSON (`true`, `12`). Over `limit`: `clip`ped."""
    text = _escaped(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))
    return clip(text, limit) if limit is not None else text


def quoted(value: Any) -> str:
    """`shown`, with a string in double quotes (a `"` inside escaped as `\\"`), so that a value
    cannot pass for a delimiter or another field (`note="x, env=staging"`) and `"true"` reads
    as text, `true` as a boolean."""
    if not isinstance(value, str):
        return shown(value)
    return '"' + shown(value).replace('"', '\\"') + '"'


def clip(text: str, limit: int) -> str:
    """`text` at most about `limit` characters: both ends kept, the middle replaced by
    `…[N more chars]…`, so a person sees that something was left out and how much."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(f"…[{len(text)} more chars]…"), 2)
    head, tail = text[: keep - keep // 3], text[len(text) - keep // 3:] if keep // 3 else ""
    return f"{head}…[{len(text) - len(head) - len(tail)} more chars]…{tail}"


def was_clipped(value: Any) -> bool:
    """Whether `value` holds `clip`'s mark: what is shown is not all there is."""
    return isinstance(value, str) and _CUT.search(value) is not None


def _script(c: str) -> str | None:
    """The script of a letter, from its Unicode name (LATIN, CYRILLIC, GREEK, ...)."""
    if not c.isalpha():
        return None
    try:
        return unicodedata.name(c).split(" ", 1)[0]
    except ValueError:
        return None


def mixed_scripts(text: str) -> list[str]:
    """The scripts mixed inside one word of `text` (`рrod`: CYRILLIC and LATIN), if any: a word
    spelled with look-alike letters of another script reads as one it is not."""
    for word in re.findall(r"\w+", unicodedata.normalize("NFKC", text)):
        scripts = {s for s in map(_script, word) if s is not None}
        if len(scripts) > 1:
            return sorted(scripts)
    return []


def doubts(value: Any) -> list[str]:
    """What about `value` could mislead a person reading it even escaped, in words ([] if nothing)."""
    if not isinstance(value, str):
        return []
    out = []
    hidden = sum(1 for c, over in zip(value, _drawn_over(value)) if not c.isprintable() or over)
    if hidden:
        out.append(f"{hidden} hidden or control character{'s' if hidden != 1 else ''} (shown escaped)")
    scripts = mixed_scripts(value)
    if scripts:
        out.append(f"look-alike letters: one word mixes {' and '.join(s.lower() for s in scripts)}")
    folded = unicodedata.normalize("NFKC", value)
    if folded != value and unicodedata.normalize("NFC", value) != folded:
        out.append(f"compatibility characters: reads as {quoted(folded)}")
    if value != value.strip() or re.search(r"\s\s", value):
        # unquoted (an agent's name in a header line), `release-manager ` reads as the approver's
        out.append(f"spaces at an end or doubled: it is {quoted(value)}")
    if was_clipped(value):
        out.append("cut short: the vault shows the ends of a long value, not all of it")
    return out


def forms(text: str) -> set[str]:
    """`text` and the folded forms a rule must also check: NFKC (fullwidth `ｐｒｏｄ` is
    `prod`), case-folded, and without combining marks and invisible format characters."""
    nfkc = unicodedata.normalize("NFKC", text)
    bare = "".join(c for c in unicodedata.normalize("NFKD", nfkc)
                   if unicodedata.category(c) not in ("Mn", "Me", "Cf"))
    return {text, nfkc, nfkc.casefold(), bare, bare.casefold()}


def without_escapes(text: str) -> str:
    """`text` without terminal colour and style sequences: what a person reading it sees."""
    return _ESCAPES.sub("", text) if _ESCAPE_START.search(text) else text


_ESCAPE_START = re.compile("[\x1b\x90\x98\x9b\x9d\x9e\x9f]")


def plural(n: int, word: str) -> str:
    """`n word` for a person: "1 prompt", "2 prompts", "0 prompts" (counts in human output; JSON
    keeps its numbers)."""
    return f"{n} {word}{'s' * (n != 1)}"
