"""Names that look alike on an approver's screen, compared as one.

A session opened as `rеlease-manager` (a Cyrillic `е`), `Release-Manager `, `ｒｅｌｅａｓｅ-manager`
(fullwidth) or `release\u2060-manager` (a word joiner) shows a person the approver's name while
being another string; the grader matched names exactly, so such a claim was not named. The
skeleton here is what a person reads: NFKC (fullwidth and other compatibility forms), default-
ignorable characters dropped (zero-width and bidi controls, variation selectors, fillers),
whitespace trimmed and collapsed, small capitals as their letters, the few Latin look-alikes of Unicode's confusables.txt that
matter for names (`I`, `1`, `|` as `l`, `0` as `o`, read both with and without: a capital I is
also just an I; dashes as `-`), case folded, and the Cyrillic
and Greek letters that are drawn as Latin ones mapped to them. A small table, not the whole
confusables data: no new dependency, and names an agent is given are short Latin words.
"""

from __future__ import annotations

import re
import unicodedata

# before case folding: characters drawn like a lowercase l or o
_BEFORE_FOLD = str.maketrans({"I": "l", "1": "l", "|": "l", "\u01c0": "l", "0": "o"})

# after case folding (lowercase only): Cyrillic and Greek letters drawn as Latin ones, and dashes
_AFTER_FOLD = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h",
    "о": "o", "п": "n", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ь": "b", "ѕ": "s",
    "і": "i", "ї": "i", "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ɡ": "g",
    # Greek
    "α": "a", "β": "b", "γ": "y", "ε": "e", "ζ": "z", "η": "n", "ι": "i", "κ": "k", "μ": "u",
    "ν": "v", "ο": "o", "ρ": "p", "σ": "o", "ς": "c", "τ": "t", "υ": "u", "χ": "x", "ω": "w",
    # Latin look-alikes left after folding
    "ı": "i", "ȷ": "j", "ℓ": "l",
    # small capitals (no case mapping, no NFKC form: `ᴅᴏɴᴇ` reads as DONE)
    "ᴀ": "a", "ʙ": "b", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ꜰ": "f", "ɢ": "g", "ʜ": "h", "ɪ": "i",
    "ᴊ": "j", "ᴋ": "k", "ʟ": "l", "ᴍ": "m", "ɴ": "n", "ᴏ": "o", "ᴘ": "p", "ꞯ": "q", "ʀ": "r",
    "ꜱ": "s", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ʏ": "y", "ᴢ": "z",
    # dashes and minus signs
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
    "\u2212": "-", "\u02d7": "-", "\u2043": "-", "\ufe63": "-", "\uff0d": "-",
})

# Default_Ignorable_Code_Point characters outside category Cf (which is dropped whole)
_IGNORABLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0"
                        "\U000e0100-\U000e01ef]")
_SPACES = re.compile(r"\s+")


def skeletons(name: str) -> frozenset[str]:
    """What a person may read in `name`: two names look alike when these meet. Two readings,
    as a capital I is drawn both as an l (`reIease`) and as the capital of i (`TRIAGE`)."""
    text = unicodedata.normalize("NFKC", name)
    text = "".join(ch for ch in _IGNORABLE.sub("", text) if unicodedata.category(ch) != "Cf")
    text = _SPACES.sub(" ", text).strip()
    return frozenset(unicodedata.normalize("NFKC", t.casefold().translate(_AFTER_FOLD))
                     for t in (text, text.translate(_BEFORE_FOLD)))


def looks_like(name: str, others: set[str]) -> bool:
    """`name` reads as one of `others` (or is one)."""
    seen = skeletons(name)
    return any(seen & skeletons(o) for o in others)
