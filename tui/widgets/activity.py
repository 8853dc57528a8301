"""A live tail of what happened: requests, decisions, results, lock changes.

Built from `activity`, `approval.settled`, grant and lock notifications, which
carry operation names and result categories only: no parameters beyond the
approver summary, no credential, no result message.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from vault.text import shown

from tui.state import TuiState
from tui.style import ACTIVITY_STYLE, clock_time


class ActivityLog(RichLog):
    def __init__(self, **kw: object) -> None:
        super().__init__(wrap=True, min_width=20, markup=False, highlight=False, max_lines=500, **kw)  # type: ignore[arg-type]
        self._seen = 0

    def show(self, state: TuiState) -> None:
        new = state.activity_seq - self._seen
        if new <= 0:
            return
        for line in list(state.activity)[-min(new, len(state.activity)):]:
            t = Text(f"{clock_time(line.time)} ", style="dim")
            t.append(shown(line.text), style=ACTIVITY_STYLE.get(line.kind, ""))
            self.write(t)
        self._seen = state.activity_seq
