"""The main screen: pending requests, the selected one in plain words, counters, activity.

`o`, `s`, `d` decide the selected request; `D` denies with a short reason,
which the agent receives in its Result. The screen tells the vault when a
row appears and when a request's detail is shown (`seen`), so the vault can
time each decision from the moment a person could read it. Whether `s` is shown at all comes
from the request itself (`allow_session_offered`): for a per_call operation
the binding is hidden and pressing `s` does nothing, so a session grant is
never even suggested for something the policy wants asked every time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label

from tui.look_first import LookFirst
from tui.state import Request
from tui.screens.deny_reason import DenyReason
from tui.widgets.activity import ActivityLog
from tui.widgets.counters import PromptCounters
from tui.widgets.detail import RequestDetail
from tui.widgets.pending import PendingTable
from tui.widgets.status import StatusBar

if TYPE_CHECKING:
    from tui.app import VaultApp


class MainScreen(Screen[None]):
    BINDINGS = [
        Binding("o", "decide('allow_once')", "allow once"),
        Binding("s", "decide('allow_session')", "allow session"),
        Binding("d", "decide('deny')", "deny"),
        # not in the footer (80 columns are full): the detail pane lists it with the other answers
        Binding("D", "deny_with_reason", "deny, say why", show=False),
    ]

    # what the footer was last built for: (something selected, allow_session offered, connected)
    _bindings_for: tuple[object, ...] | None = None
    _look_first: LookFirst | None = None
    _showing: Request | None = None  # the request whose detail the person was last shown

    @property
    def vapp(self) -> "VaultApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield Label("Pending approvals, oldest first", classes="title")
                yield PendingTable(id="pending")
                with VerticalScroll(id="detail-pane"):  # a 4 KiB value scrolls, the list stays
                    yield RequestDetail(id="detail")
            with Vertical(id="right"):
                yield PromptCounters(id="counters")
                yield Label("Activity", classes="title")
                yield ActivityLog(id="activity")
        yield Footer(show_command_palette=False)  # every key visible at 80 columns

    def on_mount(self) -> None:
        self.query_one(PendingTable).focus()
        self.watch(self.app, "revision", self.sync)

    def sync(self) -> None:
        state, now = self.vapp.state, self.vapp.now()
        self.query_one(StatusBar).show(state)
        table = self.query_one(PendingTable)
        gone = self._showing
        if gone is not None and gone.request_id not in state.pending and not self.vapp.decided_here(gone.request_id):
            # it left under the person (withdrawn, expired, decided elsewhere): the next row comes
            # under their key as after a decision of their own, and is held back the same way
            look = self._look_first = self._look_first or LookFirst()
            look.decided(gone, set(state.pending) | {gone.request_id})
        table.show(state.pending_oldest_first(), now, state.me)
        for rid in table.visible_ids():  # rows on screen; one scrolled into view is reported within a second
            self.vapp.report_seen(rid, detail=False)
        self.query_one(PromptCounters).show(*state.run_counts(), state.meter(now))
        self.query_one(ActivityLog).show(state)
        self._show_selected()

    def selected_request(self) -> Request | None:
        rid = self.query_one(PendingTable).selected_id
        return self.vapp.state.pending.get(rid) if rid else None

    def _show_selected(self) -> None:
        req = self._showing = self.selected_request()
        if req is None:
            self.query_one(RequestDetail).show(None, now=self.vapp.now())
        else:
            self.vapp.want_full(req.request_id)  # a value cut in the prompt: fetch it whole
            state = self.vapp.state
            held = self._look_first.why(req) if self._look_first is not None else ""
            self.query_one(RequestDetail).show(*state.as_shown(req), now=self.vapp.now(), me=state.me,
                                               exe=state.exe_of(req), held=held)
        if req is not None:
            self.vapp.report_seen(req.request_id, detail=True)
        # the footer is rebuilt on refresh_bindings: only when what it shows can change
        key = (req is not None, req.allow_session_offered if req else None, self.vapp.state.connected)
        if key != self._bindings_for:
            self._bindings_for = key
            self.refresh_bindings()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "deny_with_reason":
            action, parameters = "decide", ("deny",)
        if action != "decide":
            return True
        req = self.selected_request()
        if req is not None and parameters and parameters[0] == "allow_session" \
                and not req.allow_session_offered:
            return False  # not offered by the policy: hidden, not merely greyed
        if req is None or (self.vapp.link is not None and not self.vapp.state.connected):
            return None  # nothing to decide (or nobody to tell): shown greyed
        return True

    def action_decide(self, decision: str) -> None:
        req = self.selected_request()
        if req is None:
            return
        look = self._look_first = self._look_first or LookFirst()
        if decision != "deny":
            why = look.hold(req)
            if why:  # a request buried behind the ones just decided: this key was meant for those
                self.app.bell()
                self.notify(why, title="not allowed yet", severity="warning", markup=False)
                self._show_selected()  # the detail pane says it too, where the person is looking
                return
        look.decided(req, set(self.vapp.state.pending))
        self.vapp.decide(req.request_id, decision)

    def action_deny_with_reason(self) -> None:
        req = self.selected_request()
        if req is None:
            return
        rid = req.request_id

        def answer(reason: str | None) -> None:
            if reason is not None:
                look = self._look_first = self._look_first or LookFirst()
                look.decided(req, set(self.vapp.state.pending))
                self.vapp.decide(rid, "deny", reason)

        self.app.push_screen(DenyReason(req.operation, req.agent), answer)
