"""The status line: connected or not, locked or not, which home, how much waits.

Locked and disconnected are the two states in which nothing an agent asks can
go through, so they get a loud style (CSS classes `-locked`, `-down`).
"""

from __future__ import annotations

from rich.text import Text

from vault.text import shown

from tui.state import TuiState
from tui.widgets.panel import TextPanel


class StatusBar(TextPanel):
    def show(self, state: TuiState) -> None:
        t = Text()
        if state.silent:
            t.append(" DAEMON NOT ANSWERING ", style="bold reverse")
            t.append(f" {shown(state.silent)}")
        elif not state.connected:
            t.append(" DISCONNECTED ", style="bold reverse")
            t.append(f" {shown(state.link_note)} (retrying)")
        elif state.locked:
            t.append(" LOCKED ", style="bold reverse")
            t.append(" every call is refused without a prompt; press l to unlock")
        else:
            t.append(" UNLOCKED ", style="bold reverse")
            n = len(state.pending)
            t.append(f" {n} pending" if n else " no pending requests")
            t.append(f" · {len(state.sessions)} sessions")
        if state.home:
            t.append(f"   home {shown(state.home)}", style="dim")
        self.set_class(not state.connected or bool(state.silent), "-down")
        self.set_class(state.connected and bool(state.locked), "-locked")
        self.set_text(t)
