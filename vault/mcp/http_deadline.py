"""uvicorn's HTTP/1.1 protocol with a deadline on every request's headers and body.

uvicorn times out only a kept-alive connection idle after a response: a connection that
never sends a request, or trickles its headers a byte a second, holds one of the bridge's
descriptors for as long as it likes, and enough of them (one process, one per descriptor
the bridge may open) keep every host from connecting. Here a connection whose next
request is not all in (its headers and its body: whole headers then a trickled body held a
descriptor the same way) within HEADER_S of its opening, or of its last response, is closed.
A request being served (an SSE stream waiting minutes for a person) is never cut: the
deadline covers what the client sends, not the answer.

A client that half-closes after a whole request (shutdown SHUT_WR: `nc -N`, a script saying
"no more requests") still reads: uvicorn took that end of input for a hang-up, dropped the
request as disconnected (nothing answered, a ClientDisconnect traceback logged). Here it is
answered, then the connection closed. Not a GET: that is the standalone SSE stream, which
never ends with an answer, so its end of input is the host leaving (kept open, it blocked the
host's next GET stream, 409, until a keep-alive write failed).
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

    _client_done = False  # the client sent its whole request and then its end of input

    def eof_received(self) -> bool:  # type: ignore[override]
        if self.cycle is None or self.cycle.response_complete or self.conn.their_state is not h11.DONE:
            return False  # nothing to answer, or a request cut short: closed, as before
        if self.cycle.scope.get("method") == "GET":
            # a GET is the standalone SSE stream, which has no last answer to wait for: EOF is the
            # host leaving. Held open, the stream stayed the session's one GET stream until a write
            # failed, and the host's reconnect was refused 409 meanwhile
            return False
        self._client_done = True
        return True  # the write side stays open for the answer

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._client_done and (self.cycle is None or self.cycle.response_complete) \
                and not self.transport.is_closing():
            self.transport.close()  # answered (and any request pipelined before its EOF)
            return
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
        # IDLE: no complete headers since the timer was armed; SEND_BODY: headers in, the body
        # not (an MCP message is a small body sent at once); past DONE the request is being
        # served and is left alone
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()
