"""Shared parts of the hostile-client tests: raw frames, a served daemon, agent scripts.

Everything is a real process on a real socket; the raw helpers write bytes as
an attacker would (lone surrogates as JSON escapes, half lines), not through
the project's own client.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import Sandbox, new_sandbox
from vault.runner import world_procs

TOKEN = "tracker-token-value"
SURROGATE = "\ud800"  # json.dumps writes it as the escape \ud800, as an attacker's JSON would


def setup(sandbox: Sandbox, *daemon_args: str, secrets: tuple[str, ...] = ("tracker_token",)) -> str:
    """Fake remote + credentials + an unlocked daemon pointed at it; returns the remote URL."""
    _, url = sandbox.start_remote({name: TOKEN for name in secrets})
    for name in secrets:
        sandbox.set_secret(name, TOKEN)
    sandbox.start_daemon("--remote", url, *daemon_args)
    return url


@pytest.fixture(scope="module")
def served() -> Iterator[Sandbox]:
    """One daemon with a remote for a module's hostile clients (module-scoped: each module its own)."""
    box = new_sandbox()
    setup(box)
    try:
        yield box
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


def frame(method: str, params: dict[str, Any] | None = None, rid: Any = 1, **extra: Any) -> bytes:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "method": method, **extra}
    if rid is not ...:
        obj["id"] = rid
    if params is not None:
        obj["params"] = params
    return json.dumps(obj).encode() + b"\n"  # ensure_ascii: a surrogate goes out as \udXXX


class RawClient:
    """A socket that speaks raw lines, skipping notifications when reading answers."""

    def __init__(self, path: Any, timeout: float = 30) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> dict[str, Any]:
        while True:
            line = self.file.readline()
            if not line:
                raise ConnectionError("the daemon closed the connection")
            msg = json.loads(line)
            if "method" not in msg:
                return msg

    def ask(self, data: bytes) -> dict[str, Any]:
        self.send(data)
        return self.answer()

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hello(sandbox: Sandbox, raw: RawClient, name: str = "tester") -> None:
    token = (sandbox.home / "approver.token").read_text().strip()
    answer = raw.ask(frame("approver.hello", {"token": token, "name": name}))
    assert "result" in answer, answer


# Python run as a fresh agent process: `client` (AgentClient), `out(x)` prints one JSON line
PRELUDE = (
    "import json, os, sys, time\n"
    "from vault.client import AgentClient\n"
    "client = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60)\n"
    "def out(x): print(json.dumps(x.model_dump(mode='json') if hasattr(x, 'model_dump') else x), flush=True)\n"
)


def agent_env(sandbox: Sandbox, run_id: str = "run-1") -> dict[str, str]:
    return world_procs.agent_env(sandbox.env, sandbox.agent_sock, run_id)


def run_script(sandbox: Sandbox, body: str, *args: str, timeout: float = 120) -> list[Any]:
    """Run an agent script to its end in its own session and process group; its JSON lines.
    Whatever it left behind in its group (forked children) is killed afterwards."""
    proc = world_procs.run_agent(world_procs.python_argv(PRELUDE + body, *args), env=agent_env(sandbox),
                                 timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith(("{", "["))]


def spawn_script(sandbox: Sandbox, body: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start an agent script (its own session and process group); stdin and stdout are pipes."""
    return sandbox.world.start_agent(world_procs.python_argv(PRELUDE + body, *args), env=agent_env(sandbox),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=kw.pop("stderr", subprocess.PIPE), **kw)


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
