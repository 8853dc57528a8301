"""`vaultsim demo`: a throwaway vault with a live agent, and the TUI to approve it.

One command, nothing to set up, nothing left behind. It makes a private
temporary directory under /tmp (short: Unix socket paths are limited) holding
the vault home and an embedded keyring, sets demo credentials, starts the fake
remote and the daemon (unlocked), opens the TUI, and once the TUI is
subscribed runs the demo agents (see `demo_app`). Quitting the TUI stops every
process the demo started, each by its own process group, and removes the
directory, which takes the home, the keyring and the demo credentials with it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

from vault.client import RpcClient
from vault.errors import HomeError, VaultError
from vault.resources import DEMO_PLAN as DEFAULT_PLAN
from vault.text import printable

CREDENTIALS = ("tracker_token", "releases_token")
START_TIMEOUT_S = 30.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT_S = 10.0


class DemoError(VaultError):
    """The demo could not set up its world; says which part and where its log is."""


class DemoWorld:
    """The temporary directory and every process started in it."""

    def __init__(self, parent: str = "/tmp") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="vsd-", dir=parent))
        os.chmod(self.root, 0o700)
        self.home = self.root / "h"
        self.procs: list[subprocess.Popen[Any]] = []
        self.remote_url = ""
        self.env = {k: v for k, v in os.environ.items() if k != "VAULTSIM_SOCKET"}
        self.env.update({
            "VAULTSIM_HOME": str(self.home),
            "VAULTSIM_KEYRING_DIR": str(self.root / "kr"),
            "PYTHON_KEYRING_BACKEND": "vault.keyring_backend.FileKeyring",
            "PYTHONUNBUFFERED": "1",
        })

    # ---- setting up ----------------------------------------------------------------

    def start(self) -> None:
        tokens = {name: "demo-" + secrets.token_hex(16) for name in CREDENTIALS}
        for name, value in tokens.items():
            out = subprocess.run([sys.executable, "-m", "vault.cli", "secret", "set", name],
                                 input=value, env=self.env, capture_output=True, text=True,
                                 timeout=START_TIMEOUT_S)
            if out.returncode != 0:
                raise DemoError(f"could not set the demo credential {name}: {out.stderr.strip()}")
        self.remote_url = self._start_remote(tokens)
        self._start_daemon()

    def _private_file(self, name: str, data: str) -> Path:
        path = self.root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        return path

    def spawn(self, argv: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        """Start a process in its own group, output to a log file (never to the TUI's terminal)."""
        with open(self.root / log, "ab") as out:
            proc = subprocess.Popen(argv, env=env or self.env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _start_remote(self, tokens: dict[str, str]) -> str:
        creds = self._private_file("remote-creds.json", json.dumps(tokens))
        log = self.root / "remote.log"
        proc = self.spawn([sys.executable, "-m", "vault.remote", "--port", "0", "--credentials", str(creds),
                           "--events", str(self.root / "remote-events.jsonl")], "remote.log")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("listening on "):
                    return line.split("listening on ", 1)[1].strip()
            _wait_a_little(proc)
        raise DemoError(f"the fake remote did not start; see {log}")

    def _start_daemon(self) -> None:
        proc = self.spawn([sys.executable, "-m", "vault.cli", "daemon", "--foreground", "--unlocked",
                           "--remote", self.remote_url], "daemon.log")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with RpcClient(self.home / "agent.sock", timeout=5) as c:
                    c.request("vault.status")
                    return
            except (HomeError, OSError):
                _wait_a_little(proc)
        raise DemoError(f"the daemon did not start; see {self.root / 'daemon.log'}")

    def start_agent(self, label: str, args: list[str], task: dict[str, Any] | None = None) -> subprocess.Popen[Any]:
        env = {**self.env, "VAULTSIM_SOCKET": str(self.home / "agent.sock"), "VAULTSIM_RUN_ID": "demo"}
        if task is not None:
            env["VAULTSIM_TASK"] = str(self._private_file(f"{label}-task.json", json.dumps(task)))
        return self.spawn([sys.executable, "-m", "agent_stub", *args], f"{label}.out", env)

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
        """Stop every process we started (agents first, the daemon, the remote), remove the dir.

        Returns how many were still running."""
        procs, self.procs = self.procs, []  # idempotent: a reaped pid is never signalled again
        running = sum(1 for proc in procs if proc.poll() is None)
        for proc in reversed(procs):
            stop_group(proc)
        shutil.rmtree(self.root, ignore_errors=True)
        return running


def _wait_a_little(proc: subprocess.Popen[Any]) -> None:
    # poll the child's startup: wake early if it dies, otherwise re-check soon
    try:
        proc.wait(timeout=0.05)
    except subprocess.TimeoutExpired:
        pass


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM the process group, SIGKILL it if it does not go, and reap the leader."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        try:
            os.killpg(proc.pid, sig)  # its own group: children it made go too
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            # the leader is gone; anything left in its group goes now too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", default=str(DEFAULT_PLAN), help="plan for the first agent (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from .demo_app import DemoApp  # Textual only when the demo actually runs

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

