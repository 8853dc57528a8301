"""The approver link: one connection to `approver.sock`, kept up while the app runs.

Runs inside a Textual worker. It says hello with the home's approver token
(read fresh at every connect, never kept), subscribes, forwards every
notification as a `DaemonNotice`, and refreshes `stats` when prompts change.
Pending prompts, sessions and stats are read page by page (vault.client), so a
daemon holding thousands of them still lets the TUI connect.
When the daemon goes away it posts `LinkDown` and retries, so a restarted
daemon is picked up without the person doing anything.

The notification callback runs on the client's reader task: it must not await a
request (the answer would be read by that same task), so refreshes are handed
to a separate task through an event.

What the daemon relays is passed on as sent (agent names, params, scopes: chosen
by agents); every widget shows it through `vault.text.shown` (escaped, never
markup), and the detail pane flags what could still mislead (`vault.text.doubts`),
which it could not if the text were escaped here already.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from textual.message import Message

from vault.client import AsyncRpcClient, SilenceWatch, connect_approver, fetch_all
from vault.errors import HomeError, RpcError, VaultError
from vault.home import VaultHome

from tui.messages import (DaemonNotice, LinkAnswering, LinkDown, LinkSilent, LinkUp, RequestFailed, SessionsLoaded,
                          StatsLoaded)

# notifications after which the prompt counters are stale
_STATS_TRIGGERS = frozenset({"approval.requested", "approval.settled", "vault.locked", "grant.created"})

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0


class NotConnected(VaultError):
    """The person acted while the daemon was not reachable."""


class ApproverLink:
    def __init__(self, home: VaultHome, name: str, post: Callable[[Message], Any]) -> None:
        self.home = home
        self.name = name
        self.post = post
        self.client: AsyncRpcClient | None = None
        self._stats_due = asyncio.Event()
        # a stopped or stuck daemon keeps what the person sent waiting: said on the status line, and
        # waited for, never sent again (a second decision); cleared when it answers (vault.silence)
        self.watch = SilenceWatch(lambda method: self.post(LinkSilent(method)), lambda: self.post(LinkAnswering()))

    async def run(self) -> None:
        """Connect, serve, and reconnect forever (the worker is cancelled on exit)."""
        delay = RETRY_FIRST_S
        last_down = ""
        while True:
            try:
                client, answer = await connect_approver(self.home, self.name, self._on_notify, watch=self.watch)
            except (VaultError, OSError) as exc:
                why = _why(exc)
                if why != last_down:  # say it once, not at every retry
                    self.post(LinkDown(why))
                    last_down = why
                await asyncio.sleep(delay)  # backoff between reconnect attempts
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay, last_down = RETRY_FIRST_S, ""
            self.client = client
            self.post(LinkUp(list(answer.get("pending") or []), bool(answer.get("locked"))))
            refresher = asyncio.create_task(self._refresh_loop(client))
            try:
                await client.closed.wait()
            finally:
                refresher.cancel()
                self.client = None
                await client.close()
            last_down = "the daemon closed the connection; reconnecting"
            self.post(LinkDown(last_down))

    def _on_notify(self, method: str, params: dict[str, Any]) -> None:
        self.post(DaemonNotice(method, params))
        if method in _STATS_TRIGGERS:
            self._stats_due.set()

    async def _refresh_loop(self, client: AsyncRpcClient) -> None:
        try:
            # both come in pages (vault.daemon.paging): every page is read before the view is replaced
            self.post(SessionsLoaded(list((await fetch_all(client, "sessions")).get("sessions") or [])))
            while True:
                self.post(StatsLoaded(await fetch_all(client, "stats")))
                await self._stats_due.wait()
                self._stats_due.clear()
        except (VaultError, OSError):
            return  # the connection went away; run() notices and reconnects

    async def request(self, method: str, **params: Any) -> Any:
        client = self.client
        if client is None:
            raise NotConnected("not connected to the daemon")
        return await client.request(method, **params)

    async def call(self, method: str, **params: Any) -> Any | None:
        """A request on the person's behalf: failures become a `RequestFailed` message."""
        try:
            return await self.request(method, **params)
        except (VaultError, OSError) as exc:
            self.post(RequestFailed(method, _why(exc)))
            return None


def _why(exc: BaseException) -> str:
    if isinstance(exc, (RpcError, HomeError, VaultError)):
        return exc.message
    return f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
