"""The approver TUI driven with Pilot against a real daemon and real agent processes.

Each test starts a daemon subprocess (Sandbox), opens `VaultApp` on its home
with `run_test()`, starts agents as fresh processes and presses keys. What is
checked is what the daemon counted (`stats`) and what the agent received (its
Result), not only what the screen says. Allowed calls end in `local_failure`
("service not configured") because these daemons have no remote: the call
went through the gate, which is what these tests are about.
"""

from __future__ import annotations

import asyncio

import pytest

from helpers import Sandbox, stop_process
from tui.screens.confirm import ConfirmUnlock
from tui.screens.main import MainScreen
from tui.screens.sessions import SessionsScreen
from tui.widgets.detail import RequestDetail
from tui.widgets.pending import PendingTable
from tui.widgets.sessions_table import SessionsTable
from tui.widgets.status import StatusBar
from tui_fixtures import (Agent, agent, agents, daemon_stats, daemon_status, main, rows,  # noqa: F401
                          text_of, tui, until)

pytestmark = pytest.mark.timeout(120)

PASSED_GATE = "local_failure"  # no remote configured: allowed calls stop at the executor


class TestPending:
    async def test_pending_request_appears_with_context(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """A call that needs approval shows agent, pid, operation, risk, params, owner, countdown, meanings."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='flaky test')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            table = main(pilot).query_one(PendingTable)
            cells = [str(c) for c in table.get_row_at(0)]
            assert ["stub", str(a.pid), "create_issue", "create", "any"] == cells[:5]
            assert cells[5] in {"2:00", "1:59", "1:58"}  # 120 s policy deadline, counting down
            assert 'title="flaky test"' == cells[6]  # quoted: a value cannot pass for another parameter
            detail = text_of(main(pilot).query_one(RequestDetail))
            assert "allow once: this call only" in detail
            assert f"allow for session: create_issue on tracker until process {a.pid} exits" in detail
            assert "s" in pilot.app.screen.active_bindings
            await pilot.press("d")
            assert (await a.next())["category"] == "approval_denied"

    async def test_agent_chosen_text_cannot_steer_the_screen(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """A bidi override in a parameter is shown as its escape: the row reads as what was sent."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='fix \u202edelete everything')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            cells = [str(c) for c in main(pilot).query_one(PendingTable).get_row_at(0)]
            assert cells[6].startswith('title="fix \\u202edelete') and "\u202e" not in cells[6]
            detail = text_of(main(pilot).query_one(RequestDetail))
            assert "\u202e" not in detail and "\\u202e" in detail
            await pilot.press("d")
            assert (await a.next())["category"] == "approval_denied"


class TestDecisions:
    @pytest.mark.parametrize(("key", "decision", "calls", "category"), [
        ("o", "allow_once", 1, PASSED_GATE),
        ("s", "allow_session", 2, PASSED_GATE),
        ("d", "deny", 1, "approval_denied"),
    ], ids=["allow-once", "allow-session", "deny"])
    async def test_key_decides_at_daemon_and_agent(self, sandbox: Sandbox, agents: list[Agent], key: str,
                                                   decision: str, calls: int, category: str) -> None:
        """`o`, `s`, `d` reach the daemon as that decision and the agent gets the matching Result."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n" * calls)
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await pilot.press(key)
            results = await a.finish()
            await until(pilot, lambda: rows(pilot) == 0, "the request to leave the list")
        assert [category] * calls == [r["category"] for r in results]
        if category == "approval_denied":
            assert "never" == results[0]["retry"]
        else:
            assert "not configured" in results[0]["message"]  # it went past the gate
        s = await asyncio.to_thread(daemon_stats, sandbox)
        assert {decision: 1} == s["decisions"]
        assert 1 == s["prompts"]  # with allow_session the second call was not asked

    async def test_allow_session_not_offered_for_per_call(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """delete_release is per_call: `s` is hidden and does nothing; `o` still works."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('delete_release', release_id='r-1')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            assert "s" not in pilot.app.screen.active_bindings
            assert {"o", "d"} <= set(pilot.app.screen.active_bindings)
            assert "not offered" in text_of(main(pilot).query_one(RequestDetail))
            await pilot.press("s")
            assert [] == pilot.app.sent  # nothing was sent for `s`
            assert 1 == rows(pilot)
            await pilot.press("o")
            result = await a.next()
        assert PASSED_GATE == result["category"]
        s = await asyncio.to_thread(daemon_stats, sandbox)
        assert {"allow_once": 1} == s["decisions"]
        assert 0 == s["destructive_session_grants"]


class TestLock:
    async def test_lock_settles_pending_and_unlock_confirms(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """`l` with a request pending: the daemon locks, the agent is denied; unlocking asks first."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await pilot.press("l")
            result = await a.next()
            assert "approval_denied" == result["category"]
            assert "locked" in result["message"]
            await until(pilot, lambda: pilot.app.state.locked and rows(pilot) == 0, "the locked state")
            assert " LOCKED " in text_of(main(pilot).query_one(StatusBar))
            assert (await asyncio.to_thread(daemon_status, sandbox))["locked"] is True
            await pilot.press("l")
            assert isinstance(pilot.app.screen, ConfirmUnlock)
            await pilot.press("n")  # the safe answer first: still locked
            assert isinstance(pilot.app.screen, MainScreen)
            assert ("unlock", {}) not in pilot.app.sent
            await pilot.press("l", "y")
            await until(pilot, lambda: pilot.app.state.locked is False, "the unlocked state")
            assert (await asyncio.to_thread(daemon_status, sandbox))["locked"] is False
        assert {"locked": 1} == (await asyncio.to_thread(daemon_stats, sandbox))["decisions"]


class TestSessions:
    async def test_revoked_grant_makes_next_call_prompt(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """A session grant revoked in the sessions view: the agent's next call is asked again."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='a')\ncall('create_issue', title='b')\n"
                                             "pause()\ncall('create_issue', title='c')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the first request")
            await pilot.press("s")
            assert [PASSED_GATE, PASSED_GATE] == [(await a.next())["category"] for _ in range(2)]
            assert {"paused": True} == await a.next()
            assert 1 == (await asyncio.to_thread(daemon_stats, sandbox))["prompts"]
            await pilot.press("v")
            screen = pilot.app.screen
            assert isinstance(screen, SessionsScreen)
            table = screen.query_one(SessionsTable)
            await until(pilot, lambda: table.row_count == 2, "the session and its grant")
            assert "create_issue on tracker until process" in " ".join(str(c) for c in table.get_row_at(1))
            await pilot.press("down", "r")
            await until(pilot, lambda: table.row_count == 1, "the grant to end")
            await pilot.press("escape")
            await a.resume()
            await until(pilot, lambda: rows(pilot) == 1, "the call to be asked again")
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["category"]
        s = await asyncio.to_thread(daemon_stats, sandbox)
        assert 2 == s["prompts"]
        assert {"allow_session": 1, "deny": 1} == s["decisions"]


class TestConnection:
    async def test_reconnects_after_daemon_restart(self, sandbox: Sandbox) -> None:
        """Daemon stops: DISCONNECTED; a new daemon (locked) on the same home: connected and LOCKED."""
        first = sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            status = main(pilot).query_one(StatusBar)
            assert " UNLOCKED " in text_of(status)
            stop_process(first)
            await until(pilot, lambda: not pilot.app.state.connected, "the disconnect to show")
            assert "DISCONNECTED" in text_of(status)
            sandbox.start_daemon(unlocked=False)
            await until(pilot, lambda: pilot.app.state.connected, "the reconnect")
            await until(pilot, lambda: " LOCKED " in text_of(status), "the locked state to show")
            assert status.has_class("-locked")
