"""A real two-node Ray cluster on this machine, for the `--executor ray` tests.

`ray start --head --block` and `ray start --address --block`, each in a new
session so that ending its process group ends every process of that node
(raylet, GCS, its workers and whatever they started); never `ray stop`, which
would end every Ray on the machine. Each node advertises its own custom
resource (`vs_head`, `vs_worker`), so the report's node ids can be told
apart. Small footprint: one CPU a node, the smallest object store, no
dashboard UI.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from helpers import wait_for
from vault.lineage import started

RAY = str(Path(sys.executable).with_name("ray"))
STARTED = "Ray runtime started"
OBJECT_STORE = str(80 * 1024 * 1024)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    address: str
    temp: Path
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # resource name -> `ray start`

    def processes(self) -> list[psutil.Process]:
        """Every process of the cluster now: the `ray start` processes and all below them."""
        out = []
        for proc in self.nodes.values():
            try:
                top = psutil.Process(proc.pid)
                out += [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return out

    def stop(self) -> None:
        for name in reversed(list(self.nodes)):
            proc = self.nodes[name]
            with _suppress():
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError))  # type: ignore[arg-type]


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", "--num-cpus=1",
                                 f"--object-store-memory={OBJECT_STORE}", *args], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        return STARTED in log.read_text(errors="replace")

    wait_for(ready, timeout=180, interval=0.2, what=f"ray start ({log.name})")
    return proc


def two_nodes() -> Iterator[Cluster]:
    temp = Path(tempfile.mkdtemp(prefix="vsray-", dir="/tmp"))  # Ray's socket paths must stay short
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_DISABLE_USAGE_STATS"] = "1"
    # a token an earlier local Ray left in ~/.ray (`vaultsim run --executor ray` without an address
    # starts one, and Ray >= 2.5x saves it there) made this cluster's nodes refuse each other
    env["HOME"] = str(temp)
    cluster = Cluster(f"127.0.0.1:{port}", temp)
    try:
        cluster.nodes["vs_head"] = _start(["--head", f"--port={port}", "--resources={\"vs_head\": 100}",
                                           "--include-dashboard=false", f"--temp-dir={temp}"],
                                          temp / "head.log", env)
        cluster.nodes["vs_worker"] = _start([f"--address={cluster.address}", "--resources={\"vs_worker\": 100}"],
                                            temp / "worker.log", env)
        yield cluster
    finally:
        cluster.stop()
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def homes_of(pids: set[int]) -> list[str]:
    """Trial homes (`/tmp/vsr-PID-*`) of these Ray worker processes still on disk."""
    return sorted(p.name for pid in pids for p in Path("/tmp").glob(f"vsr-{pid}-*"))


class Watcher:
    """Polls the cluster during a run: its Ray workers and every process they started."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.before = {p.pid for p in cluster.processes()}
        self.workers: set[int] = set()
        self.trial_procs: dict[int, float] = {}

    def poll(self) -> None:
        for proc in self.cluster.processes():
            try:
                if proc.pid in self.before:
                    continue
                cmdline = proc.cmdline()
                if cmdline and cmdline[0].startswith("ray::"):
                    self.workers.add(proc.pid)
                    for child in proc.children(recursive=True):
                        self.trial_procs.setdefault(child.pid, started(child.pid) or 0.0)
            except psutil.Error:  # it ended while being looked at
                pass

    def lingering(self) -> list[str]:
        alive = []
        for pid, created in self.trial_procs.items():
            try:
                p = psutil.Process(pid)
                if started(pid) == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return alive


def watch_until(proc: subprocess.Popen[str], watcher: Watcher, deadline_s: float) -> None:
    """Poll the cluster until the run ends (bounded)."""
    end = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < end:
        watcher.poll()
        time.sleep(0.1)  # a sampling interval, not a wait for an outcome
