"""Real processes for tests: daemon, fake remote, scripted approver, agents.

Everything is a real fresh process on real Unix sockets in a short private
temp dir (AF_UNIX paths are limited to ~108 bytes). Readiness is polled with a
deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

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
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@dataclass
class Sandbox:
    """A private directory holding one vault home and its keyring."""

    root: Path
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "h"

    @property
    def agent_sock(self) -> Path:
        return self.home / "agent.sock"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VAULTSIM_HOME": str(self.home),
            "VAULTSIM_KEYRING_DIR": str(self.root / "kr"),
            "PYTHON_KEYRING_BACKEND": "vault.keyring_backend.FileKeyring",
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("VAULTSIM_SOCKET", None)
        return env

    def vaultsim(self, *args: str, input: str | None = None, check: bool = False,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "vault.cli", *args], input=input, env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout, check=check)

    def set_secret(self, name: str, value: str) -> None:
        out = self.vaultsim("secret", "set", name, input=value)
        assert out.returncode == 0, out.stderr

    def spawn(self, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, env=kw.pop("env", self.env), cwd=ROOT, text=True,
                                start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def write(self, name: str, data: Any) -> Path:
        path = self.root / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        return path

    # ---- processes -------------------------------------------------------------

    def start_daemon(self, *args: str, unlocked: bool = True) -> subprocess.Popen[str]:
        argv = [PY, "-m", "vault.cli", "daemon", "--foreground", *args]
        if unlocked:
            argv.append("--unlocked")
        return self.spawn_daemon(argv)

    def spawn_daemon(self, argv: list[str]) -> subprocess.Popen[str]:
        """Start a daemon command, logging to daemon.stderr; return once it answers."""
        log = open(self.root / "daemon.stderr", "a")
        proc = self.spawn(argv, stdout=log, stderr=log)
        log.close()
        wait_for(lambda: proc.poll() is not None or self.status() is not None, what="daemon to answer")
        assert proc.poll() is None, (self.root / "daemon.stderr").read_text()
        return proc

    def status(self) -> dict[str, Any] | None:
        from vault.client import RpcClient
        from vault.errors import VaultError
        try:
            with RpcClient(self.agent_sock, timeout=5) as c:
                return c.request("vault.status")
        except (VaultError, OSError):
            return None

    def start_remote(self, credentials: dict[str, str], fault: str | None = None) -> tuple[subprocess.Popen[str], str]:
        cred_file = self.root / "remote-creds.json"
        fd = os.open(cred_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(credentials, f)
        argv = [PY, "-m", "vault.remote", "--port", "0", "--credentials", str(cred_file),
                "--events", str(self.root / "remote-events.jsonl")]
        if fault:
            argv += ["--fault", fault]
        proc = self.spawn(argv, stdout=subprocess.PIPE, stderr=open(self.root / "remote.stderr", "a"))
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "listening on " in line, (self.root / "remote.stderr").read_text()
        return proc, line.split("listening on ", 1)[1].strip()

    def start_approver(self, rules: list[dict[str, Any]], name: str = "ci",
                       log: Path | None = None) -> subprocess.Popen[str]:
        before = (self.status() or {}).get("approvers", 0)
        script = self.write(f"approver-{len(self.procs)}.yaml", {"name": name, "rules": rules})
        log = log or self.root / f"approver-{len(self.procs)}.log"
        proc = self.spawn([PY, "-m", "vault.cli", "approve", "--script", str(script), "--log", str(log)],
                          stdout=subprocess.DEVNULL, stderr=open(self.root / "approver.stderr", "a"))
        proc.log_path = log  # type: ignore[attr-defined]
        wait_for(lambda: (self.status() or {}).get("approvers", 0) > before, what="approver to subscribe")
        return proc

    def run_agent(self, steps: list[dict[str, Any]], *, agent: str = "stub", run_id: str = "run-1",
                  timeout: float = 60, extra_env: dict[str, str] | None = None) -> "AgentRun":
        plan = self.write(f"plan-{secrets.token_hex(4)}.yaml", {"agent": agent, "steps": steps})
        env = {**self.env, "VAULTSIM_SOCKET": str(self.agent_sock), "VAULTSIM_RUN_ID": run_id,
               **(extra_env or {})}
        proc = subprocess.run([PY, "-m", "agent_stub", "--plan", str(plan)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        return AgentRun(proc)

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)
        self._stop_detached_daemon()

    def _stop_detached_daemon(self) -> None:
        """A daemon started in background mode (`vaultsim daemon`) is no child of ours: stop it
        through its pid file, so no test leaves one running. The pid may be stale (a killed
        daemon leaves the file): only a process serving this home is stopped."""
        import psutil
        try:
            proc = psutil.Process(int((self.home / "daemon.pid").read_text()))
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


def remote_ledger(url: str) -> dict[str, Any]:
    import httpx
    return httpx.get(f"{url}/_sim/ledger", timeout=10).json()


def remote_events(url: str) -> list[dict[str, Any]]:
    import httpx
    return httpx.get(f"{url}/_sim/events", timeout=10).json()
