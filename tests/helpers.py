"""Real processes for tests: daemon, fake remote, scripted approver, agents.

Everything is a real fresh process on real Unix sockets in a short private
temp dir (AF_UNIX paths are limited to ~108 bytes). Readiness is polled with a
deadline; nothing sleeps a fixed time.

A whole world (fresh credentials, the fake remote, the daemon, a scripted
approver, agents, grading) comes from the pytest plugin's `vaultsim` fixture,
which is the runner's world (vault.runner.live), as `vaultsim run` and the demo
use it. `Sandbox` is for tests of the daemon, CLI and remote processes
themselves, with the very arguments under test: it starts them through the
world's process starters (vault.runner.world_procs), the one place that
starts a daemon, a remote, an approver or an agent.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from vault.runner import world_procs

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def audit_verified_intact(sandbox: "Sandbox", timeout: float = 20.0) -> dict[str, Any]:
    """`vaultsim audit verify --json` until it says intact. A running daemon signs its newest
    records within 5 s, so `unanchored` is only a wait; any other status fails at once."""
    seen: dict[str, Any] = {}

    def intact() -> bool:
        out = sandbox.vaultsim("audit", "verify", "--json")
        seen.clear()
        seen.update(json.loads(out.stdout))
        assert seen["status"] in ("intact", "unanchored"), seen
        return (out.returncode, seen["status"]) == (0, "intact")

    wait_for(intact, timeout=timeout, interval=0.25, what="the daemon to sign its newest audit records")
    return dict(seen)


def canary() -> str:
    return "CANARY-" + secrets.token_hex(12)


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    world_procs.stop(proc, sig, timeout)


@dataclass
class Sandbox:
    """A private directory holding one vault home and its keyring; its processes are the
    world's (vault.runner.world_procs), started with the arguments a test gives."""

    root: Path
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    @property
    def world(self) -> world_procs.Processes:
        return world_procs.Processes(self.root, self.env, procs=self.procs)

    @property
    def home(self) -> Path:
        return self.root / "h"

    @property
    def agent_sock(self) -> Path:
        return self.home / "agent.sock"

    @property
    def env(self) -> dict[str, str]:
        return world_procs.home_env(self.root)

    def vaultsim(self, *args: str, input: str | None = None, check: bool = False,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
        out = world_procs.run_cli(args, env=self.env, input=input, timeout=timeout)
        if check:
            out.check_returncode()
        return out

    def set_secret(self, name: str, value: str) -> None:
        out = self.vaultsim("secret", "set", name, input=value)
        assert out.returncode == 0, out.stderr

    def spawn(self, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        return self.world.spawn(argv, **kw)

    def write(self, name: str, data: Any) -> Path:
        path = self.root / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        return path

    # ---- processes -------------------------------------------------------------

    def start_daemon(self, *args: str, unlocked: bool = True) -> subprocess.Popen[str]:
        return self.spawn_daemon(world_procs.daemon_argv(*args, unlocked=unlocked))

    def spawn_daemon(self, argv: list[str]) -> subprocess.Popen[str]:
        """Start a daemon command, logging to daemon.stderr; return once it answers."""
        return self.world.start_daemon(argv, ready=lambda: self.status() is not None)

    def status(self) -> dict[str, Any] | None:
        return world_procs.daemon_status(self.agent_sock)

    def start_remote(self, credentials: dict[str, str], fault: str | None = None) -> tuple[subprocess.Popen[str], str]:
        remote = self.world.start_remote(credentials, fault=fault)
        SIM_TOKENS[remote.url] = remote.sim_token
        return remote.proc, remote.url

    def start_approver(self, rules: list[dict[str, Any]], name: str = "ci",
                       log: Path | None = None) -> subprocess.Popen[str]:
        before = (self.status() or {}).get("approvers", 0)
        script = self.write(f"approver-{len(self.procs)}.yaml", {"name": name, "rules": rules})
        log = log or self.root / f"approver-{len(self.procs)}.log"
        proc = self.world.start_approver(
            script, log=log, subscribed=lambda: (self.status() or {}).get("approvers", 0) > before)
        proc.log_path = log  # type: ignore[attr-defined]
        return proc

    def run_agent(self, steps: list[dict[str, Any]], *, agent: str = "stub", run_id: str = "run-1",
                  timeout: float = 60, extra_env: dict[str, str] | None = None) -> "AgentRun":
        plan = self.write(f"plan-{secrets.token_hex(4)}.yaml", {"agent": agent, "steps": steps})
        env = world_procs.agent_env(self.env, self.agent_sock, run_id, extra_env)
        return AgentRun(world_procs.run_agent(world_procs.agent_stub_argv("--plan", str(plan)), env=env,
                                              timeout=timeout))

    def close(self) -> None:
        self.world.close()
        self._stop_detached_daemon()

    def _stop_detached_daemon(self) -> None:
        """A daemon started in background mode (`vaultsim daemon`) is no child of ours: stop it
        through its pid file, so no test leaves one running. The pid may be stale (a killed
        daemon leaves the file): only a process serving this home is stopped."""
        import psutil
        try:
            # a FIFO left in its place (a test of an unusable home) must not block the clean-up
            fd = os.open(self.home / "daemon.pid", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            try:
                pid = int(os.read(fd, 64)) if stat.S_ISREG(os.fstat(fd).st_mode) else 0
            finally:
                os.close(fd)
            if pid <= 0:
                return
            proc = psutil.Process(pid)
            if str(self.home) not in " ".join(proc.cmdline()):
                return
            proc.terminate()
            proc.wait(timeout=15)
        except (OSError, ValueError, psutil.Error):
            return


@dataclass
class AgentRun:
    proc: subprocess.CompletedProcess[str]

    @property
    def results(self) -> list[dict[str, Any]]:
        out = []
        for line in self.proc.stdout.splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    @property
    def final(self) -> str:
        lines = self.proc.stdout.strip().splitlines()
        return lines[-1] if lines else ""


def new_sandbox(parent: str = "/tmp") -> Sandbox:
    root = Path(tempfile.mkdtemp(prefix="vs-", dir=parent))
    os.chmod(root, 0o700)
    return Sandbox(root)


# url -> the control API token of each remote `Sandbox.start_remote` started
SIM_TOKENS: dict[str, str] = {}


def sim_headers(url: str) -> dict[str, str]:
    return {"X-Sim-Token": SIM_TOKENS[url]}


def remote_ledger(url: str) -> dict[str, Any]:
    import httpx
    return httpx.get(f"{url}/_sim/ledger", headers=sim_headers(url), timeout=10).json()


def remote_events(url: str) -> list[dict[str, Any]]:
    import httpx
    return httpx.get(f"{url}/_sim/events", headers=sim_headers(url), timeout=10).json()


def shipped_scenario(name: str) -> str:
    """A shipped scenario's YAML with its plan, approver and policy paths made absolute, for a
    scenario file written elsewhere (run_trial's tmp directory)."""
    text = (ROOT / "scenarios" / f"{name}.yaml").read_text()
    for d in ("plans", "approvers", "policies"):
        text = text.replace(f"{d}/", f"{ROOT / 'scenarios' / d}/")
    return text


def run_trial(tmp: Path, name: str, text: str, agent: str, env: dict[str, str],
              isolation: str = "auto") -> dict[str, Any]:
    """Run scenario `text` (written to tmp/NAME.yaml) once under `vaultsim run --agent AGENT`,
    with `env` added to the agents' environment: the trial's report entry."""
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    report = tmp / "r.json"
    proc = world_procs.run_cli(["run", str(path), "-q", "--color", "never", "--trials", "1", "--isolation", isolation,
                                "--json", str(report), "--agent", agent],
                               env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=240)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(json.loads(report.read_text())["scenarios"][0]["trial_results"][0])
