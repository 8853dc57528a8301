"""Second hostile pass on connection limits: agents that hold every connection they can.

Both sockets share the daemon's connection budget (its open-file limit). Agents
filling it must never lock out the person: `vaultsim lock`, `status` and
`stop` go on working, and a client refused for a limit says which limit, not
"connection reset". Real daemon (open-file limit lowered with prlimit so the
budget is a few hundred), real processes.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator

import pytest

from helpers import PY, Sandbox, wait_for
from hostile_fixtures import RawClient, agent_env, frame
from vault.client import ApproverClient
from vault.daemon.limits import MAX_CONNECTIONS_PER_PROCESS
from vault.errors import RpcError
from vault.home import VaultHome
from vault.jsonrpc import LIMIT
from vault.runner import world_procs

HOLD = (
    "import socket, sys\n"
    "socks = []\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); socks.append(s)\n"
    "print('held', flush=True)\n"
    "sys.stdin.readline()\n"
)


def refused_for_a_limit(path: object) -> bool:
    """Does a new connection on `path` get the daemon's limit refusal?"""
    try:
        with RawClient(path, timeout=10) as c:
            return c.ask(frame("vault.status", {})).get("error", {}).get("code") == LIMIT
    except (ConnectionError, OSError):
        return False


@pytest.fixture
def small_budget(sandbox: Sandbox) -> Iterator[Sandbox]:
    """A daemon allowed 1,024 open files: a budget of 384 connections for both sockets."""
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit(1) here (util-linux)")
    sandbox.spawn_daemon(["prlimit", "--nofile=1024:1024", *world_procs.daemon_argv()])
    yield sandbox


class TestAgentsHoldingEveryConnection:
    def test_the_person_can_still_lock_check_and_stop_the_vault(self, small_budget: Sandbox) -> None:
        box = small_budget
        # five agents: each process tree holds at most a quarter of the 384 (96), so it takes
        # four to fill the agent socket's 320 (test_flood10)
        holders = [box.spawn([PY, "-c", HOLD, str(box.agent_sock), "100"], env=agent_env(box),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(5)]
        try:
            for h in holders:
                assert h.stdout.readline().strip() == "held"  # type: ignore[union-attr]
            wait_for(lambda: refused_for_a_limit(box.agent_sock), what="agents to hold every connection allowed")
            locked = box.vaultsim("lock")
            assert 0 == locked.returncode, locked.stderr
            status = box.vaultsim("status", "--json")
            assert json.loads(status.stdout)["locked"] is True, status.stderr
            stopped = box.vaultsim("stop")
            assert 0 == stopped.returncode and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        finally:
            for h in holders:
                h.communicate("\n", timeout=60)


class TestRefusedClients:
    def test_a_client_refused_for_a_limit_is_told_which(self, sandbox: Sandbox) -> None:
        """A process already holding its connections' worth: the client raises the daemon's
        -32004 and its words, not a reset connection or 'the daemon closed the connection'."""
        sandbox.start_daemon()
        held = []
        try:
            for _ in range(MAX_CONNECTIONS_PER_PROCESS):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(sandbox.home / "approver.sock"))
                held.append(s)
            wait_for(lambda: refused_for_a_limit(sandbox.home / "approver.sock"),
                     what="the daemon to take every connection")
            with pytest.raises(RpcError) as err:
                ApproverClient.for_home(VaultHome(sandbox.home)).close()
            assert err.value.rpc_code == LIMIT
            assert f"already has {MAX_CONNECTIONS_PER_PROCESS} connections" in err.value.message
        finally:
            for s in held:
                s.close()
