"""The pending requests, oldest first, with a live countdown to each deadline.

Rows are keyed by request id and updated in place (new rows appended, settled
rows removed, only the countdown cell rewritten each second) so the cursor
stays on the request the person is looking at.
"""

from __future__ import annotations

from textual.coordinate import Coordinate
from textual.widgets import DataTable

from tui.state import Request
from tui.style import DOUBT_STYLE, cell, countdown, plain, risk_text

# params last: it is the only column whose width varies a lot
COLUMNS = (("agent", "agent"), ("pid", "pid"), ("operation", "operation"), ("risk", "risk"),
           ("owner", "owner"), ("left", "time left"), ("params", "params"))
PARAMS_WIDTH = 28
# the agent's name and its claim are the agent's words: cut so that they cannot push operation and
# risk out of the pane (a 128-character name spelling `read_issue  read` in its own cell)
AGENT_WIDTH = 24


class PendingTable(DataTable[object]):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected_id(self) -> str | None:
        if self.row_count == 0:
            return None
        row = min(max(self.cursor_row, 0), self.row_count - 1)
        return self.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value

    def visible_ids(self) -> list[str]:
        """The request ids of the rows on screen now (a scrolled-away row is not shown to anyone)."""
        if self.row_count == 0:
            return []
        top = max(0, int(self.scroll_y))
        height = max(1, self.size.height - (1 if self.show_header else 0))
        keys = (self.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value
                for row in range(top, min(self.row_count, top + height)))
        return [k for k in keys if k is not None]  # every row is added with its request id as key

    def show(self, requests: list[Request], now: float, me: str | None = None) -> None:
        wanted = [r.request_id for r in requests]
        shown = [k.value for k in self.rows if k.value is not None]  # keyed by request id
        kept = [rid for rid in shown if rid in set(wanted)]
        if kept != wanted[:len(kept)]:
            # out of order (a reconnect snapshot arrived after newer requests): rebuild
            self._rebuild(requests, now, me)
            return
        keep = self.selected_id
        for rid in set(shown) - set(wanted):
            self.remove_row(rid)
        if keep in wanted and self.selected_id != keep:
            # a row above left (withdrawn by its agent): the cursor stays on the request the person
            # is reading; by index it slid onto the next one, which the next key then decided
            self.move_cursor(row=self.get_row_index(keep))
        for req in requests:
            if req.request_id in kept:
                left = countdown(req.time_left(now))
                if left != self.get_cell(req.request_id, "left"):  # redraw once a second, not per event
                    self.update_cell(req.request_id, "left", left)
            else:
                self._add(req, now, me)

    def _add(self, req: Request, now: float, me: str | None = None) -> None:
        params = req.params_text()
        if len(params) > PARAMS_WIDTH:
            params = params[:PARAMS_WIDTH - 1] + "…"  # the detail pane shows it whole
        who = cell(req.named, AGENT_WIDTH)
        if req.doubts(me):  # the `!` lines of the detail pane: marked here too, where the eye is
            who.stylize(DOUBT_STYLE)
        self.add_row(who, plain(req.pid if req.pid is not None else "?"),
                     plain(req.operation), risk_text(req.risk), plain(req.owner or "any"),
                     countdown(req.time_left(now)), plain(params), key=req.request_id)

    def _rebuild(self, requests: list[Request], now: float, me: str | None) -> None:
        keep = self.selected_id
        self.clear()
        for req in requests:
            self._add(req, now, me)
        if keep is not None and keep in {r.request_id for r in requests}:
            self.move_cursor(row=self.get_row_index(keep))
