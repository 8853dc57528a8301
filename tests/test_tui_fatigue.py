"""The approver TUI as a person's pace meter, driven with Pilot against a real daemon.

The TUI tells the vault when a request's row appeared and when its detail was
shown; the vault times each decision from there (`vault.gate.fatigue`). What is
checked is what the daemon recorded (`stats`, the fatigue figures) and what the
agent received, besides what the meter on screen says.
"""

from __future__ import annotations

import time

import pytest

from helpers import Sandbox
from tui.screens.deny_reason import DenyReason
from tui.widgets.counters import PromptCounters
from tui_fixtures import Agent, agent, agents, daemon_stats, main, rows, text_of, tui, until  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def fatigue(sandbox: Sandbox) -> dict:
    return daemon_stats(sandbox).get("fatigue") or {}


class TestDecisionTiming:
    async def test_shown_detail_and_decided_are_recorded_by_the_vault(self, sandbox: Sandbox,
                                                                       agents: list[Agent]) -> None:
        """The row and its detail are reported seen once each; the vault times the decision from them."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            rid = main(pilot).selected_request().request_id
            await until(pilot, lambda: (rid, True) in pilot.app.seen_sent, "the detail to be reported")
            assert [(rid, False), (rid, True)] == sorted(pilot.app.seen_sent)
            await pilot.press("o")
            await a.next()
            f = await until(pilot, lambda: fatigue(sandbox).get("latency_s", {}).get("count") == 1 and fatigue(sandbox),
                            "the decision to be timed")
            assert 0 == f["detail_not_viewed"]
            assert f["latency_s"]["p50"] is not None and f["latency_s"]["p50"] < 30
            assert ["human"] == list(f["by_approver"])

    async def test_approval_right_after_display_is_a_rubber_stamp(self, sandbox: Sandbox,
                                                                  agents: list[Agent]) -> None:
        """`o` pressed as soon as the row shows is counted a rubber-stamp, by the vault and on the meter."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await pilot.press("o")
            await a.next()
            f = await until(pilot, lambda: fatigue(sandbox).get("rubber_stamps") and fatigue(sandbox),
                            "the rubber-stamp to be counted")
            assert 1 == f["rubber_stamps"]
            assert 1 == f["by_approver"]["human"]["rubber_stamps"]
            meter = text_of(main(pilot).query_one(PromptCounters))
            assert "1 rubber-stamps" in meter
            assert "slow down: approved" in meter

    async def test_considered_approval_is_not_a_rubber_stamp(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """Detail open and two seconds of reading before `o`: not a rubber-stamp, no warning."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            rid = main(pilot).selected_request().request_id
            await until(pilot, lambda: rid in pilot.app.state.detail_at, "the detail to be shown")
            shown = time.time()
            # the person reads for two seconds: the app keeps running while the test waits on the clock
            await until(pilot, lambda: time.time() - shown >= 2.0, "two seconds of reading")
            await pilot.press("o")
            await a.next()
            f = await until(pilot, lambda: fatigue(sandbox).get("latency_s", {}).get("count") == 1 and fatigue(sandbox),
                            "the decision to be timed")
            assert 0 == f["rubber_stamps"]
            assert f["latency_s"]["p50"] >= 2.0
            meter = text_of(main(pilot).query_one(PromptCounters))
            assert "0 rubber-stamps" in meter and "slow down" not in meter


class TestDenyWithReason:
    async def test_shift_d_sends_a_reason_the_agent_receives(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """`D`, a note, enter: the agent's approval_denied Result carries the note and not the approver's name."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await pilot.press("D")
            await until(pilot, lambda: isinstance(pilot.app.screen, DenyReason), "the reason dialog")
            await pilot.press(*"use staging", "enter")
            result = await a.next()
            assert "approval_denied" == result["category"]
            assert "the approver's reason: use staging" in result["message"]
            assert "human" not in result["message"]
            assert ("decide", {"request_id": result["request_id"], "decision": "deny",
                               "reason": "use staging"}) in pilot.app.sent
            f = await until(pilot, lambda: fatigue(sandbox).get("denied_with_reason") and fatigue(sandbox),
                            "the denial to be counted")
            assert 1 == f["denied_with_reason"]

    async def test_escape_decides_nothing(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """Escape in the reason dialog leaves the request pending."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await agent(sandbox, agents, "call('create_issue', title='x')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await pilot.press("D")
            await until(pilot, lambda: isinstance(pilot.app.screen, DenyReason), "the reason dialog")
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(pilot.app.screen, DenyReason), "the dialog to close")
            assert [] == [s for s in pilot.app.sent if s[0] == "decide"]
            assert 1 == rows(pilot)
            await pilot.press("d")  # then a plain deny: the agent ends with no reason in its Result
            result = await a.next()
            assert result["message"].endswith("was denied by the approver; nothing was sent")
            await a.finish()


class TestOffline:
    async def test_only_rows_on_screen_are_reported_seen(self) -> None:
        """Sixty pending requests on a 24-line terminal: the rows on screen are reported, the rest are not."""
        from tui.messages import DaemonNotice, LinkUp
        from tui_fixtures import offline_app, request

        app = offline_app()
        async with app.run_test(size=(80, 24)) as pilot:
            app.post_message(LinkUp([], locked=False))
            for i in range(60):
                app.post_message(DaemonNotice("approval.requested", request(
                    f"r-{i:04d}", "create_issue", "create", {"title": f"t{i}"}, "create_issue on tracker",
                    created=-60 + i)))
            await until(pilot, lambda: rows(pilot) == 60, "the rows")
            await until(pilot, lambda: ("r-0000", True) in app.seen_sent, "the first row's detail")
            shown = {rid for rid, detail in app.seen_sent if not detail}
            assert "r-0000" in shown
            assert 0 < len(shown) < 20 and "r-0059" not in shown

    async def test_meter_counts_recent_prompts_and_warns_at_ten(self) -> None:
        """Ten prompts within five minutes: the meter says so and suggests asking less."""
        from tui.messages import DaemonNotice, LinkUp
        from tui_fixtures import offline_app, request

        app = offline_app()
        async with app.run_test(size=(160, 50)) as pilot:
            app.post_message(LinkUp([], locked=False))
            for i in range(10):
                app.post_message(DaemonNotice("approval.requested", request(
                    f"r-{i:04d}", "create_issue", "create", {"title": f"t{i}"}, "create_issue on tracker")))
            await until(pilot, lambda: rows(pilot) == 10, "the rows")
            await pilot.pause()
            meter = text_of(main(pilot).query_one(PromptCounters))
            assert "Fatigue: 10 prompts in 5 min · 0 rubber-stamps" in meter
            assert "10 prompts in 5 min: a session grant or `vaultsim policy suggest` would ask less" in meter
