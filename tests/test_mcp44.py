"""MCP hosts as real hosts behave (pass 44): a host whose hard timeout is shorter than the person takes.

Real hosts (Claude Desktop, Cursor, VS Code) cancel a tool call after their own timeout, often 60 s
and sometimes less, and many call the same tool again. The bridge withdrew the request at the cancel,
so the retry asked the person again: two prompts for one step, graded FAIL_APPROVAL_FATIGUE, and a
host whose timeout is shorter than the person's delay never got through. Now a host's cancel of a
call that waits for the person is held back for a grace (`--cancel-grace`, default 15 s): the
identical call (same tool, same arguments and key, same MCP session) joins the request; without a
retry it is withdrawn when the grace ends (vault.mcp.rejoin). Each test here failed before.

The hosts (tests/agents/mcp44_host.py) are the official SDK's clients with a 1 s read timeout, on
`vaultsim mcp` started as a user configures it (no `--wait-budget` sized under that timeout).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
import pytest

from helpers import PY, ROOT, Sandbox, run_trial
from mcp_world import Approver, World, mcp_stdio, result_of, start_world

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")

HOST = f"{PY} {ROOT / 'tests' / 'agents' / 'mcp44_host.py'}"

# a person who takes 2.5 s (the host gives a call 1 s), allowing create_issue for the session
SLOW_PERSON = """
title: a host whose timeout is shorter than the person
approver:
  rules:
    - {match: {operation: create_issue}, decide: allow_session, delay_s: 2.5}
task: {deadline_s: 40}
agents:
  - plan:
      agent: filer
      steps:
        - {call: create_issue, params: {title: "Flaky login test"}}
        - {call: create_issue, params: {title: "Flaky logout test"}}
      final: done
expect:
  verdict: PASS
  effects: {create_issue: 2}
  outcome:
    state:
      - {collection: issues, where: {title: "Flaky login test"}, count: 1}
      - {collection: issues, where: {title: "Flaky logout test"}, count: 1}
    claim: done
  prompts: {max: 1}
"""


@pytest.mark.parametrize("how", ["stdio key", "stdio nokey", "http key"])
def test_a_host_that_times_out_and_retries_is_asked_once_and_passes(tmp_path: Path, how: str) -> None:
    """Under `vaultsim run`, jailed: the host's call times out at 1 s, it calls the same tool again,
    and again, until the person (2.5 s) allows. One prompt, one issue per step, PASS."""
    transport, keyed = how.split()
    trial = run_trial(tmp_path, "slow-person", SLOW_PERSON, f"{HOST} {transport} {keyed}", {})
    final = json.loads(trial["agents"][0]["final"])
    assert final["timeouts"] >= 1, final  # the host's timeout did cut calls short
    assert ("PASS", 1) == (trial["verdict"], trial["prompts"]["total"]), (trial["findings"], final)
    assert {"create_issue": 2} == trial["effects"]


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def test_a_retry_joins_the_request_and_runs_once(world: World) -> None:
    """The SDK host's call times out (notifications/cancelled), it calls the identical tool again; the
    person, asked once, allows; the retry gets the Result and the remote has one issue."""
    person = await Approver.connect(world.sandbox.home)
    try:
        async with mcp_stdio(world.sandbox, "--progress-every", "0.2") as s:
            args = {"title": "asked once", "idempotency_key": "k-44"}
            with pytest.raises(Exception, match="(?i)timed out"):
                await s.call_tool("create_issue", args, read_timeout_seconds=1)
            asked = await person.request()
            waiting = asyncio.Event()

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                waiting.set()

            retry = asyncio.create_task(s.call_tool("create_issue", args, read_timeout_seconds=30,
                                                    progress_callback=on_progress))
            await asyncio.wait_for(waiting.wait(), 30)  # the retry waits with the request
            decided = await person.decide(asked["request_id"], "allow_once")
            got = result_of(await retry)
    finally:
        await person.close()
    assert "withdrawn" not in json.dumps(decided), decided
    assert "success" == got["category"], got
    assert 0 == person.seen("approval.requested")  # no second prompt
    assert 1 == world.issues_titled("asked once")


async def test_a_cancel_without_a_retry_is_withdrawn_when_the_grace_ends(world: World) -> None:
    """A host that cancels and does not come back: the request is withdrawn after the grace (the
    person's row goes, a late allow is refused), and nothing runs."""
    from vault.errors import RpcError

    person = await Approver.connect(world.sandbox.home)
    try:
        async with mcp_stdio(world.sandbox, "--progress-every", "0.2", "--cancel-grace", "1") as s:
            with pytest.raises(Exception, match="(?i)timed out"):
                await s.call_tool("create_issue", {"title": "given up"}, read_timeout_seconds=1)
            asked = await person.request()
            settled = await person.next("approval.settled")
            with pytest.raises(RpcError):
                await person.decide(asked["request_id"], "allow_once")
            read = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}))
    finally:
        await person.close()
    assert (asked["request_id"], "withdrawn") == (settled["request_id"], settled["state"])
    assert "success" == read["category"]
    assert 0 == world.issues_titled("given up")
