"""The body of a Ray task: one trial on whichever node runs it, cleaned up there.

Runs in a Ray worker process, whose current directory is the run's staged
working_dir (vault.runner.ship). Each worker process keeps, for as long as it
lives, what `vaultsim run` keeps for a whole local run: an event loop (in a
thread of its own), a fork server with the vault's modules imported, and a
`Registry` of what it started. So a trial costs on a node what it costs
locally, plus Ray's scheduling, and builds the same world with
`run_trial` (same isolation, faults and grading).

Cleanup is the local runner's: a trial removes its home and processes
whatever happens; after every task the registry is reaped as a backstop
(Ray runs one task at a time in a worker process, so nothing of another
trial is in it). `ray.cancel` (the driver's Ctrl-C or `-x`) arrives as a
KeyboardInterrupt: the trial's asyncio task is cancelled, exactly like a
local Ctrl-C, and the task waits for that cleanup before it ends. If the
worker process dies instead, the fork server sees its socket close and ends,
and its children die with it (PR_SET_PDEATHSIG); what else it left (its
trial homes, processes exec'd for a trial) is swept by the next worker that
starts on that node: each worker notes itself in `WORKERS` while it lives,
and a new one ends, for every noted worker that is gone, the processes
whose environment or command line points into that worker's homes
(`/tmp/vsr-PID-*`), and removes the homes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from vault.lineage import started
from vault.runner.procs import ExecLauncher, Registry, kill_group, remove_dir
from vault.runner.scenario import Case
from vault.runner.ship import remap, remap_case
from vault.runner.trial import Runtime, TrialResult, base_env, run_trial

WORKERS = Path("/tmp/vaultsim-ray-workers")  # one file per live Ray worker process of this node
CLEANUP_S = 30.0  # a cancelled trial's teardown is bounded by its own timeouts; this is the backstop
POLL_S = 0.05  # how often the waiting task lets a pending KeyboardInterrupt (ray.cancel) in


class _Node:
    """This worker process's loop, launcher and registry, reused by every trial it runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vaultsim-trials", daemon=True)
        self.thread.start()
        self.registry = Registry()
        self.env = base_env()
        self.server: Any = None
        sweep()
        self.note = _note_self()
        self.launcher: Any = ExecLauncher(self.registry)
        from vault.runner.forkserver import ForkServer
        server = ForkServer(self.registry, self.launcher)
        try:
            server.launch(self.env)
            asyncio.run_coroutine_threadsafe(server.connect(), self.loop).result(timeout=CLEANUP_S)
            self.server = self.launcher = server
        except (OSError, TimeoutError):
            server.kill()
        atexit.register(self.close)

    def run(self, case: Case, number: int, settings: dict[str, Any]) -> TrialResult:
        done = threading.Event()

        async def guarded() -> TrialResult:
            try:
                rt = Runtime(launcher=self.launcher, registry=self.registry, env=self.env, **settings)
                return await run_trial(rt, case, number)
            finally:
                done.set()

        future = asyncio.run_coroutine_threadsafe(guarded(), self.loop)
        try:
            while not done.wait(POLL_S):
                pass
            return future.result()
        finally:
            # reached normally, or by ray.cancel's KeyboardInterrupt: stop the trial as a local
            # Ctrl-C does and let its own cleanup finish before the reap and before Ray learns
            # the task ended (the driver counts a cancelled trial as cleaned up from then on)
            if not done.is_set():
                self.loop.call_soon_threadsafe(future.cancel)
            _uninterrupted(lambda: done.wait(CLEANUP_S))
            _uninterrupted(self.registry.reap)

    def close(self) -> None:
        self.registry.reap()
        if self.server is not None:
            self.server.kill()
        with contextlib.suppress(OSError):
            self.note.unlink()


def _uninterrupted(step: Callable[[], object]) -> None:
    """Run a cleanup step to its end: a repeated ray.cancel (the driver cancels once when the
    trial's awaiter is cancelled and once more when the run closes) arrives as another
    KeyboardInterrupt, which must not cut the cleanup of the first one short."""
    while True:
        try:
            step()
            return
        except KeyboardInterrupt:
            continue


def _note_self() -> Path:
    WORKERS.mkdir(mode=0o700, exist_ok=True)
    note = WORKERS / f"{os.getpid()}-{started(os.getpid()) or 0.0:.3f}"  # vault.lineage: never moves
    note.touch()
    return note


def _gone(note: Path) -> bool:
    pid, _, created = note.name.partition("-")
    try:
        now = started(int(pid))
    except ValueError:
        return True
    return now is None or f"{now:.3f}" != created


def sweep() -> None:
    """End and remove what dead workers of this node left behind (see the module docstring)."""
    with contextlib.suppress(OSError):
        dead = [n for n in WORKERS.iterdir() if _gone(n)]
        if not dead:
            return
        prefixes = tuple(f"/tmp/vsr-{n.name.partition('-')[0]}-" for n in dead)
        ours = os.getpgid(0)
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                words = [*proc.environ().values(), *proc.cmdline()]
                if any(prefix in w for w in words for prefix in prefixes) and os.getpgid(proc.pid) != ours:
                    kill_group(os.getpgid(proc.pid))
        for prefix in prefixes:
            for home in Path("/tmp").glob(Path(prefix).name + "*"):
                remove_dir(home)
        for note in dead:
            note.unlink(missing_ok=True)


_NODE: _Node | None = None


def _node() -> _Node:
    global _NODE
    if _NODE is None:
        _NODE = _Node()
    return _NODE


def where() -> dict[str, str]:
    """The node a trial ran on, for the report."""
    import ray
    return {"id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}


def trial_task(case: Case, number: int, settings: dict[str, Any]) -> TrialResult:
    """One trial (the Ray task): paths point into the staged working_dir here."""
    here = Path.cwd()
    settings = dict(settings)
    if settings.get("agent_cwd"):
        settings["agent_cwd"] = str(remap(settings["agent_cwd"], here))
    result = _node().run(remap_case(case, here), number, settings)
    with contextlib.suppress(Exception):
        result.summary["node"] = where()
    return result
