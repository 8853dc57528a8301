"""The daemon's catalog as the bridge knows it, followed across daemon restarts.

The tools a host sees are the daemon's operations and policy, asked over the
agent socket (`catalog`), never read from a file the daemon may not use. The
bridge keeps one control connection open; when it closes (the daemon stopped
or restarted) the bridge reconnects and asks again, and when the fingerprint
changed (another catalog or policy, or a first daemon for a bridge started
with --wait) every MCP session is told `notifications/tools/list_changed`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from pydantic import ValidationError

from vault.client import AsyncRpcClient
from vault.errors import VaultError
from vault.mcp.schemas import CatalogView

log = logging.getLogger("vaultsim.mcp")

OnChange = Callable[[CatalogView | None], Awaitable[None]]
# reconnect backoff while no daemon answers (a restart takes well under a second)
_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 1.0
_CATALOG_WITHIN_S = 10.0


class CatalogWatch:
    def __init__(self, socket_path: str, on_change: OnChange) -> None:
        self.socket_path = socket_path
        self.on_change = on_change
        self.view: CatalogView | None = None
        self._client: AsyncRpcClient | None = None
        self._lock = asyncio.Lock()  # tools/list and the follower may both want to connect
        self.connected = asyncio.Event()
        self._warned = False

    async def get(self) -> CatalogView | None:
        """The catalog now; asks the daemon if none is known yet (None if nothing answers)."""
        if self.view is None:
            await self._connect_once()
        return self.view

    async def _connect_once(self) -> bool:
        async with self._lock:
            return await self._connect_locked()

    async def _connect_locked(self) -> bool:
        if self._client is not None and not self._client.closed.is_set():
            return True
        try:
            client = await AsyncRpcClient.connect(self.socket_path)
        except (VaultError, OSError):
            return False
        try:
            # bounded: a stopped daemon held tools/list (this lock) for ever
            view = CatalogView.model_validate(await client.request_within(_CATALOG_WITHIN_S, "catalog"))
        except (VaultError, OSError, ValidationError) as exc:
            if not self._warned:  # said once: the follower retries every second
                log.warning("the daemon's catalog could not be read (%s); only vault_resume and "
                            "vault_lookup are offered", getattr(exc, "message", type(exc).__name__))
                self._warned = True
            await client.close()
            return False
        self._warned = False
        self._client = client
        changed = self.view is None or view.fingerprint != self.view.fingerprint
        self.view = view
        self.connected.set()
        if changed:
            await self.on_change(view)
        return True

    async def run(self) -> None:
        """Follow the daemon for the bridge's life: reconnect after it goes, re-read the catalog."""
        delay = _RETRY_FIRST_S
        while True:
            if await self._connect_once():
                delay = _RETRY_FIRST_S
                assert self._client is not None
                await self._client.closed.wait()
                self.connected.clear()
                log.info("the vault daemon went away; reconnecting")
                continue
            await asyncio.sleep(delay)  # nothing answers yet: try again, backing off
            delay = min(delay * 2, _RETRY_MAX_S)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
