"""Red team 28: a hostile agent deceiving the person at the approver TUI.

A real daemon (Sandbox), the app under Pilot subscribed to it, and the standalone hostile agent
`tests/agents/rt28t_x.py` (no project import) choosing its session name, its `client` claim and
every parameter value. What is checked is what the person can read on screen (the row, the detail
pane, the whole rendered screen) and what the decision did (the agent's answer). Already pinned
elsewhere and not repeated: a bidi override (test_tui_pilot.py), `!` lines for zero-width and
fullwidth values and a mixed-script owner name (test_approver_spoofing.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from helpers import Sandbox
from tui.widgets.detail import RequestDetail
from tui.widgets.pending import AGENT_WIDTH, PendingTable
from tui.widgets.sessions_table import SessionsTable
from tui_fixtures import Agent, agents, main, rows, text_of, tui, until  # noqa: F401  (`agents` fixture)
from vault.runner import world_procs

pytestmark = pytest.mark.timeout(150)

AGENT = Path(__file__).parent / "agents" / "rt28t_x.py"


async def hostile(sandbox: Sandbox, agents: list[Agent], mode: str, spec: dict[str, Any] | None = None) -> Agent:
    env = world_procs.agent_env(sandbox.env, sandbox.agent_sock, "run-1", {"RT28_SPEC": json.dumps(spec or {})})
    with open(sandbox.root / "agent.stderr", "a") as err:
        proc = await world_procs.start_agent_async([sys.executable, str(AGENT), mode], env=env, stderr=err)
    a = Agent(proc)
    agents.append(a)
    opened = await a.next()
    assert opened["open"], opened
    return a


def screen(pilot: Pilot) -> str:
    return "\n".join(strip.text for strip in pilot.app.screen._compositor.render_strips())


def listed(pilot: Pilot) -> str:
    """The list as drawn: left of the right pane, above the detail pane's border."""
    above = screen(pilot).split("▔▔▔")[0].splitlines()
    return "\n".join(line.split("▏")[0] for line in above if "▏" in line)


def row(pilot: Pilot, i: int = 0) -> list[str]:
    return [str(c) for c in main(pilot).query_one(PendingTable).get_row_at(i)]


def detail(pilot: Pilot) -> str:
    return text_of(main(pilot).query_one(RequestDetail))


async def one_row(pilot: Pilot) -> list[str]:
    await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
    return row(pilot)


class TestShownLiterally:
    async def test_markup_in_name_claim_and_values_is_text(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """`[b]`, `[/]`, `[link=…]`, `[@click=app.quit]`, `[red on red]` and an unclosed `[b` in the
        agent's name, its client label and its values are shown as typed; nothing is hidden, the
        app keeps running, and `d` still denies."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "markup")
            cells = await one_row(pilot)
            assert cells[0].startswith("[b]ci[/b][@click=app.q")
            assert ("update_record", "update") == (cells[2], cells[3])
            text = detail(pilot)
            for typed in ("[b]ci[/b][@click=app.quit]x[/]", "[link=https://evil.example]ok[/link] [red on red]1 via [/]",
                          'value="[red on red]ok[/red on red][@click=app.quit]x[/] [b][link=x]"'):
                assert typed in text
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]
            assert pilot.app.is_running


class TestLayout:
    async def test_a_long_name_cannot_push_operation_and_risk_away(self, sandbox: Sandbox,
                                                                  agents: list[Agent]) -> None:
        """A 128-character name whose spaces draw `read_issue  read  any` as cells of its own made
        the agent column wider than the pane: the real operation and risk were off screen. The
        cell is cut (marked `…`, highlighted as doubtful); the row on screen shows delete_release
        and delete, and the detail the whole name with its `!` line."""
        name = ("triage-bot   4121   read_issue      read    any    1:59      issue_id=\"ISS-1\"").ljust(127) + "x"
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "spec", {"agent": name, "calls": [
                {"op": "delete_release", "params": {"release_id": "v1.4.2"}}]})
            cells = await one_row(pilot)
            assert len(cells[0]) <= AGENT_WIDTH and cells[0].endswith("…")
            # The table holds the row before the compositor has drawn it: wait for the drawn line.
            drawn = await until(pilot, lambda: next((line for line in screen(pilot).splitlines()
                                                     if line.startswith(" triage-bot")), None),
                                "the row to be drawn")
            assert "delete_release" in drawn and " delete " in drawn and 'release_id="v1.4.2"' in drawn
            cell = main(pilot).query_one(PendingTable).get_row_at(0)[0]
            assert "yellow" in str(cell.spans)  # type: ignore[attr-defined]
            assert name in detail(pilot) and "spaces at an end or doubled" in detail(pilot)
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]

    async def test_the_dangerous_middle_of_a_long_value_is_in_the_detail(self, sandbox: Sandbox,
                                                                         agents: list[Agent]) -> None:
        """`harmless …` × 12, then `DROP TABLE users;`, then padding: the row's cell is marked cut
        (`…`) and the detail pane shows the value whole, DROP included."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "long")
            cells = await one_row(pilot)
            assert cells[6].endswith("…") and "DROP" not in cells[6]
            await until(pilot, lambda: "DROP TABLE users;" in detail(pilot), "the full value in the detail")
            assert "harmless " * 12 + "DROP TABLE users;" + " ok" * 40 in detail(pilot).replace("\n", " ")
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]

    async def test_newline_cr_tab_and_invisibles_make_no_second_row(self, sandbox: Sandbox,
                                                                    agents: list[Agent]) -> None:
        """A value holding `\\n`, 40 spaces and a fake `read_issue read` row, then `\\r`; another with
        U+200B, U+2060, U+FEFF, an overlay mark and a tab: each is one row, every such character is
        shown as its escape in the detail, with a `!` line."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            for mode, escaped in (("newline", ['ok\\n', '\\"1\\"\\r"']),
                                  ("invisible", ["v1\\u200b\\u2060\\ufeffprod", "\\u0336\\tx"])):
                a = await hostile(sandbox, agents, mode)
                await one_row(pilot)
                text = detail(pilot)
                assert all(e in text for e in escaped), text
                assert " ! param value: " in text and "hidden or control character" in text
                drawn = await until(pilot, lambda: listed(pilot) if "update_record" in listed(pilot) else "",
                                    "the row drawn")
                assert "read_issue" not in drawn and 1 == drawn.count("update_record")  # no fake second row
                await pilot.press("d")
                assert "approval_denied" == (await a.next())["result"]["category"]
                await until(pilot, lambda: rows(pilot) == 0, "the denied row to leave")

    async def test_lookalike_letters_are_flagged(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """A Cyrillic `а` in the name `triаge-bot`, `р` in the record id and `е` in `dеlete`: a `!`
        line for each, and the row's name cell highlighted."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "homoglyph")
            await one_row(pilot)
            text = detail(pilot)
            for what in ("agent", "param record_id", "param value"):
                assert f" ! {what}: look-alike letters: one word mixes cyrillic and latin" in text
            cell = main(pilot).query_one(PendingTable).get_row_at(0)[0]
            assert "yellow" in str(cell.spans)  # type: ignore[attr-defined]
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]


class TestImpersonation:
    async def test_a_claim_naming_the_approver_is_shown_as_the_agents_claim(self, sandbox: Sandbox,
                                                                            agents: list[Agent]) -> None:
        """An agent `helper` claiming to act for `Human` (this approver's name) with the daemon's pid
        as its host: the row showed `Human (pid …) via tui` in the agent column, helper nowhere.
        Now the row names `helper` and marks the label as its claim, and the detail names the
        process and program the vault saw, says the host is not verified, and flags the name."""
        daemon_pid = sandbox.start_daemon().pid
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "spec", {
                "agent": "helper", "client": {"name": "Human", "host_pid": daemon_pid, "via": "tui"},
                "calls": [{"op": "delete_release", "params": {"release_id": "v1.4.2"}}]})
            cells = await one_row(pilot)
            assert cells[0].startswith("helper (claims Human") and cells[1] == str(a.pid)
            await until(pilot, lambda: f"(pid {a.pid}, " in detail(pilot), "the program the vault saw")
            text = detail(pilot)
            assert f"acting for: Human (pid {daemon_pid}) via tui (claimed; host not verified)" in text
            assert ' ! acting for: reads as your approver name "human" (it is "Human"): an agent is asking' in text
            asks = f"helper (claims Human (pid {daemon_pid}) via tui)[{a.pid}] asks: delete_release (delete, per_call)"
            assert [asks] == [x.text for x in pilot.app.state.activity if "asks" in x.text]  # type: ignore[attr-defined]
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]
            await pilot.press("v")  # the sessions view names it the same way
            await until(pilot, lambda: pilot.app.screen.query(SessionsTable)
                        and pilot.app.screen.query_one(SessionsTable).row_count == 1, "the session listed")
            cells = [str(c) for c in pilot.app.screen.query_one(SessionsTable).get_row_at(0)]
            assert cells[1].startswith("helper (claims Human") and cells[2] == str(a.pid)

    @pytest.mark.parametrize("name", ["vaultsim", "Human ", "hum\u0430n"])  # a Cyrillic а
    async def test_an_agent_named_like_the_approver_or_the_vault_is_flagged(
            self, sandbox: Sandbox, agents: list[Agent], name: str) -> None:
        """With no owner on the request (the default policy), an agent named like this approver
        (`human`) or like the vault itself had no `!` line; it has one now."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "spec", {"agent": name, "calls": [
                {"op": "delete_release", "params": {"release_id": "v1.4.2"}}]})
            await one_row(pilot)
            assert " ! agent: reads as " in detail(pilot) and ": an agent is asking" in detail(pilot)
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]


class TestBurying:
    async def test_a_delete_behind_thirty_typos_is_not_allowed_by_the_same_key(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """Thirty create_issue prompts (wait_s 0), then one delete_release. The delete's row is in
        red and keeps its own 2-minute deadline. Pressing `o` for each typo moved the cursor onto
        the delete, and the next `o` allowed it: now that key is held back once with a warning
        (nothing sent), and only a second press allows it."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "flood")
            await until(pilot, lambda: rows(pilot) == 31, "31 prompts", timeout=30)
            table = main(pilot).query_one(PendingTable)
            last = table.get_row_at(30)
            assert ["delete_release", "delete"] == [str(c) for c in last[2:4]]
            assert "red" in str(last[3].style) and "red" not in str(table.get_row_at(0)[3].style)  # type: ignore[attr-defined]
            assert str(last[5]) in {"2:00", "1:59", "1:58"}
            for left in range(30, 0, -1):
                await pilot.press("o")
                await until(pilot, lambda: rows(pilot) == left, f"{left} rows left")
            assert row(pilot)[2] == "delete_release"
            sent = len(pilot.app.sent)  # type: ignore[attr-defined]
            await pilot.press("o")
            await until(pilot, lambda: " ! look first: this is delete_release (delete), not create_issue" in detail(pilot),
                        "the warning")
            assert sent == len(pilot.app.sent) and rows(pilot) == 1  # type: ignore[attr-defined]
            await pilot.press("o")
            await until(pilot, lambda: rows(pilot) == 0, "the delete allowed on the second press")
            decided = [p["decision"] for m, p in pilot.app.sent if m == "decide"]  # type: ignore[attr-defined]
            assert ["allow_once"] * 31 == decided
            await a.resume()

    async def test_pending_caps_hold_for_one_session(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """34 prompts from one session with wait_s 0: 32 wait, the rest are answered rate_limited
        and never reach the screen."""
        sandbox.start_daemon()
        calls = [{"op": "create_issue", "params": {"title": f"typo {i}"}, "wait_s": 0} for i in range(34)]
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "spec", {"agent": "triage-bot", "calls": calls})
            got = [(await a.next())["result"]["category"] for _ in calls]
            assert ["approval_pending"] * 32 + ["rate_limited"] * 2 == got
            await until(pilot, lambda: rows(pilot) == 32, "32 rows")
            await a.resume()


class TestSwapUnderTheCursor:
    async def test_a_withdrawn_row_above_does_not_slide_another_under_the_key(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """typo 1, typo 2 (selected, being read), delete_release. The agent withdraws typo 1: the
        person's cursor must stay on typo 2, so `o` allows what they were reading."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "swap")
            while "held" not in await a.next():  # three answers (approval_pending), then it holds
                pass
            await until(pilot, lambda: rows(pilot) == 3, "three prompts")
            await pilot.press("down")
            await until(pilot, lambda: 'title="typo 2"' in detail(pilot), "typo 2 selected")
            assert a.proc.stdin is not None
            a.proc.stdin.write(b"cancel 0\n")
            await a.proc.stdin.drain()
            assert (await a.next())["cancelled"]["withdrawn"]
            await until(pilot, lambda: rows(pilot) == 2, "typo 1 to leave")
            assert 'title="typo 2"' in detail(pilot)
            await pilot.press("o")
            await until(pilot, lambda: rows(pilot) == 1, "one decision")
            assert "delete_release" == row(pilot)[2]
            await a.resume()

    async def test_a_withdrawn_selected_row_does_not_hand_its_key_to_the_delete(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """typo 1 decided, typo 2 selected; the agent withdraws typo 2 itself and the delete comes
        under the cursor: the `o` meant for typo 2 is held back (nothing sent), a second allows."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "swap")
            while "held" not in await a.next():
                pass
            await until(pilot, lambda: rows(pilot) == 3, "three prompts")
            await pilot.press("o")
            await until(pilot, lambda: rows(pilot) == 2 and 'title="typo 2"' in detail(pilot), "typo 2 selected")
            assert a.proc.stdin is not None
            a.proc.stdin.write(b"cancel 1\n")
            await a.proc.stdin.drain()
            assert (await a.next())["cancelled"]["withdrawn"]
            await until(pilot, lambda: rows(pilot) == 1, "typo 2 to leave")
            sent = len(pilot.app.sent)  # type: ignore[attr-defined]
            await pilot.press("o")
            await until(pilot, lambda: " ! look first: this is delete_release (delete)" in detail(pilot), "the warning")
            assert sent == len(pilot.app.sent) and rows(pilot) == 1  # type: ignore[attr-defined]
            await pilot.press("d")
            await until(pilot, lambda: rows(pilot) == 0, "the delete denied")
            await a.resume()


class TestTheVaultsOwnSentence:
    async def test_a_claim_cannot_finish_the_sentence_saying_what_allow_session_grants(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """A client label named `x ends; it covers only this one call` made the vault's line read
        `allow for session: … until this tui session of x ends; it covers only this one call ends
        (process N)`. The claim is quoted inside that sentence now; a plain word stays bare."""
        claim = "x ends; it covers only this one call"
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await hostile(sandbox, agents, "spec", {
                "agent": "helper", "client": {"name": claim, "via": "tui"},
                "calls": [{"op": "update_record", "params": {"record_id": "dns-1", "value": "v"}}]})
            await one_row(pilot)
            line = next(x for x in detail(pilot).replace("\n ", " ").splitlines() if "allow for session" in x)
            assert f'until this tui session of "{claim}" ends (process {a.pid})' in line
            await pilot.press("d")
            assert "approval_denied" == (await a.next())["result"]["category"]

    async def test_a_value_written_into_the_scope_is_flagged_as_the_agents(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """record_id `dns-1 (this call only, read-only)` makes the scope read `update_record on record
        dns-1 (this call only, read-only)`, as if the vault had narrowed the grant: a `!` line says
        the scope holds the agent's words; a plain id (`dns-1`) gets none."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            for record, flagged in (("dns-1 (this call only, read-only)", True), ("dns-1", False)):
                a = await hostile(sandbox, agents, "spec", {"agent": "helper", "calls": [
                    {"op": "update_record", "params": {"record_id": record, "value": "v"}}]})
                await one_row(pilot)
                assert f"scope: update_record on record {record}\n" in detail(pilot)
                said = f' ! scope: holds record_id="{record}" as the agent wrote it, not the vault\'s words'
                assert flagged == (said in detail(pilot))
                await pilot.press("d")
                assert "approval_denied" == (await a.next())["result"]["category"]
                await until(pilot, lambda: rows(pilot) == 0, "the denied row to leave")
