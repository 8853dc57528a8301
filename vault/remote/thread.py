"""Run a RemoteServer on its own event loop in a background thread.

For callers that are not async themselves (a synchronous test, the scenario
runner) or that must keep the remote's loop apart from the one under test.
The ledger and event log are thread-safe, so they can be read directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

from vault.remote.faults import FaultSpec
from vault.remote.server import RemoteServer


class RemoteThread:
    def __init__(self, credentials: dict[str, str], fault: FaultSpec | None = None,
                 events_path: Path | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = RemoteServer(credentials, fault, events_path)
        self._addr = (host, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self, timeout: float = 10.0) -> int:
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="vaultsim-remote", daemon=True)
        self._thread.start()
        return ready.result(timeout)

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            try:
                port = await self.server.start(*self._addr)
            except BaseException as exc:
                ready.set_exception(exc)
                return
            ready.set_result(port)
            await self._stopped.wait()
            await self.server.stop()

        asyncio.run(main())

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the server's loop (e.g. set_fault, release)."""
        assert self._loop is not None
        async def run() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def set_fault(self, spec: FaultSpec | None) -> None:
        self.call(self.server.set_fault, spec)

    def release(self) -> None:
        self.call(self.server.release)

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stopped is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout)
        self._loop = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def service_url(self) -> str:
        return self.server.service_url

    def __enter__(self) -> "RemoteThread":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
