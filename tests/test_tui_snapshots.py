"""Screenshots of the approver (pytest-textual-snapshot), made deterministic.

The app runs unlinked with a frozen clock and is fed recorded daemon payloads
(fixed ids and times) through the same messages the link posts; local time is
pinned to UTC. A live-daemon test checks the recorded payloads still have the
shape the daemon sends, so the pictures cannot drift away from the protocol.
Update after a deliberate change with `pytest --snapshot-update`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from textual.pilot import Pilot

from helpers import Sandbox
from tui.messages import LinkDown
from tui_fixtures import ACTIVITY, GRANTS, PENDING, SESSIONS, feed, offline_app, start_agent
from vault.client import connect_approver
from vault.home import VaultHome

SIZE = (150, 42)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def fed(pilot: Pilot) -> None:
    await feed(pilot.app)  # type: ignore[arg-type]
    await pilot.pause()


async def fed_locked(pilot: Pilot) -> None:
    await feed(pilot.app, pending=False, locked=True)  # type: ignore[arg-type]
    await pilot.pause()


class TestSnapshots:
    def test_main_screen_with_pending_requests(self, snap_compare: Any) -> None:
        """Three pending requests oldest first, risk colours, countdowns, meanings, counters with fatigue."""
        assert snap_compare(offline_app(), terminal_size=SIZE, run_before=fed)

    def test_per_call_request_hides_allow_session(self, snap_compare: Any) -> None:
        """A per_call request selected: `s` is struck out in the detail and absent from the footer."""
        assert snap_compare(offline_app(), press=["down"], terminal_size=SIZE, run_before=fed)

    def test_sessions_view(self, snap_compare: Any) -> None:
        """Each session with its process, its grants and their scopes."""
        assert snap_compare(offline_app(), press=["v"], terminal_size=SIZE, run_before=fed)

    def test_locked_state(self, snap_compare: Any) -> None:
        """Locked: a loud status line, nothing pending."""
        assert snap_compare(offline_app(), terminal_size=SIZE, run_before=fed_locked)

    def test_unlock_asks_for_confirmation(self, snap_compare: Any) -> None:
        """`l` while locked opens the confirmation, safe answer focused."""
        assert snap_compare(offline_app(), press=["l"], terminal_size=SIZE, run_before=fed_locked)

    def test_disconnected_state(self, snap_compare: Any) -> None:
        """No daemon: the status line says so and that the TUI keeps retrying."""
        async def down(pilot: Pilot) -> None:
            pilot.app.post_message(LinkDown("no vaultsim daemon answers on /tmp/vs-demo/h/approver.sock"))
            await pilot.pause()
        assert snap_compare(offline_app(), terminal_size=SIZE, run_before=down)


SMALL = (80, 24)


def footer_text(app: Any) -> str:
    """The bottom line of the screen as plain text (read from the screenshot's SVG)."""
    import html
    import re
    rows: dict[float, list[str]] = {}
    for m in re.finditer(r'<text[^>]*y="([0-9.]+)"[^>]*>([^<]*)</text>', app.export_screenshot()):
        rows.setdefault(float(m.group(1)), []).append(html.unescape(m.group(2)).replace("\xa0", " "))
    return "".join(rows[max(rows)])


class TestSmallTerminal:
    """At 80x24, the smallest terminal people keep, every key of the footer is visible."""

    def test_main_screen_at_80x24(self, snap_compare: Any) -> None:
        """The main screen with pending requests fits: the footer ends with `q quit`."""
        assert snap_compare(offline_app(), terminal_size=SMALL, run_before=fed)

    def test_sessions_view_at_80x24(self, snap_compare: Any) -> None:
        assert snap_compare(offline_app(), press=["v"], terminal_size=SMALL, run_before=fed)

    @pytest.mark.parametrize(("press", "keys"), [
        ([], ["o allow once", "s allow session", "d deny", "l lock/unlock", "v sessions", "q quit"]),
        (["down"], ["o allow once", "d deny", "l lock/unlock", "v sessions", "q quit"]),
        (["v"], ["r revoke", "x revoke session", "esc back", "l lock/unlock", "v sessions", "q quit"]),
    ], ids=["main", "per-call-selected", "sessions"])
    async def test_every_footer_key_is_on_screen(self, press: list[str], keys: list[str]) -> None:
        app = offline_app()
        async with app.run_test(size=SMALL) as pilot:
            await fed(pilot)
            await pilot.press(*press)
            await pilot.pause()
            footer = footer_text(app)
        assert [k for k in keys if k not in footer] == [], footer


class TestRecordedPayloads:
    @pytest.mark.timeout(120)
    async def test_recorded_payloads_match_live_daemon(self, sandbox: Sandbox) -> None:
        """The fields of recorded notifications are exactly those a real daemon sends."""
        sandbox.start_daemon()
        seen: dict[str, dict[str, Any]] = {}
        got_request = asyncio.Event()

        def record(method: str, params: dict[str, Any]) -> None:
            seen.setdefault(method, params)
            if method == "approval.requested":
                got_request.set()

        client, _ = await connect_approver(VaultHome(sandbox.home), "recorder", record)
        agent = await start_agent(sandbox, "call('create_issue', title='x')\ncall('create_issue', title='y')\n")
        try:
            await asyncio.wait_for(got_request.wait(), 60)
            rid = seen["approval.requested"]["request_id"]
            await client.request("decide", request_id=rid, decision="allow_session")
            await agent.finish()
        finally:
            agent.kill()
            await client.close()
        assert set(PENDING[0]) == set(seen["approval.requested"])
        assert set(SESSIONS[0]) == set(seen["session.opened"])
        assert set(GRANTS[0]) == set(seen["grant.created"])
        recorded = {m: p for m, p in reversed(ACTIVITY)}
        assert set(recorded["activity"]) == set(seen["activity"])
        assert set(recorded["approval.settled"]) == set(seen["approval.settled"])
