"""The daemon's `foreign_reference` records (vault.daemon.agent_api): a lookup of a correlation id
no call of the agent and run can have, or a resume of a token the daemon never issued, is
recorded without the id or token; a lookup of the agent's own key (never sent) and of the id
of an answer the vault gave it (a refusal on its ended session) are not; a lookup by a key text
another agent sent and the looker had not is recorded without the text, and cleared by the
looker's own call under it. The runner's side (and another agent's token and call) is
tests/test_redteam_foreign36.py and tests/test_redteam_idemkey37.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from audit_daemon_helpers import events
from helpers import Sandbox, wait_for
from hostile_fixtures import run_script, setup
from test_unknown_operation import TRY
from vault.ids import scope
from vault.mcp.link import VaultLink, WaitPolicy


@pytest.mark.timeout(300)
def test_made_up_ids_and_tokens_are_recorded_and_its_own_lookups_are_not(sandbox: Sandbox) -> None:
    setup(sandbox)
    got = run_script(sandbox, TRY + (
        "old = client.open_session('alpha', 'run-1')\n"
        "client.request('session.close', session_id=old)\n"
        "first = attempt('call', session_id=old, operation='read_issue', params={'issue_id': 'ISS-1'})\n"
        "out(first)\n"
        "sid = client.open_session('alpha', 'run-1')\n"
        "out(attempt('lookup', session_id=sid, idempotency_key='alpha-step-never-sent'))\n"
        "out(attempt('lookup', session_id=sid, correlation_id=first['result']['correlation_id']))\n"
        "out(attempt('lookup', session_id=sid, correlation_id='c-made-up-canary'))\n"
        "out(attempt('call.resume', session_id=sid, resume_token='tok-made-up-canary', wait_s=0))\n"))
    assert got[0]["result"]["category"] == "authorization_denied", got
    assert [g["result"]["reconciled"] for g in got[1:4]] == ["unknown"] * 3, got
    assert got[4]["error"]["code"] == -32602, got

    def recorded() -> list[dict]:
        found = [e for e in events(sandbox) if e.get("type") == "foreign_reference"]
        return found if len(found) >= 2 else []
    found = wait_for(recorded, what="2 foreign_reference events")
    assert [(e["method"], e["whose"]) for e in found] == [("lookup", "unknown"), ("call.resume", "unknown")], found
    text = json.dumps(events(sandbox))
    assert "tok-made-up-canary" not in text  # a token is a secret, made up or not
    assert "c-made-up-canary" not in json.dumps(found)


@pytest.mark.timeout(300)
def test_a_lookup_by_another_agents_key_text_is_recorded_without_it_until_it_sends_that_key(
        sandbox: Sandbox) -> None:
    """Bravo asks about alpha's key text: answered for bravo's own key (`not_found`, nothing of
    alpha's), recorded (`by: idempotency_key`, whose alpha's, never the text). Alpha's own lookup
    and a text nobody sent are not. Bravo then sends that text as its own step's key (§5: two
    agents may pick one text): its call carries the record's ref, which clears it."""
    setup(sandbox)
    sandbox.start_approver([{"match": {}, "decide": "allow_once"}])

    def ask(agent: str, key: str) -> str:
        return (f"client.session_id = {agent}\n"
                f"out(attempt('lookup', session_id={agent}, idempotency_key={key!r}, operation='create_issue'))\n")

    def file(agent: str, key: str) -> str:
        return (f"client.session_id = {agent}\n"
                f"out(attempt('call', session_id={agent}, operation='create_issue', params={{'title': {agent!r}}},"
                f" idempotency_key={key!r}, wait_s=30))\n")
    got = run_script(sandbox, TRY + "a = client.open_session('alpha', 'run-1')\n"
                     "b = client.open_session('bravo', 'run-1')\n"
                     + file("a", "step-canary-1") + ask("b", "step-canary-1") + ask("a", "step-canary-1")
                     + ask("b", "step-canary-2") + file("b", "step-canary-1") + ask("b", "step-canary-1"))
    made, theirs, own, nobodys, mine, again = (g.get("result") or g for g in got)
    assert made["category"] == mine["category"] == "success", got
    assert theirs["reconciled"] == "not_found" and not theirs["data"]["created"], theirs  # nothing crosses
    assert own["reconciled"] == "found" and nobodys["reconciled"] == "not_found", got
    assert again["data"]["created"][0]["id"] == mine["data"]["id"] != made["data"]["id"], got

    def recorded() -> list[dict]:
        return [e for e in events(sandbox) if e.get("type") == "foreign_reference"]
    found = wait_for(recorded, what="a foreign_reference event")
    assert [(e["method"], e["whose"], e["owner"], e["by"]) for e in found] == [
        ("lookup", "other", "alpha", "idempotency_key")], found
    cleared = [e.get("key_lookup") for e in events(sandbox) if e.get("type") == "call_requested"]
    assert cleared == [None, found[0]["key_lookup"]], cleared
    assert "canary" not in json.dumps(found)  # never the key's text


def test_an_answer_the_mcp_bridge_makes_itself_carries_its_agents_scope(tmp_path: Path) -> None:
    """No daemon: the bridge answers local_failure with an id of its own making. A host that
    looks it up (§6) asks about its own call, never a made-up one (was an id without the
    agent's scope, which the daemon records as never given: FAIL_TOOL_ACCESS)."""
    link = VaultLink(str(tmp_path / "no-daemon.sock"), "agent-a", "r1", None, WaitPolicy())
    got = asyncio.run(link._result_of("call", {}, "read_issue", False))
    assert got.category == "local_failure" and got.correlation_id.endswith(scope("r1", "agent-a")), got


def test_scope_is_hashed_once_per_agent_and_run() -> None:
    """Every call's correlation id ends with its agent's and run's digest: the same pair gives
    the same digest, another pair another, and a pair seen before is not hashed again (a SHA-256
    and a JSON encoding on every call's path, issue #19)."""
    first = scope("run-scope-cache", "agent-a")
    hits = scope.cache_info().hits
    assert first == scope("run-scope-cache", "agent-a")
    assert scope.cache_info().hits == hits + 1
    assert first != scope("run-scope-cache", "agent-b") and first != scope(None, "agent-a")
