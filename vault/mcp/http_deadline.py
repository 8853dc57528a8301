"""uvicorn's HTTP/1.1 protocol with a deadline on every request's headers.

uvicorn times out only a kept-alive connection idle after a response: a connection that
never sends a request, or trickles its headers a byte a second, holds one of the bridge's
descriptors for as long as it likes, and enough of them (one process, one per descriptor
the bridge may open) keep every host from connecting. Here a connection whose next
request's headers are not all in within HEADER_S of its opening, or of its last response,
is closed. A request being served (an SSE stream waiting minutes for a person) is never
cut: the deadline covers headers only.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_S = 10.0


class DeadlinedH11(H11Protocol):
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(HEADER_S, self._too_slow)

    def _too_slow(self) -> None:
        self._header_timer = None
        # IDLE: no complete request since the timer was armed (h11 leaves IDLE at a request's
        # last header line); past it a request is being served and is left alone
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
