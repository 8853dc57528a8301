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


def test_stats_lines_are_printable() -> None:
    """`vaultsim stats` prints scopes, which hold what an agent passed as parameters."""
    from vault.cli.approver import format_stats
    report = {"runs": {"run\x1b[2J": {"prompts": 1, "read_prompts": 0, "repeated_scope_prompts": 0,
                                       "destructive_session_grants": 0, "unroutable": 0,
                                       "scopes_asked": {"deploy to \u202eprod": 1}, "scopes_granted": {},
                                       "decisions": {}}}}
    text = format_stats(report)
    assert all(line.isprintable() for line in text.splitlines())
    assert "run\\x1b[2J" in text and "deploy to \\u202eprod" in text


def test_demo_narrates_an_agents_final_line_printable(tmp_path) -> None:
    """The demo quotes each agent's last stdout line in the activity pane."""
    from tui.demo import DemoWorld
    world = DemoWorld(parent=str(tmp_path))
    (world.root / "a.out").write_text("step\n\x1b[2Jdone " + "x" * 200 + "\n")
    line = world.final_line("a")
    assert line.startswith("\\x1b[2Jdone ") and line.endswith("...") and len(line) == 120
    world.close()
