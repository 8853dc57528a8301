"""Red team 28: a hostile agent spells what a scripted approver's deny rule names so that the rule
misses it and the blanket allow after it lets the call through.

A real daemon, `vaultsim approve --script` with the rules a CI job would write, and the standalone
hostile agent `tests/agents/rt28t_x.py` (one process, one session) sending each spelling. What is
checked is what the agent was answered: `approval_denied` where a person reading the value would
see what the deny rule names. Spellings already pinned (case, fullwidth, accents, a mixed-script
word, zero-width, a cut tail) are in tests/test_approver_spoofing.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Sandbox
from vault.runner import world_procs

pytestmark = pytest.mark.timeout(120)

AGENT = Path(__file__).parent / "agents" / "rt28t_x.py"
PASSED_GATE = "local_failure"  # no remote configured: an allowed call stops at the executor


def hostile(sandbox: Sandbox, agent: str, calls: list[dict[str, Any]]) -> list[str]:
    """Run the hostile agent with these calls; the category (or error) each one got."""
    spec = json.dumps({"agent": agent, "calls": calls})
    env = world_procs.agent_env(sandbox.env, sandbox.agent_sock, "run-1", {"RT28_SPEC": spec})
    proc = subprocess.run([sys.executable, str(AGENT), "spec"], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["open"], lines[0]
    return [(x["result"] or {}).get("category") or f"error {x['error']}" for x in lines if "i" in x]


def update(value: str) -> dict[str, Any]:
    return {"op": "update_record", "params": {"record_id": "dns-1", "value": value}}


class TestDenyRulesReadAsAPersonReads:
    def test_blanks_and_whole_word_lookalikes_do_not_slip_past_a_deny(self, sandbox: Sandbox) -> None:
        """`deny value: drop table*`, `*exec*`, `release_id: prod*`, then allow the rest: a doubled
        blank, a tab, a leading blank and a word wholly of Cyrillic look-alikes (`ехес`) were
        allowed; each is denied now, and honest values still go through."""
        sandbox.start_daemon()
        sandbox.start_approver([
            {"match": {"operation": "update_record", "params": {"value": "drop table*"}}, "decide": "deny"},
            {"match": {"operation": "update_record", "params": {"value": "*exec*"}}, "decide": "deny"},
            {"match": {"operation": "delete_release", "params": {"release_id": "prod*"}}, "decide": "deny"},
            {"match": {}, "decide": "allow_once"}])
        tricks = [update("drop  table users"), update("drop\ttable users"), update(" drop table users"),
                  update("\u0435\u0445\u0435\u0441 rm -rf /srv"),  # Cyrillic е х е с: reads "exec"
                  {"op": "delete_release", "params": {"release_id": " prod-1"}}]
        honest = [update("dropped tablets"), update("execution"[1:]),  # "xecution" holds no "exec"
                  {"op": "delete_release", "params": {"release_id": "staging-1"}}]
        got = hostile(sandbox, "triage-bot", tricks + honest)
        assert ["approval_denied"] * len(tricks) + [PASSED_GATE] * len(honest) == got

    def test_a_blank_before_the_agent_name_does_not_slip_past_a_deny(self, sandbox: Sandbox) -> None:
        """`deny agent: intern-*`: a session opened as ` intern-bot` or `  intern-bot` is the same
        name to a reader and is denied; another agent is allowed."""
        sandbox.start_daemon()
        sandbox.start_approver([{"match": {"agent": "intern-*"}, "decide": "deny"},
                                {"match": {}, "decide": "allow_once"}])
        call = [{"op": "delete_release", "params": {"release_id": "v1.4.2"}}]
        got = [hostile(sandbox, name, call)[0] for name in (" intern-bot", "  intern-bot", "helper")]
        assert ["approval_denied", "approval_denied", PASSED_GATE] == got


class TestTypeTricks:
    def test_a_list_or_number_in_place_of_a_string_never_reaches_a_rule(self, sandbox: Sandbox) -> None:
        """`["prod-1"]`, `{"id": "prod-1"}` or a number where the catalog declares a string would be
        matched as JSON text (`["prod-1"]` misses `prod*`): the vault refuses each (-32602, nothing
        done) before anyone is asked, so no rule ever sees one."""
        sandbox.start_daemon()
        approver = sandbox.start_approver([
            {"match": {"operation": "delete_release", "params": {"release_id": "prod*"}}, "decide": "deny"},
            {"match": {}, "decide": "allow_once"}])
        got = hostile(sandbox, "triage-bot", [
            {"op": "delete_release", "params": {"release_id": ["prod-1"]}},
            {"op": "delete_release", "params": {"release_id": {"id": "prod-1"}}},
            {"op": "delete_release", "params": {"release_id": 1}},
            {"op": "update_record", "params": {"record_id": "dns-1", "value": ["drop table users"]}}])
        assert all(g.startswith("error {'code': -32602") for g in got), got  # bad params: nothing done
        assert "" == Path(approver.log_path).read_text()  # type: ignore[attr-defined]
