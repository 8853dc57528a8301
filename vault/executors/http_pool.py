"""The HTTP executor's connection pool: a kept-alive connection that received bytes while idle is
never used again.

An HTTP/1.1 client reads a connection's answers in order: aiohttp parses whatever arrives on a
pooled connection and hands the first message to the next request sent on it. A remote that
sends an answer nobody asked for, or the answer to a request another process wrote on the vault's
connection (a root process copies a socket with pidfd_getfd), left that answer waiting there; the
vault's next call took it for its own: a malformed_response, another request's error, or a
success the remote never gave for this call. A connection is idle only between a released
answer and its next request, when the remote has nothing to say; one that spoke is closed when
next taken from the pool, before anything is written on it (a fresh one is opened instead), and
the drop is logged (never the bytes). Bytes that arrive between the pick and the write are left
to the correlation check (vault.executors.http: an answer naming another request is not the
call's).

aiohttp has no public hook for this: the connector's pool methods (`_get`, `_release`) and its
protocol factory are overridden (tests/test_http_stray.py guards them).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

log = logging.getLogger("vaultsim.http")


class WatchedHandler(ResponseHandler):
    """aiohttp's protocol, counting the bytes that arrive while its connection is in the pool."""

    def __init__(self, loop: Any) -> None:
        super().__init__(loop)
        self.pooled = False
        self.stray = 0

    def data_received(self, data: bytes) -> None:
        if self.pooled and data:
            self.stray += len(data)
        super().data_received(data)


class WatchedConnector(aiohttp.TCPConnector):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # partial[WatchedHandler] is a partial[ResponseHandler] in all but the generic's variance
        self._factory = functools.partial(WatchedHandler, loop=self._loop)  # type: ignore[assignment]

    def _release(self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False) -> None:
        if isinstance(protocol, WatchedHandler):
            protocol.pooled = True  # from here to its next pick, the remote owes it nothing
        super()._release(key, protocol, should_close=should_close)

    async def _get(self, key: ConnectionKey, traces: list[Trace]) -> Connection | None:
        conns = self._conns.get(key)
        if conns:
            for proto, since in list(conns):
                if isinstance(proto, WatchedHandler) and proto.stray:
                    conns.remove((proto, since))
                    log.warning("closed a kept-alive connection to %s:%s: %d byte(s) arrived on it while "
                                "idle (an answer to no request of the vault's)", key.host, key.port, proto.stray)
                    proto.close()
            if not conns:
                del self._conns[key]
        conn = await super()._get(key, traces)
        if conn is not None and isinstance(conn.protocol, WatchedHandler):
            conn.protocol.pooled = False
        return conn
