"""An answer that is not the call's is never taken as its answer.

HTTP/1.1 answers a connection's requests in order, and aiohttp hands a kept-alive connection's
next message to whichever request is sent on it next. Two ways a stray answer got there:

* a process wrote a request of its own on the vault's idle pooled connection to the remote (a root
  agent copies the socket with pidfd_getfd): the remote's answer to it waited on the connection,
  and the vault's next call read it as its own: another request's success (a wrong success, the
  rider's issue reported as the call's) or its error;
* the remote sent an answer nobody asked for (here: an earlier answer again) just before the
  call's own: the call reported that earlier answer.

Now a pooled connection that received bytes while idle is closed before reuse
(vault.executors.http.WatchedConnector), and an answer whose X-Correlation-Id (the fake remote echoes it) names
another request is not the call's: outcome_unknown for a write (the request was sent), a read
local_failure; its connection is closed.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from typing import Any

import pytest

from remote_fixtures import CATALOG, Harness, canary, credentials, diagnostics, harness_factory  # noqa: F401
from vault.executors.base import ServiceConfig
from vault.executors.http import request_parts
from vault.executors.http import WatchedConnector, WatchedHandler
from vault.models import Category


def _pooled_socket(h: Harness) -> socket.socket:
    """A copy of the executor's idle kept-alive connection to the remote (as pidfd_getfd makes)."""
    session = h.executor._session
    assert session is not None
    conns = [proto for pool in session.connector._conns.values() for proto, _ in pool]  # type: ignore[union-attr]
    assert len(conns) == 1, conns
    sock = conns[0].transport.get_extra_info("socket")  # type: ignore[union-attr]
    return socket.socket(fileno=os.dup(sock.fileno()))


async def test_the_remote_echoes_the_correlation_id(harness_factory: Any) -> None:  # noqa: F811
    h: Harness = await harness_factory()
    call = await h.call("read_issue", {"issue_id": "ISS-1"})
    assert Category.success == call.result.category
    assert isinstance(h.executor._session.connector, WatchedConnector)  # type: ignore[union-attr]
    event = await h.wait_event(call.cid, "response_sent")
    assert event["status"] == 200


async def test_a_riders_answer_on_the_idle_connection_is_not_the_next_calls(harness_factory: Any) -> None:  # noqa: F811
    """The rider files an issue on the vault's idle connection; the vault's next create_issue got
    the rider's issue as its own success (and its own request was never sent)."""
    h: Harness = await harness_factory()
    warm = await h.call("read_issue", {"issue_id": "ISS-1"})
    assert Category.success == warm.result.category
    op = CATALOG.get("create_issue")
    assert op is not None
    path, body, _ = request_parts(op, {"title": "the rider's"})
    data = b'{"title":"the rider\'s"}'
    rider = (f"POST {path} HTTP/1.1\r\nHost: {h.remote.host}:{h.remote.port}\r\n"
             f"Authorization: Bearer {h.credentials[op.credential]}\r\nX-Correlation-Id: c-rider-1\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data
    with _pooled_socket(h) as s:
        s.sendall(rider)
    await h.wait_event("c-rider-1", "response_sent")
    session = h.executor._session
    assert session is not None
    call = await h.call("create_issue", {"title": "the vault's"})
    assert Category.success == call.result.category, call.result.message
    assert call.result.data["title"] == "the vault's", call.result.data
    assert [e["event"] for e in h.events(call.cid)][:1] == ["received"]  # its own request was sent
    await h.wait_event(call.cid, "response_sent")


# ---- a remote that sends an earlier answer again before the call's own ------------------------


class Repeater:
    """Forwards each request to the fake remote on a connection of its own; before the second
    answer on a connection it writes the first one again (an answer nobody asked for)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _forward(self, raw: bytes) -> bytes:
        r, w = await asyncio.open_connection(*self.target)
        try:
            w.write(raw)
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
            n = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            return head + (await r.readexactly(int(n.group(1))) if n else b"")
        finally:
            w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = b""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                raw = head + (await reader.readexactly(int(n.group(1))) if n else b"")
                answer = await self._forward(raw)
                writer.write((first + answer) if first else answer)
                await writer.drain()
                first = first or answer
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("second,params,category", [
    ("create_issue", {"title": "the second"}, Category.outcome_unknown),  # sent: it may have acted
    ("read_issue", {"issue_id": "ISS-1"}, Category.local_failure)])  # a read: a bounded retry is safe
async def test_an_answer_naming_another_request_is_not_the_calls(harness_factory: Any, second: str,  # noqa: F811
                                                                 params: dict[str, Any],
                                                                 category: Category) -> None:
    h: Harness = await harness_factory()
    rep = Repeater((h.remote.host, h.remote.port))
    await rep.start()
    try:
        url = h.remote.service_url.replace(f":{h.remote.port}", f":{rep.port}")
        h.service = lambda **o: ServiceConfig(name="remote", url=url, options=o)  # type: ignore[method-assign]
        first = await h.call("create_issue", {"title": "the first"})
        assert Category.success == first.result.category, first.result.message
        call = await h.call(second, params)
        assert category == call.result.category, (call.result.message, call.result.data)
        assert "another request's" in call.result.message
        assert call.outcome.diagnostic["reason"] == "foreign_answer"
        h.assert_no_leak(first.outcome, call.outcome)
        # the connection that carried it is never reused: the next call gets its own answer
        again = await h.call("read_issue", {"issue_id": "ISS-1"})
        assert Category.success == again.result.category, again.result.message
    finally:
        await rep.stop()


def test_the_pool_hooks_aiohttp_has() -> None:
    """vault.executors.http.WatchedConnector overrides aiohttp's private pool methods and protocol factory:
    a newer aiohttp without them would silently reuse a connection that spoke while idle."""
    import aiohttp
    from aiohttp.client_proto import ResponseHandler
    assert issubclass(WatchedHandler, ResponseHandler)
    for name in ("_get", "_release"):
        assert callable(getattr(aiohttp.TCPConnector, name))
    assert "_factory" in aiohttp.BaseConnector.__init__.__code__.co_names
    assert "_conns" in aiohttp.BaseConnector.__init__.__code__.co_names


async def test_a_remote_with_a_correlation_header_of_its_own_can_say_so(harness_factory: Any) -> None:  # noqa: F811
    """`correlation_echo: false`: the answer's X-Correlation-Id is the remote's own, not checked."""
    h: Harness = await harness_factory()
    rep = Repeater((h.remote.host, h.remote.port))
    await rep.start()
    try:
        url = h.remote.service_url.replace(f":{h.remote.port}", f":{rep.port}")
        h.service = lambda **o: ServiceConfig(name="remote", url=url, options=o)  # type: ignore[method-assign]
        first = await h.call("create_issue", {"title": "the first"}, correlation_echo=False)
        assert Category.success == first.result.category, first.result.message
        # the repeated answer is taken (nothing tells it apart): what the check prevents
        call = await h.call("create_issue", {"title": "the second"}, correlation_echo=False)
        assert Category.success == call.result.category and call.result.data["title"] == "the first"
    finally:
        await rep.stop()
