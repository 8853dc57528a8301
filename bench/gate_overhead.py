"""Gate overhead: the same `read_issue` directly with httpx and through the vault.

Both go to the same fake remote process; the vault path is an agent-side
client on agent.sock -> daemon (gate, audit, credential store) -> aiohttp.
Direct and vault calls alternate, so both see the same machine.

Two vaults are measured, one after the other:

* durable: the audit log on, as shipped. Every call waits for two fdatasyncs
  (the intent before the credential leaves, the result before the answer);
  the disk's own write+fdatasync time is printed beside it, since it bounds this row;
* audit off (`--no-audit`): the daemon, the gate and the credential store alone.

Prints p50/p99 of each and the p50 ratio, then the durable floor: the audit-off
vault plus the disk's two write+fdatasyncs, what a durable call would cost if
staging its records cost nothing. Target (issue #2): ratio <= 1.5.

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
    print(f"  ratio p50    : {v50 / d50:.2f}x  (target <= 1.5x)")
    if "--no-audit" not in daemon_args:
        print(f"  this disk's write+fdatasync: {sync_ms:.3f} ms each (two per durable call)")
    return d50, v50, sync_ms


def main() -> None:
    args = ARGS.parse_args()
    where = "" if args.dir == "/tmp" else f", home in {args.dir}"
    _, _, sync_ms = measure(f"durable vault (audit on{where})", n=args.n, parent=args.dir)
    direct, off, _ = measure(f"audit off (daemon + gate + credential store{where})", "--no-audit",
                             n=args.n, parent=args.dir)
    # what the durable vault would cost if its records were free and only the two syncs remained
    floor = off + 2 * sync_ms
    print(f"durable floor on this disk: audit-off p50 + 2 x write+fdatasync = {floor:.3f} ms "
          f"= {floor / direct:.2f}x direct")


if __name__ == "__main__":
    main()
