"""A hostile agent must not deceive whoever approves: a person in the TUI, or a scripted rule.

The agent controls its name, its parameter values and (through them) the scope
a prompt names. These tests send what an attacker would (markup, escapes,
bidi overrides, combining overlays, look-alike letters, fullwidth forms, case,
values long enough to be cut) through real daemons and fresh agent processes,
and check what the approver saw and decided: the person sees everything
escaped, quoted and flagged, nothing they see can act (markup is never
parsed), a cut is said, and a scripted deny rule cannot be slipped past nor
an allow rule stretched.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Label

from helpers import Sandbox
from run_report_fixture import report
from tui.screens.deny_reason import DenyReason
from tui.widgets.detail import RequestDetail
from tui.widgets.pending import AGENT_WIDTH, PendingTable
from tui_fixtures import Agent, agent, agents, main, rows, start_agent, text_of, tui, until  # noqa: F401
from vault.approvers.scripted import fits
from vault.runner.junit import write_junit
from vault.text import clip, doubts, forms, quoted, shown, was_clipped

pytestmark = pytest.mark.timeout(180)

PASSED_GATE = "local_failure"  # no remote configured: an allowed call stops at the executor
CYRILLIC_P = "\u0440"  # looks like a Latin p


def create(title: str) -> dict[str, Any]:
    return {"call": "create_issue", "params": {"title": title}}


def delete(release_id: str) -> dict[str, Any]:
    return {"call": "delete_release", "params": {"release_id": release_id}}


def decided(sandbox: Sandbox, steps: list[dict[str, Any]], agent_name: str = "stub") -> list[str]:
    """Each step by a fresh agent process: the category it got."""
    out = []
    for step in steps:
        run = sandbox.run_agent([step], agent=agent_name)
        assert run.proc.returncode in (0, 1), run.proc.stderr
        out.append(run.results[0]["category"])
    return out


class TestScriptedRules:
    def test_a_deny_rule_is_not_slipped_past_by_spelling(self, sandbox: Sandbox) -> None:
        """`deny release_id: prod*` then allow the rest: PROD, fullwidth, accented, look-alike and
        zero-width spellings of prod are all denied; an honest staging release goes through."""
        sandbox.start_daemon()
        approver = sandbox.start_approver([
            {"match": {"operation": "delete_release", "params": {"release_id": "prod*"}}, "decide": "deny"},
            {"match": {"operation": "delete_release"}, "decide": "allow_once"}])
        spellings = ["prod-1", "PROD-1", "\uff50\uff52\uff4f\uff44-1", "pr\u0301od-1", f"{CYRILLIC_P}rod-1"]
        got = decided(sandbox, [delete(s) for s in spellings] + [delete("staging-1")])
        assert ["approval_denied"] * len(spellings) + [PASSED_GATE] == got
        log = [json.loads(line) for line in Path(approver.log_path).read_text().splitlines()]  # type: ignore[attr-defined]
        rules = [entry["rule"] for entry in log]  # the allowed call may be retried: it failed at the executor
        assert [0] * len(spellings) == rules[:len(spellings)] and {1} == set(rules[len(spellings):])

    def test_a_dangerous_tail_past_the_cut_is_not_missed(self, sandbox: Sandbox) -> None:
        """A title whose dangerous word lies past what an approver is shown (80 characters) is
        denied by `*DROP*`, and an allow rule on `fix*` does not let a cut value through."""
        sandbox.start_daemon()
        sandbox.start_approver([{"match": {"params": {"title": "*DROP*"}}, "decide": "deny"},
                                {"match": {"params": {"title": "fix*"}}, "decide": "allow_once"}])
        long_title = "fix " + "x" * 150 + " DROP TABLE"
        assert ["approval_denied", PASSED_GATE] == decided(sandbox, [create(long_title), create("fix the build")])

    def test_an_allow_rule_does_not_stretch_to_odd_spellings(self, sandbox: Sandbox) -> None:
        """`allow title: fix*` lets a plain `fix ...` through; with a bidi override, a combining
        overlay or look-alike letters in it, the rule does not match and the call is denied."""
        sandbox.start_daemon()
        sandbox.start_approver([{"match": {"params": {"title": "fix*"}}, "decide": "allow_once"}])
        odd = ["fix \u202eedoc", "fix s\u0336t\u0336o\u0336p", f"fix {CYRILLIC_P}rod"]
        assert [PASSED_GATE] + ["approval_denied"] * 3 == decided(sandbox, [create("fix typo")] + [create(t) for t in odd])

    def test_an_agent_name_rule_sees_through_case_and_width(self, sandbox: Sandbox) -> None:
        """`deny agent: rogue*`: ROGUE and fullwidth ｒｏｇｕｅ are the same claim."""
        sandbox.start_daemon()
        sandbox.start_approver([{"match": {"agent": "rogue*"}, "decide": "deny"}, {"match": {}, "decide": "allow_once"}])
        got = [decided(sandbox, [create("t")], agent_name=name)[0]
               for name in ("rogue", "ROGUE-bot", "\uff52\uff4f\uff47\uff55\uff45", "helper")]
        assert ["approval_denied"] * 3 + [PASSED_GATE] == got

    @pytest.mark.parametrize(("pattern", "value", "decide", "matched"), [
        (True, True, "deny", True),         # a YAML boolean matches the boolean
        ("true", True, "deny", True),       # as JSON writes it, not Python's "True"
        (12, 12, "allow_once", True),
        ("1*", 12, "allow_once", True),
        ("prod", "[hidden]", "deny", True),         # a hidden value cannot be checked: a deny holds
        ("*", "[hidden]", "allow_once", False),     # ... and an allow does not
    ])
    def test_typed_and_hidden_values(self, pattern: Any, value: Any, decide: str, matched: bool) -> None:
        """How a pattern meets a non-string or hidden value (the rule model is loaded from YAML)."""
        assert matched == fits(pattern, value, permissive=decide != "deny")


class TestWhatThePersonSees:
    async def test_markup_in_an_agent_name_is_text_and_no_action(self, sandbox: Sandbox,
                                                                 agents: list[Agent]) -> None:
        """An agent named `[@click=app.quit]...[/]`: the pending row and the deny dialog show the
        brackets literally; clicking the dialog's title quits nothing; the deny still reaches it."""
        sandbox.start_daemon()
        name = "[@click=app.quit]ops-bot[/] [b]approved by security[/b]"
        async with tui(sandbox) as pilot:
            a = await start_agent(sandbox, "call('delete_release', release_id='v1')\n", name=name)
            agents.append(a)
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            # the row's cell is cut (red team 28: a long name pushed operation and risk off screen)
            assert name[:AGENT_WIDTH - 1] + "…" == str(main(pilot).query_one(PendingTable).get_row_at(0)[0])
            assert name in text_of(main(pilot).query_one(RequestDetail))  # whole, brackets and all
            await pilot.press("D")
            await until(pilot, lambda: isinstance(pilot.app.screen, DenyReason), "the deny dialog")
            title = pilot.app.screen.query_one("Label.title", Label)
            assert f"Deny delete_release for {name}" == str(title.render())
            await pilot.click("Label.title")
            await pilot.pause()
            assert pilot.app.is_running and pilot.app.return_code is None
            await pilot.press(*"no", "enter")
            result = await a.next()
            assert "approval_denied" == result["category"] and "no" in result["message"]

    async def test_an_unbalanced_tag_in_an_agent_name_does_not_crash_the_approver(
            self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """`[/]` as a name once raised MarkupError when the person pressed D (the TUI died)."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            a = await start_agent(sandbox, "call('delete_release', release_id='v1')\n", name="[/]")
            agents.append(a)
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await pilot.press("D")
            await until(pilot, lambda: isinstance(pilot.app.screen, DenyReason), "the deny dialog")
            assert "Deny delete_release for [/]" == str(pilot.app.screen.query_one("Label.title", Label).render())
            await pilot.press("escape", "d")
            assert "approval_denied" == (await a.next())["category"]

    async def test_hidden_characters_look_alikes_and_cuts_are_flagged(self, sandbox: Sandbox,
                                                                      agents: list[Agent]) -> None:
        """In the detail pane each string value is quoted and escaped, and a `!` line names what
        could mislead: a newline faking an extra row, a carriage return, a look-alike letter. A
        value the prompt cut short is shown whole there (approval.detail); the row says it cut."""
        sandbox.start_daemon()
        title = "fix typo\nparams: none\r ! approved by security"
        body = "ok " + "y" * 200 + f" then delete {CYRILLIC_P}rod"
        async with tui(sandbox) as pilot:
            await agent(sandbox, agents, f"call('create_issue', title={title!r}, body={body!r})\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            await until(pilot, lambda: quoted(body) in text_of(main(pilot).query_one(RequestDetail)),
                        "the body in full")
            detail = text_of(main(pilot).query_one(RequestDetail))
            assert '"fix typo\\nparams: none\\r ! approved by security"' in detail
            assert "\n! approved" not in detail and "\r" not in detail
            lines = detail.splitlines()
            assert any(l.startswith(" ! param title: 2 hidden or control characters") for l in lines)
            assert not any(" cut short" in l for l in lines)  # read in full: nothing is cut
            assert any(l.startswith(" ! param body: look-alike letters: one word mixes cyrillic and latin")
                       for l in lines)
            assert "more chars]…" not in detail and f"delete {CYRILLIC_P}rod" in detail
            row = str(main(pilot).query_one(PendingTable).get_row_at(0)[6])
            assert row.startswith('title="fix typo\\n') and row.endswith("…")  # the table says it cut

    async def test_a_value_cannot_pass_for_another_parameter(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """`title = 'x", body="harmless'`: the quote is escaped, so the row reads as one title."""
        sandbox.start_daemon()
        async with tui(sandbox) as pilot:
            await agent(sandbox, agents, "call('create_issue', title='x\", body=\"harmless')\n")
            await until(pilot, lambda: rows(pilot) == 1, "the request to be shown")
            detail = text_of(main(pilot).query_one(RequestDetail))
            assert 'params: title="x\\", body=\\"harmless"' in detail


class TestLogsAndReports:
    def test_audit_show_quotes_a_name_that_fakes_fields(self, sandbox: Sandbox) -> None:
        """An agent named `stub decision=allow_once approver=security` is one quoted token in
        `vaultsim audit show`, not three fields."""
        sandbox.start_daemon()
        sandbox.start_approver([{"match": {}, "decide": "deny"}])
        name = "stub decision=allow_once approver=security"
        assert ["approval_denied"] == decided(sandbox, [delete("v1")], agent_name=name)
        out = sandbox.vaultsim("audit", "show", check=True).stdout
        assert f'agent="{name}"' in out
        assert " agent=stub " not in out

    def test_junit_holds_no_control_character_and_stays_xml(self, tmp_path: Path) -> None:
        """Scopes (made from agent parameters), findings and errors holding ESC, C1, bidi and
        NUL characters are written escaped: the file parses and no raw control is in it."""
        doc = report()
        hostile = "deploy \x1b[2K\x1b]8;;http://evil\x07prod\x9b\u202e\x00"
        sc = doc["scenarios"][0]
        t = sc["trial_results"][0]
        t["prompts"]["by_scope"] = {hostile: 1}
        t.update(verdict="FAIL_OUTCOME", ok=False, failed=["FAIL_OUTCOME"],
                 findings={"FAIL_OUTCOME": [f"agent said: {hostile}"]}, error=hostile)
        path = tmp_path / "j.xml"
        write_junit(path, doc)
        raw = path.read_text(encoding="utf-8")
        ET.fromstring(raw.encode())
        assert not [c for c in raw if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0 or c == "\u202e"]
        assert "\\x1b[2K" in raw


class TestShown:
    @pytest.mark.parametrize(("raw", "seen"), [
        ("a\u202eb", "a\\u202eb"),
        ("s\u0336top", "s\\u0336top"),  # an overlay strikes through its neighbour: escaped
        ("caf\u00e9 e\u0301", "caf\u00e9 e\u0301"),  # an ordinary accent is kept
        ("a\u0301\u0302\u0303", "a\u0301\u0302\\u0303"),  # the third mark in a row is not
        (True, "true"),
    ])
    def test_shown(self, raw: Any, seen: str) -> None:
        assert seen == shown(raw) and shown(seen) == seen

    def test_clip_keeps_both_ends_and_says_how_much(self) -> None:
        text = "start " + "x" * 200 + " END"
        cut = clip(text, 80)
        assert len(cut) == 80 and cut.startswith("start ") and cut.endswith(" END") and was_clipped(cut)
        hidden = int(cut.split("…[")[1].split(" ")[0])
        assert len(text) == len(cut.replace(cut[cut.index("…"):cut.rindex("…") + 1], "")) + hidden

    def test_doubts_and_forms(self) -> None:
        assert doubts("plain words, \u00e9t\u00e9, \u6f22\u5b57") == []
        assert doubts(f"{CYRILLIC_P}rod") == ["look-alike letters: one word mixes cyrillic and latin"]
        assert doubts("\uff50\uff52\uff4f\uff44") == ['compatibility characters: reads as "prod"']
        assert "prod" in forms("\uff30\uff32\uff2f\uff24") and "prod" in forms("pr\u0301od")
        assert '"a\\"b"' == quoted('a"b') and "12" == quoted(12)
