"""A process's command line, short enough for one error line and still naming what ran.

Cut at its first 60 characters, a command named mostly its interpreter's path
(`/tmp/ci0/.venv/bin/python /work/…`): the script, the part that says which program
it was, was lost (neigh45). Here the program is named by its file's name and its first
argument (the script, for an interpreter) by the end of its path, then as many of the
other arguments as fit.
"""

from __future__ import annotations

import os

from vault.text import printable

LIMIT = 80


def command_name(command: str | list[str], limit: int = LIMIT) -> str:
    """`python …/neigh45_x.py scan` for `/tmp/ci0/.venv/bin/python /work/x/tests/agents/neigh45_x.py scan`:
    escaped (printable) and at most `limit` characters."""
    words = command.split() if isinstance(command, str) else [str(w) for w in command]
    if not words:
        return "?"
    head = [os.path.basename(words[0]) or words[0]]
    rest = words[1:]
    if rest:
        first = rest.pop(0)
        base = os.path.basename(first)
        head.append(f"…/{base}" if base and base != first and not first.startswith("-") else first)
    text = printable(" ".join(head), limit)
    for word in rest:
        word = printable(word)
        if len(text) + 1 + len(word) > limit:
            return printable(text + " …", limit)
        text += " " + word
    return text
