"""Gate overhead: the same `read_issue` directly with httpx and through the vault.

Both go to the same fake remote process; the vault path is an agent-side
client on agent.sock -> daemon (gate, audit, credential store) -> aiohttp.
Direct and vault calls alternate, so both see the same machine.

Three vaults are measured, one after the other:

* durable (default durability, as shipped): every call waits for one
  fdatasync, the intent's, before the credential leaves; its result record is
  written before the answer and synced by the next call's intent (group
  commit) or the 5 ms timer. The disk's own write+fdatasync time is printed
  beside it, since it bounds this row;
* durable, ``--durability strict``: two fdatasyncs per call, the result synced
  before the answer too (the behaviour before issue #19);
* audit off (`--no-audit`): the daemon, the gate and the credential store alone.

Prints p50/p99 of each and the p50 ratio, then the durable floors: the
audit-off vault plus one write+fdatasync (default) or two (strict), what a
durable call would cost if staging its records cost nothing. Target (issues
#2, #19): ratio <= 1.5 with the default durability.

`--dir` puts the vault home on another filesystem: `--dir /dev/shm` (tmpfs,
where fdatasync costs nothing) shows the vault as it would be on a disk whose
syncs are free, which separates the design's cost from this disk's.

    .venv/bin/python bench/gate_overhead.py [N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx

from _procs import TOKEN, percentiles, vault_with_remote
from audit import raw_syncs

ARGS = argparse.ArgumentParser(description="read_issue direct vs through the vault")
ARGS.add_argument("n", nargs="?", type=int, default=2000, help="calls per path (default 2000)")
ARGS.add_argument("--dir", default="/tmp", help="where the vault home is made (default /tmp)")


def measure(label: str, *daemon_args: str, n: int, parent: str) -> tuple[float, float, float]:
    """Prints one vault's figures; returns (direct p50, vault p50, write+fdatasync) in ms."""
    with vault_with_remote(*daemon_args, parent=parent) as (box, url):
        from vault.client import AgentClient
        from vault.remote.state import SEED_ISSUES

        issue_id = SEED_ISSUES[0]["id"]
        agent = AgentClient(box.agent_sock)
        agent.open_session("bench", "bench")
        direct, vault = [], []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            for i in range(n + 100):
                t0 = time.perf_counter()
                r = http.get(f"/v1/issues/{issue_id}", headers={"X-Correlation-Id": f"c-{i}"})
                t1 = time.perf_counter()
                res = agent.call("read_issue", {"issue_id": issue_id})
                t2 = time.perf_counter()
                if i >= 100:  # warm-up excluded
                    direct.append(t1 - t0)
                    vault.append(t2 - t1)
        assert r.status_code == 200 and res.ok, f"bench calls must succeed: {r.status_code} {res.category}"
        agent.close()
        sync_ms = 1000 / raw_syncs(Path(box.root) / "fsync-probe", 300)
    d50, d99 = percentiles(direct)
    v50, v99 = percentiles(vault)
    print(f"{label}: read_issue x{n}")
    print(f"  direct httpx : p50 {d50:.3f} ms  p99 {d99:.3f} ms")
    print(f"  via vault    : p50 {v50:.3f} ms  p99 {v99:.3f} ms")
    strict = "strict" in daemon_args
    target = "" if "--no-audit" in daemon_args or strict else "  (target <= 1.5x)"
    print(f"  ratio p50    : {v50 / d50:.2f}x{target}")
    if "--no-audit" not in daemon_args:
        print(f"  this disk's write+fdatasync: {sync_ms:.3f} ms each ({'two' if strict else 'one'} "
              "per durable call)")
    return d50, v50, sync_ms


def main() -> None:
    args = ARGS.parse_args()
    where = "" if args.dir == "/tmp" else f", home in {args.dir}"
    import os
    print(f"host load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    d1, v1, sync_ms = measure(f"durable vault (audit on, default durability{where})", n=args.n, parent=args.dir)
    d2, v2, sync2 = measure(f"durable vault, --durability strict{where}", "--durability", "strict",
                            n=args.n, parent=args.dir)
    direct, off, _ = measure(f"audit off (daemon + gate + credential store{where})", "--no-audit",
                             n=args.n, parent=args.dir)
    # what the durable vault would cost if its records were free and only the syncs remained
    floor, floor2 = off + sync_ms, off + 2 * sync2
    print(f"durable floor on this disk: audit-off p50 + 1 x write+fdatasync = {floor:.3f} ms "
          f"= {floor / direct:.2f}x direct (strict: + 2 x = {floor2:.3f} ms = {floor2 / direct:.2f}x)")
    print(f"summary: default {v1 / d1:.2f}x direct (target <= 1.5x), strict {v2 / d2:.2f}x, "
          f"audit off {off / direct:.2f}x")


if __name__ == "__main__":
    main()
