"""A host's cancel of a call that waits for the person, held back for a grace so that its retry joins it.

Hosts cancel a tool call when their own timeout passes (often 60 s, some less) and many then call the
same tool again with the same arguments. Withdrawing the request at the cancel made that retry a new
request: the person was asked twice, and under `vaultsim run` the host was graded for approval
fatigue. MCP lets a receiver ignore a cancel, so the bridge holds it back: the request keeps its
place for the grace (`--cancel-grace`), and the identical call (same tool, same arguments and
idempotency key, same MCP session) or a `vault_resume` of its token joins it. Withdrawn at the end of
the grace if nothing joined, as the cancel asked.

`Waits` is the link's book of the requests waiting on each resume token, and of the one `call.resume`
in flight per token that all of them share (a host timing out every second must not pile up resumes
at the vault: 64 in flight on a connection is its limit).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

from vault.models import Category, Result


def fingerprint(tool: str, params: dict[str, Any], idempotency_key: str | None) -> str:
    """What makes two tool calls the same call (the wait a call asks for is not part of it)."""
    return json.dumps([tool, params, idempotency_key], sort_keys=True, separators=(",", ":"), default=str)


class Waits:
    def __init__(self) -> None:
        self._holders: dict[str, dict[object, float | None]] = {}  # token -> request -> its grace end (None: live)
        self._held: dict[str, Result] = {}  # token -> the request's own approval_pending
        self._fp: dict[str, str] = {}  # fingerprint -> token, while something waits on it
        self._token_fp: dict[str, str] = {}
        self._waiters: dict[str, asyncio.Future[Result]] = {}  # token -> the call.resume in flight
        self._woken: dict[object, asyncio.Event] = {}  # request -> set when its host cancels it

    def hold(self, token: str, who: object, held: Result, fp: str | None) -> asyncio.Event:
        self._holders.setdefault(token, {})[who] = None
        self._held.setdefault(token, held)
        if fp is not None and token not in self._token_fp:
            self._fp[fp], self._token_fp[token] = token, fp
        return self._woken.setdefault(who, asyncio.Event())

    def release(self, token: str, who: object) -> bool:
        """`who` waits no more; True when nothing of this link waits on `token` now."""
        self._woken.pop(who, None)
        holders = self._holders.get(token, {})
        holders.pop(who, None)
        if holders:
            return False
        self._holders.pop(token, None)
        self._held.pop(token, None)
        self._waiters.pop(token, None)
        fp = self._token_fp.pop(token, None)
        if fp is not None and self._fp.get(fp) == token:
            del self._fp[fp]
        return True

    def drop(self, token: str, who: object, until: float) -> None:
        """The host cancelled `who`: it keeps its place until `until` (monotonic)."""
        if who in self._holders.get(token, {}):
            self._holders[token][who] = until
            self._woken[who].set()

    def dropped_until(self, token: str, who: object) -> float | None:
        return self._holders.get(token, {}).get(who)

    def others(self, token: str, who: object) -> bool:
        """Something other than `who` still waits on `token`."""
        return any(k is not who and k != who for k in self._holders.get(token, {}))

    def joinable(self, fp: str, now: float) -> Result | None:
        """The approval_pending of a request made by the identical call, which its host cancelled and
        whose grace is not over (only cancelled ones: two identical calls live at once are two calls)."""
        token = self._fp.get(fp)
        holders = self._holders.get(token or "", {})
        if token is None or not holders or any(end is None or end <= now for end in holders.values()):
            return None
        return self._held.get(token)

    def waiter(self, token: str, start: Callable[[], Awaitable[Result]]) -> asyncio.Future[Result]:
        """The call.resume of `token` in flight (or settled with the call's outcome), else a new one."""
        fut = self._waiters.get(token)
        if fut is not None and (not fut.done() or _final(fut)):
            return fut
        fut = asyncio.ensure_future(start())
        fut.add_done_callback(_retrieve)
        self._waiters[token] = fut
        return fut


def _final(fut: asyncio.Future[Result]) -> bool:
    """A settled resume that says how the call ended (not still pending, not the vault's own refusal)."""
    if fut.cancelled() or fut.exception() is not None:
        return False
    return fut.result().category not in (Category.approval_pending, Category.rate_limited)


def _retrieve(fut: asyncio.Future[Result]) -> None:
    if not fut.cancelled():
        fut.exception()  # a waiter nobody reads any more raises nothing into the loop's log
