"""The SSH side of a trial: a real sshd on loopback and the faults played on it.

The fake SSH host is `vault.remote.sshd` (a real sshd on loopback with a
`restart` program that keeps markers); SSH scenarios need OpenSSH's server and
are reported SKIPPED without it.

Faults are played from outside, on the real processes, while the agent's call
is in flight; the `restart` program on the fake host is held until a fault has
been applied:

    kill_client   the vault's ssh client is SIGKILLed after the command started
                  on the host; then the host is let go and finishes the restart
    kill_remote   the host's worker (its own process group) is SIGKILLed after
                  its start marker: the restart never completes
    fail          the restart exits 1
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

POLL_S = 0.02


def sshd_module() -> ModuleType | None:
    """vault.remote.sshd, or None when OpenSSH's server is not installed."""
    from vault.remote import sshd

    return sshd if sshd.sshd_available() else None


def ssh_unavailable_reason() -> str | None:
    try:
        return None if sshd_module() is not None else "OpenSSH server (sshd) not available"
    except Exception as exc:  # a broken fixture must not take the runner down
        return f"cannot load the sshd fixture ({type(exc).__name__})"


async def play_fault(fault: str, info: Any, service: str, daemon_pid: int, stop: asyncio.Event) -> str:
    """Wait until the restart is running on the host, then apply the fault. Returns what was done."""
    holding = Path(info.state_dir) / f"holding-{service}"
    while not holding.exists():
        if stop.is_set():
            return "not applied: the restart never started"
        await asyncio.sleep(POLL_S)  # polling a file the fake host writes
    if fault == "kill_client":
        killed = _kill_ssh_clients(daemon_pid)
        info.release(service)
        return f"killed {killed} ssh client(s) of the vault; the host then finished the restart"
    pid = _worker_pid(Path(info.markers_dir))
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    # later restarts (an agent that resends) are not held again
    with contextlib.suppress(FileNotFoundError):
        (Path(info.state_dir) / f"hold-{service}").unlink()
    return f"killed the host's worker (pid {pid}) after its start marker"


def _kill_ssh_clients(daemon_pid: int) -> int:
    n = 0
    try:
        children = psutil.Process(daemon_pid).children(recursive=True)
    except psutil.Error:
        return 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.name() == "ssh":
                child.kill()
                n += 1
    return n


def _worker_pid(markers: Path) -> int | None:
    starts = sorted(markers.glob("*.start"), key=lambda p: p.stat().st_mtime)
    if not starts:
        return None
    for line in starts[-1].read_text().splitlines():
        if line.startswith("pid="):
            with contextlib.suppress(ValueError):
                return int(line[4:])
    return None


def host_state(info: Any) -> dict[str, Any]:
    markers = Path(info.markers_dir)
    return {
        "restarts": info.restarts(),
        "starts": len(list(markers.glob("*.start"))) if markers.is_dir() else 0,
        "dones": len(list(markers.glob("*.done"))) if markers.is_dir() else 0,
    }


async def wait_host_quiet(info: Any, timeout: float = 3.0) -> None:
    """Let work the fault left running on the host end before its state is read."""
    deadline = time.monotonic() + timeout
    markers = Path(info.markers_dir)
    while time.monotonic() < deadline:
        starts = {p.stem for p in markers.glob("*.start")} if markers.is_dir() else set()
        dones = {p.stem for p in markers.glob("*.done")} if markers.is_dir() else set()
        running = [s for s in starts - dones if _alive(markers / f"{s}.start")]
        if not running:
            return
        await asyncio.sleep(POLL_S)


def _alive(start: Path) -> bool:
    pid = None
    with contextlib.suppress(OSError, ValueError):
        for line in start.read_text().splitlines():
            if line.startswith("pid="):
                pid = int(line[4:])
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
