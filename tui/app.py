"""`VaultApp`: the thin Textual app that ties the link, the state and the screens together.

It owns three things: the `TuiState`, the approver link (a worker), and the
clock. Screens watch `revision` and redraw from the state; they never talk to
the socket themselves. The clock is injected so snapshot tests can freeze the
countdown, and without a home the app runs unlinked and is fed messages
directly (tests, the bench).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive

from vault.errors import VaultError
from vault.home import VaultHome
from vault.text import shown

from tui.connection import ApproverLink
from tui.messages import (DaemonNotice, DetailFailed, DetailLoaded, LinkAnswering, LinkDown, LinkSilent, LinkUp,
                          RequestFailed, SessionsLoaded, StatsLoaded)
from tui.screens.confirm import ConfirmUnlock
from tui.screens.main import MainScreen
from tui.screens.sessions import SessionsScreen
from tui.state import TuiState


class VaultApp(App[None]):
    CSS_PATH = str(Path(__file__).with_name("vaultsim.tcss"))  # absolute: subclasses live elsewhere
    TITLE = "vaultsim approver"
    BINDINGS = [
        Binding("l", "toggle_lock", "lock/unlock"),
        Binding("v", "sessions", "sessions"),
        Binding("q", "quit", "quit"),
    ]

    revision: reactive[int] = reactive(0, init=False)

    def __init__(self, home: VaultHome | None = None, *, name: str = "human",
                 clock: Callable[[], float] = time.time, run_id: str | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.state = TuiState(home=str(home.root) if home else "", pinned_run=run_id, me=name)
        self.link = ApproverLink(home, name, self.post_message) if home is not None else None
        # what this person sent, in order (tests read it; it never holds a secret)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        # the `seen` reports (request id, detail?), kept apart: the screen sends them, not the person
        self.seen_sent: list[tuple[str, bool]] = []
        self._decided: set[str] = set()

    def now(self) -> float:
        return self.clock()

    def on_mount(self) -> None:
        self.push_screen(MainScreen())
        self.set_interval(1.0, self.bump)  # the countdowns
        if self.link is not None:
            self._keep_linked()

    def bump(self) -> None:
        self.revision += 1

    @work(exclusive=True, group="link", exit_on_error=False)
    async def _keep_linked(self) -> None:
        assert self.link is not None
        await self.link.run()

    # ---- from the link -----------------------------------------------------------

    def on_link_up(self, m: LinkUp) -> None:
        self.state.link_up(m.pending, m.locked, self.now())
        self.bump()

    def on_link_down(self, m: LinkDown) -> None:
        self.state.link_down(m.reason, self.now())
        self.bump()

    def on_link_silent(self, m: LinkSilent) -> None:
        self.state.daemon_silent(m.method, self.now())
        self.bump()

    def on_link_answering(self, m: LinkAnswering) -> None:
        self.state.daemon_answering(self.now())
        self.bump()

    def on_daemon_notice(self, m: DaemonNotice) -> None:
        self.state.apply(m.method, m.params, self.now())
        self.bump()

    def on_sessions_loaded(self, m: SessionsLoaded) -> None:
        self.state.load_sessions(m.sessions)
        self.bump()

    def on_stats_loaded(self, m: StatsLoaded) -> None:
        self.state.load_stats(m.report)
        self.bump()

    def on_detail_loaded(self, m: DetailLoaded) -> None:
        self.state.load_full(m.request_id, m.answer)
        self.bump()

    def on_detail_failed(self, m: DetailFailed) -> None:
        self.state.full_failed(m.request_id, m.message)
        self.bump()

    def on_request_failed(self, m: RequestFailed) -> None:
        self.state.note(self.now(), f"{m.method} refused: {m.message}", "gate")
        self.notify(shown(m.message), title=f"{shown(m.method)} refused", severity="error", markup=False)
        self.bump()

    # ---- to the daemon -------------------------------------------------------------

    def decide(self, request_id: str, decision: str, reason: str = "") -> None:
        if request_id in self._decided:
            return  # a second key before the daemon's answer arrived: the first one counts
        self._decided.add(request_id)
        self.state.record_decision(request_id, decision, self.now())
        extra = {"reason": reason} if reason else {}
        self.request("decide", request_id=request_id, decision=decision, **extra)
        self.bump()  # the meter

    def decided_here(self, request_id: str) -> bool:
        """Whether this person decided `request_id` (from this screen)."""
        return request_id in self._decided

    def report_seen(self, request_id: str, detail: bool) -> None:
        """Tell the vault a row (or its detail) is on screen, once each (vault.gate.fatigue)."""
        if self.state.mark_shown(request_id, self.now(), detail):
            self.seen_sent.append((request_id, detail))
            if self.link is not None:
                self._send_seen(request_id, detail)

    @work(group="seen", exit_on_error=False)
    async def _send_seen(self, request_id: str, detail: bool) -> None:
        assert self.link is not None
        try:
            await self.link.request("seen", request_id=request_id, detail=detail)
        except (VaultError, OSError):
            pass  # the vault then times the decision from when it sent the prompt

    def want_full(self, request_id: str) -> None:
        """Fetch a cut request's parameters in full (`approval.detail`), once, for its detail pane."""
        if self.link is not None and self.state.wants_full(request_id):
            self._fetch_full(request_id)

    @work(group="detail", exit_on_error=False)
    async def _fetch_full(self, request_id: str) -> None:
        assert self.link is not None
        try:
            answer = await self.link.request("approval.detail", request_id=request_id)
        except (VaultError, OSError) as exc:
            why = exc.message if isinstance(exc, VaultError) else type(exc).__name__
            self.post_message(DetailFailed(request_id, why))
            return
        self.post_message(DetailLoaded(request_id, answer))

    def request(self, method: str, **params: Any) -> None:
        self.sent.append((method, params))
        if self.link is not None:
            self._send(method, params)

    @work(group="rpc", exit_on_error=False)
    async def _send(self, method: str, params: dict[str, Any]) -> None:
        assert self.link is not None
        if await self.link.call(method, **params) is None and method == "decide":
            self._decided.discard(params["request_id"])  # refused or not sent: the person may try again

    # ---- actions -------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "toggle_lock" and (self.link is not None and not self.state.connected):
            return None
        return True

    def action_toggle_lock(self) -> None:
        if self.state.locked:
            self.push_screen(ConfirmUnlock(), self._unlock_answer)
        else:
            self.request("lock")  # the safe direction: no question asked

    def _unlock_answer(self, unlock: bool | None) -> None:
        if unlock:
            self.request("unlock")

    def action_sessions(self) -> None:
        if isinstance(self.screen, SessionsScreen):
            self.pop_screen()
        else:
            self.push_screen(SessionsScreen())
