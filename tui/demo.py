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

SIGTERM, SIGINT and SIGHUP (its terminal closed) end it as `q` does (every
process stopped, the directory removed), with exit 128 + the signal as for
`vaultsim tui`; a SIGHUP or SIGINT ignored at start stays ignored
(vault.stop_signals). See `Stopper` for when a signal acts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from vault.cli.main import interrupted_line
from vault.errors import VaultError
from vault.resources import DEMO_PLAN as DEFAULT_PLAN
import vault.runner.world_procs as world_procs  # the demo's setup: its agents start as the world starts them
from vault.stop_signals import caught
from vault.text import printable

if TYPE_CHECKING:
    from textual.app import App

# how long Textual gets to restore the terminal once the world is down: a closed terminal
# takes no more writes, and its writer thread then blocks the exit for good
QUIT_GRACE_S = 10.0


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


class _Cut(BaseException):
    """A second stop signal while the world starts: set-up is cut short (what started is closed)."""


class Stopper:
    """The demo's stop signals, each acting when it can leave nothing behind.

    before set-up:          noted, and acted on at once: nothing is started
    during clean-up:        ignored: the demo is ending already, and its clean-up is never cut short
    while the world starts: noted, and acted on once it is up, since a half-started world
                            cannot be told apart from one still starting; a second signal
                            cuts the start short
    while the TUI runs:     the world is torn down first, then the TUI quits; if the terminal
                            has gone (Textual's last writes would block its exit for good) or
                            Textual has not quit within QUIT_GRACE_S, the process ends there,
                            with nothing left to clean up
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.phase = "before"  # before, setup, tui, teardown
        self.world: DemoWorld | None = None
        self.app: App[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopped = 0  # processes the TUI's tear-down found running
        self._quitting = False
        self._finished = threading.Event()

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.phase == "teardown":
            return  # already ending (`q`, or a signal): the clean-up is never cut short
        first = self.signum is None
        if first:
            self.signum = signum
        if self.phase == "setup" and not first:
            self.phase = "teardown"  # a third must not cut short the clean-up of what started
            raise _Cut()
        if self.phase == "tui" and first and self.loop is not None:
            # run on the app's loop, not inside this handler (it may interrupt the loop anywhere);
            # a loop already closed: the TUI has ended, and run() goes on to the tear-down
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.quit)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called by the app once its loop runs: a signal noted before then quits it now."""
        self.loop = loop
        if self.signum is not None:
            self.quit()

    def quit(self) -> None:
        if self._quitting or self.signum is None or self.app is None or self.world is None:
            return
        self._quitting = True
        self.stopped = self.world.close()  # first: the terminal may be gone, and Textual with it
        code = 128 + self.signum
        threading.Thread(target=self._end_if_stuck, args=(code,), name="demo-quit", daemon=True).start()
        self.app.exit(return_code=code)

    def _end_if_stuck(self, code: int) -> None:
        """End the process if Textual cannot: its terminal has gone, or it has not quit in time."""
        deadline = time.monotonic() + QUIT_GRACE_S
        while not self._finished.wait(0.1):
            if _terminal_gone() or time.monotonic() > deadline:
                os._exit(code)  # the world is down already: nothing is left to clean up

    def done(self) -> None:
        self.phase = "teardown"
        self._finished.set()


def _terminal_gone() -> bool:
    """Whether the terminal Textual draws on (stderr) has hung up: it then fails every write
    (EIO), an empty one too, which a live terminal takes."""
    try:
        os.write(2, b"")
    except OSError:
        return True
    return False


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
    stop = Stopper()
    # read before our handlers are installed: a signal ignored at start (nohup) stays ignored
    previous = {sig: signal.signal(sig, stop.handler) for sig in caught()}
    world: DemoWorld | None = None
    try:
        world = stop.world = DemoWorld()
        if stop.signum is None:
            stop.phase = "setup"
            try:
                world.start()
            except DemoError as exc:
                if stop.signum is None:
                    print(f"vaultsim demo: {exc.message}", file=sys.stderr)
                    _show_logs(world, sys.stderr)
                    return 1
            except _Cut:
                pass
        if stop.signum is None:
            stop.app = DemoApp(world, plan, stop)
            stop.phase = "tui"
            stop.app.run()
        stop.done()
        stopped = stop.stopped + world.close()
    finally:
        stop.done()
        if world is not None:
            world.close()  # idempotent; whatever ended us, nothing is left behind
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.signum is None:  # `q`
        print(f"vaultsim demo: stopped {stopped} processes and removed {world.root}")
        return 0
    if stop.signum == signal.SIGINT:
        _tell(interrupted_line("demo"))
    else:  # SIGTERM, SIGHUP (after a closed terminal, said to nobody)
        _tell(f"vaultsim demo: {signal.Signals(stop.signum).name}: stopped {stopped} processes "
              f"and removed {world.root}")
    return 128 + stop.signum


def _tell(line: str) -> None:
    """One line on stderr, written at once: a terminal that has gone takes nothing, and then
    nothing is left in a buffer to fail again at exit."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _show_logs(world: DemoWorld, out: IO[str]) -> None:
    for name in ("remote.log", "daemon.log"):
        path = world.root / name
        if path.exists():
            tail = path.read_text(errors="replace").strip().splitlines()[-10:]
            out.write(f"--- {name} ---\n" + "\n".join(tail) + "\n")
