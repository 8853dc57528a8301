"""Hostile clients: what one client can cost the others (issue #20).

    idle       10,000 sessions held open by 40 processes: the daemon's CPU while
               nothing happens (the old reaper polled every session's process
               every 0.2 s: 65-73% of a core)
    stopped    a SIGSTOP'd approver beside a steady agent: the agent's call
               p50/p99 (target p99 < 50 ms) and when the approver was dropped
    partial    2,000 connections (10 processes) each holding an unfinished
               line of 16 KiB, then of 1 MiB: the daemon's RSS (target < 200 MB)

    .venv/bin/python bench/hostile_clients.py [--sessions N] [--calls N] [--idle-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from _procs import percentiles, vault_with_remote, wait_for

PY = sys.executable

HOLD_SESSIONS = r"""
import os, sys
from vault.client import AgentClient
children, each = int(sys.argv[1]), int(sys.argv[2])
for n in range(children):
    if os.fork() == 0:
        c = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=120)
        for i in range(each):
            c.request('session.open', agent=f'idle-{n}-{i}')
        os.write(1, b'ready\n')
        while os.read(0, 4096):
            pass
        os._exit(0)
for _ in range(children):
    os.wait()
"""

STEADY = r"""
import json, os, select, sys, time
from vault.client import AgentClient
c = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=120)
c.open_session('steady', 'bench')
lat = []
while not select.select([sys.stdin], [], [], 0)[0]:
    t0 = time.perf_counter()
    c.call('read_issue', {'issue_id': 'ISS-1'})
    lat.append(time.perf_counter() - t0)
    if len(lat) % 100 == 0:
        print(json.dumps({'calls': len(lat)}), flush=True)
print(json.dumps({'latencies': lat}), flush=True)
"""

HOLD_PARTIAL = r"""
import socket, sys
path, conns, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(conns):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    try:
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"vault.status","params":{"pad":"' + b"x" * size)
    except OSError:
        continue
    held.append(s)
print("ready", flush=True)
sys.stdin.readline()
"""


def env_for(box: object) -> dict[str, str]:
    return {**box.env, "VAULTSIM_SOCKET": str(box.agent_sock)}  # type: ignore[attr-defined]


def idle(sessions: int, idle_s: float) -> None:
    children = max(1, -(-sessions // 250))  # at most 250 each: under the per-connection cap
    with vault_with_remote() as (box, _):
        proc = box.spawn([PY, "-c", HOLD_SESSIONS, str(children), str(sessions // children)],
                         env=env_for(box), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(children):
            proc.stdout.readline()  # type: ignore[union-attr]
        daemon = psutil.Process(box.status()["pid"])  # type: ignore[index]
        held = box.status()["sessions"]  # type: ignore[index]
        t0, c0 = time.monotonic(), sum(daemon.cpu_times()[:2])
        time.sleep(idle_s)  # the measurement is of doing nothing for this long
        cpu = sum(daemon.cpu_times()[:2]) - c0
        wall = time.monotonic() - t0
        print(f"idle: {held:,} sessions from {children} processes: daemon CPU {100 * cpu / wall:.2f}% "
              f"of a core over {wall:.1f} s  (was 65-73% with the 0.2 s reaper)")
        t1 = time.monotonic()
        proc.communicate(timeout=120)
        wait_for(lambda: box.status()["sessions"] == 0, timeout=120)  # type: ignore[index]
        print(f"      all {held:,} sessions ended {time.monotonic() - t1:.2f} s after their processes "
              "were told to exit")


def stopped(calls: int) -> None:
    with vault_with_remote() as (box, _):
        approver = box.start_approver([{"match": {}, "decide": "allow_session"}], name="sleepy")
        agent = box.spawn([PY, "-c", STEADY], env=env_for(box), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        stop_at = None
        dropped_at: tuple[int, float] | None = None
        t0 = time.monotonic()
        for line in agent.stdout:  # type: ignore[union-attr]
            n = json.loads(line)["calls"]
            if stop_at is None and n >= 300:
                os.killpg(approver.pid, signal.SIGSTOP)
                stop_at, t0 = n, time.monotonic()
            if stop_at is not None and dropped_at is None and box.status()["approvers_dropped"]:  # type: ignore[index]
                dropped_at = (n - stop_at, time.monotonic() - t0)
            if stop_at is not None and n >= stop_at + calls and dropped_at is not None:
                break
        out, _ = agent.communicate("stop\n", timeout=120)
        lat = json.loads(out.strip().splitlines()[-1])["latencies"]
        os.killpg(approver.pid, signal.SIGCONT)
        assert stop_at is not None and dropped_at is not None
        b50, b99 = percentiles(lat[50:stop_at])
        p50, p99 = percentiles(lat[stop_at:])
        print(f"stopped approver: a steady agent, {len(lat) - stop_at:,} calls with the approver stopped: "
              f"p50 {p50:.2f} ms, p99 {p99:.2f} ms (target p99 < 50 ms); before the stop p50 {b50:.2f} ms, "
              f"p99 {b99:.2f} ms")
        print(f"      the stopped approver was disconnected after {dropped_at[0]:,} calls, {dropped_at[1]:.1f} s")


def partial() -> None:
    with vault_with_remote() as (box, _):
        daemon = psutil.Process(box.status()["pid"])  # type: ignore[index]
        base = daemon.memory_info().rss
        for size, label in ((16 * 1024, "16 KiB"), ((1 << 20) - 100, "1 MiB")):
            holders = [box.spawn([PY, "-c", HOLD_PARTIAL, str(box.agent_sock), "200", str(size)],
                                 env=env_for(box), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                       for _ in range(10)]
            for h in holders:
                h.stdout.readline()  # type: ignore[union-attr]
            # a loaded machine may let one status connection time out among 2,000 held ones: ask again
            st: dict = wait_for(box.status, timeout=120, what="the daemon's status")
            rss = daemon.memory_info().rss
            print(f"partial lines of {label} on 2,000 connections: {st['connections'] - 1:,} held "
                  f"({st['partial_bytes'] / 2**20:.1f} MiB of lines), daemon RSS {base / 2**20:.0f} -> "
                  f"{rss / 2**20:.0f} MB (target < 200 MB)")
            for h in holders:
                h.communicate("\n", timeout=60)
            # status() itself is one connection
            wait_for(lambda: box.status()["connections"] <= 1, timeout=60)  # type: ignore[index]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=3000, help="steady agent calls, at least (default 3000)")
    ap.add_argument("--idle-s", type=float, default=10.0)
    args = ap.parse_args()
    idle(args.sessions, args.idle_s)
    stopped(args.calls)
    partial()


if __name__ == "__main__":
    main()
