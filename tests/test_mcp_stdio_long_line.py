"""A line past the MCP bridge's limit is answered and dropped, never held whole; a blank line is skipped.

A host (or anything writing to the bridge's stdin) sent one 60 MB line: the bridge held it,
and the SDK's parse of it, at once (335 MB). Lines past 4 MiB characters are now read and
dropped a piece at a time and answered id null, -32600; the next line is served as usual.
"""

from __future__ import annotations

import json

import pytest

from mcp_world import World, start_world
from helpers import Sandbox
from test_redteam_mcp22 import StdioHost
from test_redteam_mcp25 import _answers_until, _invalid_request

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed (pip install 'vaultsim[mcp]')")

MIB = 1 << 20


def _peak_rss(pid: int) -> int:
    """The process's peak resident size so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def world(sandbox: Sandbox) -> World:
    return start_world(sandbox)


async def test_a_60_mb_line_is_refused_and_the_bridge_stays_small(world: World) -> None:
    host = await StdioHost.start(world)
    try:
        assert host.proc.stdin is not None
        # a ping whose params carry 60 MB, written in pieces as a pipe would carry it
        head = '{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"pad": "'
        host.proc.stdin.write(head.encode())
        for _ in range(60):
            host.proc.stdin.write(b"x" * MIB)
            await host.proc.stdin.drain()
        host.proc.stdin.write(b'"}}\n')
        # just under the limit is still read, and a short request after both is answered
        host.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": 8, "method": "ping",
                                           "params": {"pad": "y" * (3 * MIB)}}) + "\n").encode())
        host.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": 9, "method": "ping"}) + "\n").encode())
        await host.proc.stdin.drain()
        got = await _answers_until(host, 9)
        peak = _peak_rss(host.proc.pid)
    finally:
        await host.close()
    assert 3 == len(got), got
    said = _invalid_request(got[0])
    assert "longer than" in said and "nothing was done" in said, said
    assert {"jsonrpc": "2.0", "id": 8, "result": {}} == got[1]
    assert {"jsonrpc": "2.0", "id": 9, "result": {}} == got[2]
    assert peak < 200 * MIB, f"the bridge peaked at {peak >> 20} MiB"


async def test_blank_lines_between_messages_are_not_answered(world: World) -> None:
    host = await StdioHost.start(world)
    try:
        assert host.proc.stdin is not None
        host.proc.stdin.write(b"\n\r\n   \n" + (json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}) + "\r\n\r\n").encode())
        host.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": 6, "method": "ping"}) + "\n").encode())
        await host.proc.stdin.drain()
        got = await _answers_until(host, 6)
    finally:
        await host.close()
    assert [{"jsonrpc": "2.0", "id": 5, "result": {}}, {"jsonrpc": "2.0", "id": 6, "result": {}}] == got


async def test_thousands_of_unreadable_notifications_do_not_flood_stderr(world: World) -> None:
    """Each notification the SDK cannot read was logged, one warning each: a host could fill the
    bridge's stderr (a terminal, a log file) at its own pace. The first ten are, then a count at
    each power of two."""
    err = world.sandbox.root / "mcp.stderr"
    before = err.stat().st_size if err.exists() else 0
    host = await StdioHost.start(world)
    try:
        assert host.proc.stdin is not None
        bad = '{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"x": "\\ud800"}, "q": [' + "[" * 300 + "]" * 300 + "]}\n"
        host.proc.stdin.write(bad.encode() * 3000)
        host.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": 4, "method": "ping"}) + "\n").encode())
        await host.proc.stdin.drain()
        got = await _answers_until(host, 4)
    finally:
        await host.close()
    assert [{"jsonrpc": "2.0", "id": 4, "result": {}}] == got  # no notification is answered
    said = err.read_bytes()[before:].decode(errors="replace")
    warnings = [line for line in said.splitlines() if "notification" in line and "cannot read" in line]
    assert 10 <= len(warnings) <= 10 + 12, len(warnings)
    assert "dropped 2048 notifications" in said
