"""The sessions view: each agent session, its process, its grants and their scopes.

`r` revokes what is selected (one grant, or every grant of a session when the
session row is selected); `x` revokes the whole session of the selected row.
Revoking ends grants only: the agent keeps its session and is simply asked
again next time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Label

from tui.widgets.sessions_table import SessionsTable
from tui.widgets.status import StatusBar

if TYPE_CHECKING:
    from tui.app import VaultApp


class SessionsScreen(Screen[None]):
    BINDINGS = [
        Binding("r", "revoke", "revoke"),
        Binding("x", "revoke_session", "revoke session"),
        Binding("escape", "app.pop_screen", "back"),
    ]

    @property
    def vapp(self) -> "VaultApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield Label("Agent sessions and their grants (a grant lasts until its process exits, "
                    "a lock, a revoke or its TTL)", classes="title")
        yield SessionsTable(id="sessions")
        yield Footer(show_command_palette=False)  # every key visible at 80 columns

    def on_mount(self) -> None:
        self.query_one(SessionsTable).focus()
        self.watch(self.app, "revision", self.sync)

    def sync(self) -> None:
        state = self.vapp.state
        self.query_one(StatusBar).show(state)
        self.query_one(SessionsTable).show(state.sessions_sorted())

    def _session_of_selection(self) -> str | None:
        sel = self.query_one(SessionsTable).selected
        if sel is None:
            return None
        kind, ident = sel
        if kind == "session":
            return ident
        for s in self.vapp.state.sessions.values():
            if ident in s.grants:
                return s.session_id
        return None

    def action_revoke(self) -> None:
        sel = self.query_one(SessionsTable).selected
        if sel is None:
            return
        kind, ident = sel
        if kind == "grant":
            self.vapp.request("revoke", grant_id=ident)
        else:
            self.vapp.request("revoke", session_id=ident)

    def action_revoke_session(self) -> None:
        sid = self._session_of_selection()
        if sid:
            self.vapp.request("revoke", session_id=sid)
