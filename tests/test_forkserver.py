"""The runner's fork server: its children behave like freshly started interpreters.

A forked daemon that kept SIG_DFL for SIGPIPE died the moment it answered a client
that had hung up, before signing its audit log (`vaultsim run` then graded a trial
on an `unanchored` log). A fresh interpreter ignores SIGPIPE; so must a forked one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vault.audit import verify
from vault.runner.forkserver import ForkServer
from vault.runner.procs import ExecLauncher, Registry


def ignored_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn in /proc status")


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


def daemon_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A vault home and the environment a forked daemon serves it with (a file keyring beside it)."""
    home = tmp_path / "h"
    return home, {**os.environ, "VAULTSIM_HOME": str(home), "VAULTSIM_KEYRING_DIR": str(tmp_path / "kr"),
                  "PYTHON_KEYRING_BACKEND": "vault.store.keyring_backend.FileKeyring"}


@contextlib.asynccontextmanager
async def fork_server(env: dict[str, str]) -> AsyncIterator[ForkServer]:
    """A connected fork server; closed, and whatever it started reaped, on the way out."""
    registry = Registry()
    server = ForkServer(registry, ExecLauncher(registry))
    server.launch(env)
    await server.connect()
    try:
        yield server
    finally:
        await server.aclose()
        registry.reap()


async def forked_daemon(server: ForkServer, home: Path, env: dict[str, str], tmp_path: Path) -> Any:
    """A daemon forked by `server`, returned once serving (its sockets bound)."""
    proc = await server.spawn("daemon", ["daemon", "--foreground", "--home", str(home), "--unlocked"],
                              env=env, cwd=str(tmp_path), stdout=tmp_path / "d.log", stderr=tmp_path / "d.log")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not (home / "approver.sock").exists():  # serving once its sockets are bound
        assert proc.returncode is None, (tmp_path / "d.log").read_text()
        assert loop.time() < deadline, "the daemon did not start: " + (tmp_path / "d.log").read_text()
        await asyncio.sleep(0.01)
    return proc


def test_a_forked_daemon_ignores_sigpipe_like_a_fresh_one_and_stops_signed(tmp_path: Path) -> None:
    fresh = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert fresh.stdout is not None and fresh.stdout.readline() == b"up\n"  # started, signals set
        fresh_ignores = bool(ignored_signals(fresh.pid) & _bit(signal.SIGPIPE))
    finally:
        fresh.communicate(b"")
    assert fresh_ignores, "a fresh interpreter ignores SIGPIPE (the behaviour forked children must match)"

    home, env = daemon_env(tmp_path)

    async def scenario() -> tuple[int, int]:
        async with fork_server(env) as server:
            proc = await forked_daemon(server, home, env, tmp_path)
            ignored = ignored_signals(proc.pid)
            os.killpg(proc.pid, signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
            return ignored, code

    ignored, code = asyncio.run(scenario())
    assert ignored & _bit(signal.SIGPIPE), "the forked daemon would die of SIGPIPE on a client that hung up"
    assert code == 0, (tmp_path / "d.log").read_text()
    report = verify(home / "audit.log")  # stopped: nothing left to sign later
    assert report.status == "intact", report.message


def test_children_of_a_fork_server_that_died_end_with_it_and_say_so(tmp_path: Path) -> None:
    """The fork server killed under a running daemon (a runner stopping, a crash): the daemon dies
    with it (PR_SET_PDEATHSIG), and its `returncode` / `wait()` say it was killed rather than
    raising, so a trial closing its world afterwards tears down without a traceback."""
    import psutil

    home, env = daemon_env(tmp_path)

    async def scenario() -> tuple[int, int | None]:
        async with fork_server(env) as server:
            proc = await forked_daemon(server, home, env, tmp_path)
            child = psutil.Process(proc.pid)
            os.kill(child.ppid(), signal.SIGKILL)  # the server dies: its connection ends, its children with it
            code = await asyncio.wait_for(proc.wait(), 30)
            with contextlib.suppress(psutil.NoSuchProcess):
                child.wait(timeout=30)  # gone with its server, not merely said to be
            return code, proc.returncode

    code, returncode = asyncio.run(scenario())
    assert -signal.SIGKILL == code == returncode


def test_a_spawn_given_up_on_ends_the_child_the_server_forks_anyway(tmp_path: Path) -> None:
    """A trial cancelled (Ctrl-C, a Ray cancel) while its daemon's spawn waits for the server's
    answer: the server forks the daemon all the same. Nobody held it, so it outlived the trial and
    wrote into the home being removed (a home left after `vaultsim run --executor ray` got
    Ctrl-C). Now the child is ended the moment its pid comes back."""
    import psutil

    home, env = daemon_env(tmp_path)

    async def scenario() -> list[int]:
        async with fork_server(env) as server:
            assert server._proc is not None

            def daemons() -> list[int]:  # the server's children still running (forked, never exec'd)
                return [c.pid for c in psutil.Process(server._proc.pid).children()
                        if c.status() != psutil.STATUS_ZOMBIE]

            spawn = asyncio.create_task(server.spawn(
                "daemon", ["daemon", "--foreground", "--home", str(home), "--unlocked"], env=env,
                cwd=str(tmp_path), stdout=tmp_path / "d.log", stderr=tmp_path / "d.log"))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not server._pending:  # the request is on its way: the server will fork
                assert loop.time() < deadline, "the spawn request was never sent"
                await asyncio.sleep(0)
            spawn.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await spawn
            while server._pending:  # the server answered (it forked the daemon)
                assert loop.time() < deadline, "the server never answered"
                await asyncio.sleep(0.01)
            while (left := daemons()) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            return left

    assert [] == asyncio.run(scenario()), "a daemon forked for a cancelled spawn is still running"
