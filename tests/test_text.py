"""Agent-chosen text shown to people: printable, never terminal control."""

from __future__ import annotations

import pytest

from vault.text import printable


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain words, ünïcode, 漢字", "plain words, ünïcode, 漢字"),
    ("\x1b[2Jclear", "\\x1b[2Jclear"),
    ("line\nbreak\rreturn\ttab", "line\\nbreak\\rreturn\\ttab"),
    ("abc\u202edef", "abc\\u202edef"),
    ("c1\x9bcsi", "c1\\x9bcsi"),
])
def test_printable(raw: str, shown: str) -> None:
    assert shown == printable(raw)
    assert printable(shown) == shown  # already shown: unchanged
    assert printable(shown).isprintable()


def test_limit() -> None:
    assert "abcdefg" == printable("abcdefg", 7)
    assert "abcd..." == printable("abcdefgh", 7)
