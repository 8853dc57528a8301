"""Starting `vaultsim mcp`: refusing without a daemon, `--wait`, and following the daemon's catalog.

A host shows a server as healthy once it starts; a bridge that cannot reach
a vault must say so at once (exit 1, as every command with no daemon to ask), not at the first call. With `--wait` it
starts anyway and tells the host when the tools arrive or change.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest

from helpers import PY, ROOT, Sandbox
from mcp_world import Approver, mcp_stdio, result_of, start_world

pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed")

EXTRA_OP = """
operations:
  close_issue:
    description: Close an issue.
    risk: update
    executor: http
    service: tracker
    method: POST
    path: /v1/issues/{issue_id}/close
    credential: tracker_token
    params:
      issue_id: {type: string}
    target: tracker
    mutates: true
"""


class TestStartup:
    def test_no_daemon_is_a_clear_error_not_a_healthy_looking_server(self, sandbox: Sandbox) -> None:
        """Exit 1 naming the socket it tried, where that came from, and what to do (once: no
        second hint)."""
        out = sandbox.vaultsim("mcp")
        assert 1 == out.returncode
        assert "hint:" not in out.stderr
        assert str(sandbox.agent_sock) in out.stderr and "$VAULTSIM_HOME" in out.stderr
        assert "--wait" in out.stderr and "vaultsim daemon" in out.stderr
        assert "" == out.stdout  # nothing on the protocol stream

    def test_without_vaultsim_home_it_says_which_home_it_looked_in(self, sandbox: Sandbox) -> None:
        env = {k: v for k, v in sandbox.env.items() if k != "VAULTSIM_HOME"}
        env["XDG_DATA_HOME"] = str(sandbox.root / "xdg")
        out = subprocess.run([PY, "-m", "vault.cli.main", "mcp"], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert 1 == out.returncode
        assert "the default home (no --home, no $VAULTSIM_HOME)" in out.stderr
        assert str(sandbox.root / "xdg") in out.stderr

    @pytest.mark.parametrize("args", [("--wait-budget", "0"), ("--wait-budget", "-5"),
                                      ("--progress-every", "0")], ids=["budget-0", "budget-negative", "progress-0"])
    def test_bad_waiting_options(self, sandbox: Sandbox, args: tuple[str, str]) -> None:
        out = sandbox.vaultsim("mcp", "--wait", *args)
        assert 2 == out.returncode and args[0] in out.stderr


BLOCK_AND_RUN = (
    "import sys\n"
    "sys.modules[{module!r}] = None  # importing it now raises ImportError, as a missing or broken install would\n"
    "from vault.cli.main import main\n"
    "sys.exit(main(['mcp', '--wait']))\n"
)


class TestInstall:
    def test_without_the_mcp_extra_it_says_how_to_install_it(self, sandbox: Sandbox) -> None:
        out = subprocess.run([PY, "-c", BLOCK_AND_RUN.format(module="mcp")], env=sandbox.env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert 2 == out.returncode, out.stderr
        assert "pip install 'vaultsim[mcp]'" in out.stderr and "Traceback" not in out.stderr

    def test_a_broken_dependency_of_the_sdk_is_a_crash_not_a_missing_extra(self, sandbox: Sandbox) -> None:
        """Only the extra itself may be missing; a broken install shows its traceback."""
        out = subprocess.run([PY, "-c", BLOCK_AND_RUN.format(module="anyio.streams.text")], env=sandbox.env,
                             cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert 0 != out.returncode
        assert "Traceback" in out.stderr and "anyio.streams.text" in out.stderr, out.stderr
        assert "vaultsim[mcp]" not in out.stderr


class TestFollowingTheDaemon:
    async def test_wait_starts_then_tools_arrive_with_the_daemon(self, sandbox: Sandbox) -> None:
        """--wait: only the generic tools until a daemon answers; then list_changed and the operations."""
        changed = asyncio.Event()

        async def on_message(message: object) -> None:
            if "ToolListChanged" in type(getattr(message, "root", message)).__name__:
                changed.set()

        async with mcp_stdio(sandbox, "--wait", message_handler=on_message) as s:
            before = [t.name for t in (await s.list_tools()).tools]
            early = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}))
            world = await asyncio.to_thread(start_world, sandbox)
            await asyncio.wait_for(changed.wait(), 30)
            after = {t.name for t in (await s.list_tools()).tools}
            read = result_of(await s.call_tool("read_issue", {"issue_id": "ISS-1"}))
        assert ["vault_resume", "vault_lookup"] == before
        assert ("local_failure", "bounded") == (early["category"], early["retry"])
        assert "no vaultsim daemon answers" in early["message"]
        assert "read_issue" in after
        assert "success" == read["category"]
        assert world.secret not in str(read)

    async def test_a_restarted_daemon_with_another_catalog_changes_the_tools(self, sandbox: Sandbox) -> None:
        """The bridge follows a daemon restart: new catalog -> list_changed; a new vault session (no old grant)."""
        changed = asyncio.Event()

        async def on_message(message: object) -> None:
            if "ToolListChanged" in type(getattr(message, "root", message)).__name__:
                changed.set()

        world = start_world(sandbox)
        person = await Approver.connect(sandbox.home)
        try:
            async with mcp_stdio(sandbox, message_handler=on_message) as s:
                before = {t.name for t in (await s.list_tools()).tools}
                call = asyncio.create_task(s.call_tool("create_issue", {"title": "before restart"}))
                req = await person.request()
                await person.decide(req["request_id"], "allow_session")
                await call
                await person.close()
                await asyncio.to_thread(_stop, world.daemon)
                sandbox.write("extra.yaml", EXTRA_OP)
                await asyncio.to_thread(sandbox.start_daemon, "--remote", world.url,
                                        "--catalog", str(sandbox.root / "extra.yaml"))
                await asyncio.wait_for(changed.wait(), 30)
                after = {t.name for t in (await s.list_tools()).tools}
                person = await Approver.connect(sandbox.home)
                call = asyncio.create_task(s.call_tool("create_issue", {"title": "after restart"}))
                req = await person.request()  # asked again: the old grant died with the old daemon
                await person.decide(req["request_id"], "allow_once")
                res = result_of(await call)
        finally:
            await person.close()
        assert "close_issue" not in before and "close_issue" in after
        assert "success" == res["category"]

    async def test_sigterm_closes_the_vault_session(self, sandbox: Sandbox) -> None:
        """A host stopping its server with SIGTERM: the vault session closes as the agent's own act."""
        start_world(sandbox)
        person = await Approver.connect(sandbox.home)
        proc = await asyncio.create_subprocess_exec(
            PY, "-m", "vault.cli.main", "mcp", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=sandbox.env, cwd=str(ROOT))
        try:
            init = ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
                    '"capabilities":{},"clientInfo":{"name":"raw-host","version":"0"}}}\n'
                    '{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            proc.stdin.write(init.encode())  # type: ignore[union-attr]
            await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
            opened = await person.next("session.opened")
            proc.send_signal(signal.SIGTERM)
            closed = await person.next("session.closed")
            code = await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await person.close()
        assert "raw-host" == opened["client"]["name"]
        assert (opened["session_id"], "closed by agent") == (closed["session_id"], closed["reason"])
        assert code in (0, -signal.SIGTERM)


def _stop(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)

