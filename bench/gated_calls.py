"""Durable gated calls per second end to end, beside the same load sent to the remote directly.

    .venv/bin/python bench/gated_calls.py [CALLS_PER_AGENT] [--agents N] [--rounds R] [--durability D]

In one run, with the same fake remote process and the same concurrency:

* direct: N agent processes, each calling `GET /v1/issues/ISS-1` on the fake
  remote over its own keep-alive HTTP/1.1 connection, one call at a time,
  with the lightest client there is (the standard library's http.client: the
  strongest baseline);
* via the vault: N agent processes, each with an agent-socket session calling
  `read_issue` through the daemon (gate, credential store, audit log with the
  intent durable before the remote is touched and the result written before
  the answer, aiohttp to the same remote), one call at a time.

* the relay floor: the same N vault agents against `bench/_relay.py`, a
  process that does only the plumbing every call needs (the agent socket's
  JSON-RPC, one pooled aiohttp request to the same remote, a Result-shaped
  answer) and none of the vault's own work (gate, sessions, credential store,
  audit log, catalog, response contract, evidence).

Rounds alternate direct, vault and relay, so all see the same machine. Each
vault round also gives the daemon's CPU time per call (user + system of the
daemon process over the round, from psutil) and the remote's, which it shares
the cores with; each relay round the relay's. Then one agent alone, for the
latency-bound figure.

Targets (issue #19): vault >= 0.5x direct at 8 agents; daemon CPU <= 0.25 ms per call.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import psutil

from _procs import TOKEN, vault_stack

TARGET_RATIO = 0.5
TARGET_CPU_MS = 0.25


def vault_agent(sock: str, n: int, start: "mp.synchronize.Barrier", done: "mp.Queue[int]") -> None:
    from vault.client import AgentClient

    client = AgentClient(sock)
    client.open_session("bench")
    start.wait()
    ok = sum(client.call("read_issue", {"issue_id": "ISS-1"}).ok for _ in range(n))
    done.put(ok)


def direct_agent(url: str, n: int, start: "mp.synchronize.Barrier", done: "mp.Queue[int]") -> None:
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def get() -> bool:
        conn.request("GET", "/v1/issues/ISS-1", headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status == 200

    get()  # connect before the clock starts, as the vault agent does
    start.wait()
    ok = sum(get() for _ in range(n))
    conn.close()
    done.put(ok)


def measure(target, arg: str, agents: int, n: int, watch: list[psutil.Process]) -> tuple[float, int, list[float]]:
    """(calls/s, calls that succeeded, CPU seconds of each watched process over the run)."""
    ctx = mp.get_context("spawn")
    # the clock starts once every agent has connected (and opened its session)
    start, done = ctx.Barrier(agents + 1), ctx.Queue()
    procs = [ctx.Process(target=target, args=(arg, n, start, done)) for _ in range(agents)]
    for p in procs:
        p.start()
    start.wait()
    cpu0 = [sum(p.cpu_times()[:2]) for p in watch]
    t0 = time.perf_counter()
    ok = sum(done.get() for _ in procs)
    elapsed = time.perf_counter() - t0
    cpu = [sum(p.cpu_times()[:2]) - c for p, c in zip(watch, cpu0)]
    for p in procs:
        p.join()
    return ok / elapsed, ok, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calls", nargs="?", type=int, default=400, help="calls per agent per round (default 400)")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="direct/vault/relay rounds (default 2)")
    ap.add_argument("--durability", choices=("default", "strict"), default="default")
    args = ap.parse_args()
    with vault_stack("--durability", args.durability) as stack:
        sock = str(stack.box.agent_sock)
        daemon, remote = psutil.Process(stack.daemon.pid), psutil.Process(stack.remote.pid)
        relay_sock = str(stack.box.root / "relay.sock")
        # a process of this bench's world: ended with it (the sandbox's close) if the bench fails
        relay_proc = stack.box.world.spawn([sys.executable, str(Path(__file__).with_name("_relay.py")), relay_sock,
                                            stack.url, TOKEN], stdout=subprocess.PIPE)
        assert relay_proc.stdout is not None and relay_proc.stdout.readline().strip() == "ready"
        relay = psutil.Process(relay_proc.pid)
        try:
            print(f"{args.agents} agents x {args.calls} calls per round, durability {args.durability}; "
                  f"host load {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}")
            ratios, cpus, floors = [], [], []
            for r in range(args.rounds):
                direct, dok, (rcpu_d,) = measure(direct_agent, stack.url, args.agents, args.calls, [remote])
                vault, vok, (dcpu, rcpu_v) = measure(vault_agent, sock, args.agents, args.calls, [daemon, remote])
                floor, fok, (fcpu,) = measure(vault_agent, relay_sock, args.agents, args.calls, [relay])
                ratios.append(vault / direct)
                cpus.append(dcpu / vok * 1000)
                floors.append(fcpu / fok * 1000)
                print(f"round {r + 1}: direct keep-alive HTTP {direct:8,.0f} calls/s ({dok} ok; remote CPU "
                      f"{rcpu_d / dok * 1000:.3f} ms/call)")
                print(f"         via the vault        {vault:8,.0f} calls/s ({vok} succeeded; daemon CPU "
                      f"{dcpu / vok * 1000:.3f} ms/call, remote CPU {rcpu_v / vok * 1000:.3f} ms/call)  "
                      f"= {vault / direct:.2f}x direct")
                print(f"         relay floor          {floor:8,.0f} calls/s ({fok} ok; relay CPU "
                      f"{fcpu / fok * 1000:.3f} ms/call: the plumbing alone, no vault work)  = {floor / direct:.2f}x direct")
            one, ok, (dcpu,) = measure(vault_agent, sock, 1, args.calls, [daemon])
            print(f"1 agent x {args.calls} read_issue: {one:,.0f} durable gated calls/s ({ok} succeeded; "
                  f"daemon CPU {dcpu / ok * 1000:.3f} ms/call)")
            print(f"{args.agents} agents: vault/direct {min(ratios):.2f}-{max(ratios):.2f}x "
                  f"(target >= {TARGET_RATIO}x); daemon CPU {min(cpus):.3f}-{max(cpus):.3f} ms/call "
                  f"(target <= {TARGET_CPU_MS} ms); the relay floor {min(floors):.3f}-{max(floors):.3f} ms/call")
        finally:
            relay_proc.terminate()
            relay_proc.wait(timeout=10)


if __name__ == "__main__":
    main()
