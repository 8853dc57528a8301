"""`vaultsim demo`: a throwaway vault with a live agent, and the TUI to approve it.

One command, nothing to set up, nothing left behind. It makes a private
temporary directory under /tmp (short: Unix socket paths are limited) holding
the vault home and an embedded keyring, and starts the runner's world in it
(vault.runner.live: fresh credentials, the fake remote, the daemon unlocked;
no scripted approver), opens the TUI, and once the TUI is
subscribed runs the demo agents (see `demo_app`), started as the world starts
agents (vault.runner.world_procs). Quitting the TUI stops every process the
demo started, each by its own process group, and removes the directory, which
takes the home, the keyring and the demo credentials with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import IO, Any

from vault.errors import VaultError
from vault.resources import DEMO_PLAN as DEFAULT_PLAN
import vault.runner.world_procs as world_procs  # the demo's setup: its agents start as the world starts them
from vault.text import printable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class DemoError(VaultError):
    """The demo could not set up its world; says which part and where its log is."""


class DemoWorld:
    """The temporary directory, the vault world in it, and every agent the demo started.

    The world is the runner's (vault.runner.live, as `vaultsim run` and the pytest
    plugin set it up): fresh credentials, the fake remote (in this process, on the
    world's own event-loop thread), the daemon (unlocked) as its own process. Only
    the approver differs: none is scripted, since the TUI is the approver here."""

    def __init__(self, parent: str = "/tmp") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="vsd-", dir=parent))
        os.chmod(self.root, 0o700)
        self.home = self.root / "h"
        self.remote_url = ""
        self.engine: Any = None
        self.live: Any = None
        # agents see the agent contract's variables only (no keyring, no other vault)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("VAULTSIM_") and k != "PYTHON_KEYRING_BACKEND"}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.agents = world_procs.Processes(self.root, self.env)

    @property
    def procs(self) -> list[subprocess.Popen[Any]]:
        """Every agent the demo started (the world's daemon is the world's)."""
        return self.agents.procs

    # ---- setting up ----------------------------------------------------------------

    def start(self) -> None:
        from vault.runner.live import Engine, LiveWorld
        self.engine = Engine(fork_server=False)  # two agents: no import bill worth a fork server
        try:
            self.live = LiveWorld(self.engine, self.root, approver=None, name="demo").start()
        except Exception as exc:  # the world says which part failed; the daemon's log is kept
            raise DemoError(f"could not start the demo world: {exc}") from None
        self.remote_url = self.live.remote_url

    def _private_file(self, name: str, data: str) -> Path:
        path = self.root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        return path

    def spawn(self, argv: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        """Start a process in its own group, output to a log file (never to the TUI's terminal)."""
        return self.agents.start_agent(argv, env=env or self.env, log=log)

    def start_agent(self, label: str, args: list[str], task: dict[str, Any] | None = None) -> subprocess.Popen[Any]:
        extra = {}
        if task is not None:
            extra["VAULTSIM_TASK"] = str(self._private_file(f"{label}-task.json", json.dumps(task)))
        env = world_procs.agent_env(self.env, self.home / "agent.sock", "demo", extra)
        return self.spawn(world_procs.agent_stub_argv(*args), f"{label}.out", env)

    def final_line(self, label: str) -> str:
        """The agent's final message (its last stdout line), shortened for one activity line."""
        try:
            lines = (self.root / f"{label}.out").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        # an agent's output: printable, so it cannot steer the terminal from the activity pane
        return printable(lines[-1] if lines else "", 120)

    # ---- tearing down --------------------------------------------------------------

    def close(self) -> int:
        """Stop every agent we started, then the world (daemon, remote), and remove the dir.

        Returns how many processes were still running."""
        running = self.agents.close()  # idempotent: a reaped pid is never signalled again
        live, self.live = self.live, None
        if live is not None:
            daemon = live.world.daemon
            running += int(daemon is not None and daemon.returncode is None)
            live.close()
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
        shutil.rmtree(self.root, ignore_errors=True)
        return running


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", default=str(DEFAULT_PLAN), help="plan for the first agent (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from vault.proc_guard import make_undumpable

    from tui.cli import need_terminal
    from tui.demo_app import DemoApp  # Textual only when the demo actually runs

    need_terminal()  # before anything is started

    make_undumpable()  # the approver of the demo's vault

    plan = Path(args.plan).absolute()
    if not plan.is_file():
        print(f"vaultsim demo: no plan at {plan}", file=sys.stderr)
        return 2
    world = DemoWorld()
    # a demo that is killed, or whose terminal is closed, still cleans up (while
    # the TUI runs, DemoApp turns these signals into an orderly quit instead)
    previous = {sig: signal.signal(sig, _terminate) for sig in STOP_SIGNALS}
    try:
        try:
            world.start()
        except DemoError as exc:
            print(f"vaultsim demo: {exc.message}", file=sys.stderr)
            _show_logs(world, sys.stderr)
            return 1
        DemoApp(world, plan).run()
        stopped = _close(world, previous)
        print(f"vaultsim demo: stopped {stopped} processes and removed {world.root}")
        return 0
    finally:
        _close(world, previous)


def _close(world: DemoWorld, previous: dict[int, Any]) -> int:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
    try:
        return world.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _show_logs(world: DemoWorld, out: IO[str]) -> None:
    for name in ("remote.log", "daemon.log"):
        path = world.root / name
        if path.exists():
            tail = path.read_text(errors="replace").strip().splitlines()[-10:]
            out.write(f"--- {name} ---\n" + "\n".join(tail) + "\n")

