"""Red team 31: a value made for a catalog pattern to backtrack on must not hold the daemon.

A catalog's `pattern` is the user's; an agent's value is the agent's. `(a+)+` with forty `a`s and
a `!` backtracks for longer than anyone waits, and the daemon checked each call's parameters on its
one event loop: every client, `status` included, waited with it. Now the daemon bounds each match
(vault.pattern_budget): the hostile call is refused, naming the pattern, and the vault serves on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import Sandbox
from vault.resources import CATALOG
from vault.runner import world_procs

AGENT = Path(__file__).parent / "agents" / "rt31p_backtrack.py"
PATTERN = "(a+)+"


def _catalog(sandbox: Sandbox) -> Path:
    doc = yaml.safe_load(CATALOG.read_text())
    doc["operations"]["read_issue"]["params"]["issue_id"]["pattern"] = PATTERN
    return sandbox.write("catalog.yaml", doc)


@pytest.mark.timeout(120)
def test_a_value_the_pattern_backtracks_on_is_refused_and_the_vault_serves_on(sandbox: Sandbox) -> None:
    sandbox.start_daemon("--catalog", str(_catalog(sandbox)))
    env = world_procs.agent_env(sandbox.env, sandbox.agent_sock, "run-1", None)
    # the deadline is the test's: before the bound, the agent's first answer never came
    done = subprocess.run([sys.executable, str(AGENT), "read_issue", "issue_id"], env=env, capture_output=True,
                          text=True, timeout=30)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    evil, plain = lines[0]["evil"], lines[1]["plain"]
    # refused as bad params, as a value that does not match is (§3: -32602, nothing sent)
    assert -32602 == evil["code"] and "could not be checked against (a+)+" in evil["message"], evil
    # the next call is checked as before: the pattern matches, so it reaches the (absent) remote
    assert "could not be checked" not in json.dumps(plain) and "does not match" not in json.dumps(plain), plain
    status = sandbox.status()
    assert status is not None and not status.get("halted"), status


def test_the_bound_gives_back_the_alarm_it_borrowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded, a backtracking match ends within the budget; a plain one answers as before; the
    SIGALRM handler and a timer armed before (pytest-timeout's, a caller's) are as they were."""
    import re
    import signal
    import time
    from vault import pattern_budget
    monkeypatch.setattr(pattern_budget, "_budget", 0.05)
    fired: list[int] = []
    timeout_timer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, given back at the end
    before = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        started = time.monotonic()
        assert pattern_budget.fullmatch(re.compile(PATTERN), "a" * 40 + "!") is None
        assert time.monotonic() - started < 5
        assert pattern_budget.fullmatch(re.compile(PATTERN), "aaaa") is True
        assert pattern_budget.fullmatch(re.compile(PATTERN), "aab") is False
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < left <= 30 and fired == []
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired == [1]  # the caller's own handler is back
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if timeout_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *timeout_timer)


@pytest.mark.timeout(120)
async def test_the_mcp_bridge_passes_such_a_value_to_the_daemon_and_serves_on(sandbox: Sandbox) -> None:
    """The bridge publishes the pattern in the tool's input schema but matches no value against it
    (the daemon does, bounded): the tool call comes back refused, naming the pattern, and the
    bridge answers the next request. (The TUI shows values; it matches none against a pattern.)"""
    import asyncio
    pytest.importorskip("mcp.client.stdio")
    from mcp_world import mcp_stdio, result_of
    sandbox.start_daemon("--catalog", str(_catalog(sandbox)))
    async with mcp_stdio(sandbox) as s:
        evil = result_of(await asyncio.wait_for(s.call_tool("read_issue", {"issue_id": "a" * 40 + "!"}), 30))
        assert not evil["ok"] and "could not be checked against (a+)+" in evil["message"], evil
        tools = await asyncio.wait_for(s.list_tools(), 30)
    assert "read_issue" in {t.name for t in tools.tools}
