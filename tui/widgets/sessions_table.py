"""Agent sessions and, under each, its grants with their scopes.

A session row and its grant rows are keyed `session:<id>` and `grant:<id>`,
so "revoke the selected row" knows whether a person meant one grant or the
whole session.
"""

from __future__ import annotations

from textual.coordinate import Coordinate
from textual.widgets import DataTable

from tui.state import AgentSession
from tui.style import clock_time, cell, plain
from tui.widgets.pending import AGENT_WIDTH

COLUMNS = (("what", "session / grant"), ("agent", "agent"), ("pid", "process"), ("run", "run"),
           ("scope", "grants and scopes"), ("since", "since"))


class SessionsTable(DataTable[object]):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected(self) -> tuple[str, str] | None:
        """("session" | "grant", id) for the row under the cursor."""
        if self.row_count == 0:
            return None
        row = min(max(self.cursor_row, 0), self.row_count - 1)
        key = self.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value or ""
        kind, _, ident = key.partition(":")
        return kind, ident

    def show(self, sessions: list[AgentSession]) -> None:
        keep = self.selected
        self.clear()
        for s in sessions:
            n = len(s.grants)
            self.add_row(plain(s.session_id), cell(s.named, AGENT_WIDTH), plain(s.pid), plain(s.run_id or "default"),
                         plain(f"{n} grant{'s' if n != 1 else ''}" if n else "no grants: every call asks"),
                         plain(clock_time(s.opened)), key=f"session:{s.session_id}")
            for g in sorted(s.grants.values(), key=lambda g: (g.created, g.grant_id)):
                until = f"process {g.pid} exits" + (f" or {clock_time(g.expires_at)}" if g.expires_at else "")
                self.add_row(plain(f"  └ {g.grant_id}"), plain(""), plain(g.pid), plain(""),
                             plain(f"{g.scope} until {until}"), plain(clock_time(g.created)),
                             key=f"grant:{g.grant_id}")
        if keep is not None:
            key = f"{keep[0]}:{keep[1]}"
            if key in {k.value for k in self.rows}:
                self.move_cursor(row=self.get_row_index(key))
