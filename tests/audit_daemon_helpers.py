"""Helpers for the daemon-level audit tests (tests/test_audit_daemon.py).

Also runnable as a script: ``python tests/audit_daemon_helpers.py daemon
--fail-flag FILE [--fail-writes] [daemon options]`` runs a real `vaultsim
daemon --foreground` whose audit writer gets an I/O layer that fails every
fdatasync (or, with --fail-writes, every write) once FILE exists. The fault is injected here, through `AuditWriter.open(io=...)`, so
production code carries no test hook; the test arms it by creating FILE,
at exactly the point it wants (e.g. after the intent is durable and the
remote committed), with no counting of syncs and no sleeps.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `helpers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import PY, Sandbox  # noqa: E402

from vault.runner import world_procs  # noqa: E402

TOKEN = "tracker-token-value"

# every operation passes the gate without an approver: these tests are about the audit path
AUTO_POLICY = "default: {mode: auto}\n"

CREATE = ("create_issue", {"title": "audit"})
READ = ("read_issue", {"issue_id": "ISS-1"})

# A fresh agent process: one session, N calls, one JSON line per answered call
# (flushed as soon as the answer arrives); an error line if the daemon goes away.
LOAD_AGENT = r"""
import json, sys
from vault.client import AgentClient
sock, name, n, ops = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    c = AgentClient(sock, timeout=60)
    c.open_session(name, "audit-run")
    for i in range(n):
        if ops[i % len(ops)] == "c":
            r = c.call("create_issue", {"title": f"{name}-{i}"})
        else:
            r = c.call("read_issue", {"issue_id": "ISS-1"})
        print(json.dumps({"cid": r.correlation_id, "category": str(r.category),
                          "operation": r.operation, "message": r.message}), flush=True)
except Exception as exc:  # the daemon died under us: say so, exit cleanly
    print(json.dumps({"error": type(exc).__name__}), flush=True)
"""


def setup_remote(sandbox: Sandbox, *, secret: str = TOKEN, fault: str | None = None) -> str:
    """Remote accepting `secret`, the credential set, an all-auto policy; returns the URL."""
    _, url = sandbox.start_remote({"tracker_token": secret}, fault=fault)
    sandbox.set_secret("tracker_token", secret)
    sandbox.write("auto-policy.yaml", AUTO_POLICY)
    return url


def daemon_args(sandbox: Sandbox, url: str, *extra: str) -> list[str]:
    return ["--remote", url, "--policy", str(sandbox.root / "auto-policy.yaml"), *extra]


def audit_key(sandbox: Sandbox) -> bytes:
    """The home's audit key, read from the sandbox's file keyring (as the daemon does)."""
    from vault.home import VaultHome
    from vault.store.keyring_backend import FileKeyring
    from vault.store.keystore import KeyStore
    return KeyStore(VaultHome(sandbox.home), backend=FileKeyring(sandbox.root / "kr")).derive("audit")


def events(sandbox: Sandbox) -> list[dict[str, Any]]:
    from vault.audit import decrypt_events
    return decrypt_events(sandbox.home / "audit.log", audit_key(sandbox))


def spawn_agent(sandbox: Sandbox, name: str, n: int, ops: str, out: Path) -> subprocess.Popen[str]:
    """A load agent writing its answers to `out` (one JSON line each)."""
    env = world_procs.agent_env(sandbox.env, sandbox.agent_sock)
    with open(out, "w") as f:
        return sandbox.world.start_agent(world_procs.python_argv(LOAD_AGENT, str(sandbox.agent_sock), name, str(n), ops),
                                         env=env, stdout=f, stderr=subprocess.STDOUT)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines written so far (a line being written is left for later)."""
    try:
        data = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in data.splitlines(keepends=True)
            if line.endswith("\n") and line.startswith("{")]


def answered(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if "cid" in line]


def agent_call(sandbox: Sandbox, body: str, *args: str, run_id: str = "audit-run") -> list[dict[str, Any]]:
    """Run Python as a fresh agent process with `client` (an AgentClient, session open) in scope."""
    code = ("import json, os, sys\n"
            "from vault.client import AgentClient\n"
            "client = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60)\n"
            f"client.open_session('stub', {run_id!r})\n"
            "def out(x): print(json.dumps(x.model_dump(mode='json')), flush=True)\n" + body)
    env = world_procs.agent_env(sandbox.env, sandbox.agent_sock)
    proc = world_procs.run_agent(world_procs.python_argv(code, *args), env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def start_failing_daemon(sandbox: Sandbox, flag: Path, *args: str) -> subprocess.Popen[str]:
    """A real daemon process whose audit fdatasync (with "--fail-writes" in `args`: every
    write) fails once `flag` exists."""
    return sandbox.spawn_daemon([PY, str(Path(__file__).resolve()), "daemon", "--fail-flag", str(flag), *args])


# ---- the injected I/O layer (runs inside the daemon process) --------------------


class FailingSyncIO:
    """`os`-like I/O for AuditWriter: once `flag` exists, an fdatasync that covers a write made
    since fails (EIO), or with `writes` every write fails (ENOSPC) instead. A sync of what was
    written before the flag (the 5 ms group commit of a record written just before it) succeeds:
    the fault starts with the first record after it, so a test knows which record meets it."""

    def __init__(self, flag: Path, writes: bool = False) -> None:
        self.flag = flag
        self.writes = writes
        self.written_since = False

    def write(self, fd: int, data: bytes) -> int:
        if self.flag.exists():
            if self.writes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written_since = True
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        if not self.writes and self.written_since:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fdatasync(fd)


def _run_failing_daemon(argv: list[str]) -> int:
    """`vaultsim daemon --foreground --unlocked` with the audit writer's io replaced."""
    import argparse
    import asyncio
    import logging

    from vault.audit.adapter import open_audit
    from vault.daemon.instance import acquire_home_lock
    from vault.cli.daemon import audit_options, build_daemon, configure_daemon
    from vault.home import VaultHome
    from vault.store.keystore import KeyStore

    p = argparse.ArgumentParser()
    configure_daemon(p)
    p.add_argument("--fail-flag", required=True)
    p.add_argument("--fail-writes", action="store_true")
    args = p.parse_args(argv)
    args.no_audit, args.unlocked = True, True
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s vaultsim[%(process)d] %(levelname)s %(message)s")
    home = VaultHome.resolve(args.home).ensure()
    lock_fd = acquire_home_lock(home)
    try:
        home.pid_file.write_text(f"{os.getpid()}\n")
        daemon = build_daemon(home, args)
        daemon.audit_sink = open_audit(home, KeyStore(home).derive("audit"),
                                       io=FailingSyncIO(Path(args.fail_flag), args.fail_writes),
                                       **audit_options(daemon.config, args))
        asyncio.run(daemon.serve())
    finally:
        home.pid_file.unlink(missing_ok=True)
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["daemon"]:
        sys.exit("usage: audit_daemon_helpers.py daemon --fail-flag FILE [daemon options]")
    sys.exit(_run_failing_daemon(sys.argv[2:]))
