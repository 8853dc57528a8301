"""Shared presentation rules: risk colours and time formats, so every widget agrees."""

from __future__ import annotations

import time

from rich.text import Text

from vault.text import shown

# colour by risk class: reads are calm, writes draw the eye, anything
# destructive or privileged is loud
RISK_STYLE = {
    "read": "green",
    "create": "cyan",
    "update": "yellow",
    "delete": "bold red",
    "execute": "bold magenta",
    "spend": "bold white on red",
    "permission": "bold white on red",
    "credential": "bold white on red",
}

ACTIVITY_STYLE = {"result": "", "decision": "cyan", "gate": "yellow", "demo": "magenta"}

# a `!` line, and a row cell, that something the agent chose could mislead
DOUBT_STYLE = "bold black on yellow"

# below this many seconds the countdown turns red
URGENT_S = 20


def risk_text(risk: str) -> Text:
    return Text(shown(risk), style=RISK_STYLE.get(risk, "bold"))


def countdown(seconds: float) -> Text:
    s = int(seconds)
    text = f"{s // 60}:{s % 60:02d}"
    return Text(text, style="bold red" if s < URGENT_S else "")


def clock_time(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def cell(value: str, width: int) -> Text:
    """An agent-chosen string for a table cell of at most `width` characters, escaped; cut with a
    `…` so that a long name (a claim, spaces drawn as more cells) cannot push the operation and
    risk columns off the screen. The detail pane shows it whole."""
    text = shown(value)
    return Text(text if len(text) <= width else text[:width - 1] + "…")


def plain(value: object) -> Text:
    """Agent-controlled strings are shown as text, never parsed as markup, and escaped
    (`vault.text.shown`; the link escapes them on arrival too: the state may be fed otherwise)."""
    return Text(shown(value) if isinstance(value, str) else str(value))
