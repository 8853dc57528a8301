"""`--executor ray` against the local executor on this machine: per-trial overhead and suite wall time.

    .venv/bin/python bench/scale.py [--small N] [--large N] [--slots K] [--skip-suite]

Starts a one-node Ray cluster for the bench (`ray start --head --block`, K
CPUs, no dashboard; its process group is ended at the end, never `ray stop`),
then runs `vaultsim run` as a user would, in fresh processes:

1. one fast scenario (gate-1) with --trials SMALL and --trials LARGE, on each
   executor with the same K trials at a time (`--jobs K` locally; K CPUs and
   one CPU per trial on Ray). The per-trial cost is the slope between the two
   runs, (wall(LARGE) - wall(SMALL)) / (LARGE - SMALL), so fixed costs (Ray's
   connection, shipping the working_dir, its workers' start-up) cancel out;
   the overhead per trial is ray's slope minus local's, times K (what one
   trial costs a slot). Target: under 50 ms per trial.
2. the shipped suite on each executor: wall time of the whole command (with
   Ray's connection and shipping) and of the trials (the report's wall_time_s).

Then a cost model: the projected wall time of 10,000 trials on N nodes of K
cores, from the measured per-trial slot time plus the overhead (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 50.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(slots: int, temp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = temp / "head.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                                 f"--port={port}", f"--num-cpus={slots}", "--include-dashboard=false",
                                 "--disable-usage-stats", f"--object-store-memory={80 * 1024 * 1024}",
                                 f"--temp-dir={temp}"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    deadline = time.monotonic() + 300
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("ray start failed:\n" + log.read_text(errors="replace")[-2000:])
        time.sleep(0.2)  # polling the log for readiness, bounded
    return proc, f"127.0.0.1:{port}"


def stop_cluster(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(args: list[str]) -> tuple[float, dict[str, Any]]:
    """(the command's wall time, its report)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "vault.cli.main", "run", "-q", "--json", str(report), *args],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - started
        if not report.exists() or proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"vaultsim run {' '.join(args)} exited {proc.returncode}")
        return wall, json.loads(report.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=8, help="trials of the short run (default 8)")
    ap.add_argument("--large", type=int, default=32, help="trials of the long run (default 32)")
    ap.add_argument("--slots", type=int, default=os.cpu_count() or 2, help="trials at once (default: cores)")
    ap.add_argument("--skip-suite", action="store_true", help="only the per-trial overhead")
    a = ap.parse_args()
    temp = Path(tempfile.mkdtemp(prefix="vsbench-", dir="/tmp"))
    print(f"bench/scale.py: {a.slots} trials at once on {os.cpu_count()} cores; one-node Ray cluster of "
          f"{a.slots} CPUs, one CPU per trial")
    cluster, address = start_cluster(a.slots, temp)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a stopped bench still stops its cluster (see finally)
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    try:
        executors = {"local": ["--jobs", str(a.slots)], "ray": ["--executor", "ray", "--ray-address", address]}
        run(["-k", "gate-1", "--trials", "2", *executors["ray"]])  # warm: the cluster's first job
        slope: dict[str, float] = {}
        for name, opts in executors.items():
            walls = {}
            for n in (a.small, a.large):
                _, doc = run(["-k", "gate-1", "--trials", str(n), *opts])
                walls[n] = float(doc["summary"]["wall_time_s"])
            slope[name] = (walls[a.large] - walls[a.small]) / (a.large - a.small)
            print(f"  {name:<5}  gate-1 x{a.small}: {walls[a.small]:6.2f} s   x{a.large}: {walls[a.large]:6.2f} s"
                  f"   per trial: {slope[name] * 1000:7.1f} ms wall, {slope[name] * a.slots * 1000:7.1f} ms a slot")
        overhead_ms = (slope["ray"] - slope["local"]) * a.slots * 1000
        print(f"ray overhead per trial: {overhead_ms:+.1f} ms a slot (target < {TARGET_MS:.0f} ms)")
        if not a.skip_suite:
            for name, opts in executors.items():
                total, doc = run(opts)
                s = doc["summary"]
                print(f"shipped suite, {name:<5}: {total:6.2f} s the command, {float(s['wall_time_s']):6.2f} s the "
                      f"trials ({s['trials']} trials, release {s['release']})")
        slot_s = slope["local"] * a.slots + max(0.0, overhead_ms) / 1000
        print(f"cost model: 10,000 trials at {slot_s:.2f} s a slot (this stub agent; a real agent's own time adds "
              "to it)")
        for nodes in (1, 4, 16, 64):
            row = "  ".join(f"K={k:<2} {10000 * slot_s / (nodes * k) / 60:7.1f} min" for k in (2, 8, 32))
            print(f"  {nodes:>3} nodes:  {row}")
    finally:
        stop_cluster(cluster)
        subprocess.run(["rm", "-rf", str(temp)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
