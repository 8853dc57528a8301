"""Audit log throughput: durable appends/s and offline verify records/s.

    .venv/bin/python bench/audit.py [--appends N] [--verify-records N]

Runs in a fresh temporary directory (on the same filesystem as $TMPDIR) and
prints three figures:

* the disk's own write+fdatasync rate (context: every durable figure is bound by it);
* durable appends/s with one appender (each append waits for its fdatasync);
* durable appends/s with 8 concurrent appenders in one event loop (group
  commit: they share fdatasyncs), with the number of fdatasyncs it took;
* offline `verify` records/s over a 100k-record log (corpus written with
  fdatasync stubbed out, since only verify is being timed there).

Targets (issue #5): verify >= 250k records/s; 8 appenders >= 8k appends/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from vault.audit import AuditWriter, verify  # noqa: E402

EVENT = {"type": "call_requested", "correlation_id": "c-0190f3a2b4c5d6e7f8a9b0c1d2e3f4a5",
         "session_id": "s-0190f3a2b4c5d6e7f8a9", "operation": "create_deployment",
         "risk": "execute", "target": "api.example.test/deployments"}


class CountingIO:
    """os.write / os.fdatasync, counting the fdatasyncs."""

    def __init__(self, sync: bool = True) -> None:
        self.syncs = 0
        self.sync = sync
        self.write = os.write

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        if self.sync:
            os.fdatasync(fd)


async def appenders(path: Path, key: bytes, sk: Ed25519PrivateKey, tasks: int, each: int,
                    io: CountingIO) -> float:
    w = AuditWriter.open(path, key, sk, io=io)

    async def one(i: int) -> None:
        for j in range(each):
            await w.append({**EVENT, "n": j, "task": i})

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(tasks)))
    elapsed = time.perf_counter() - t0
    w.close()
    return elapsed


async def bulk(path: Path, key: bytes, sk: Ed25519PrivateKey, n: int) -> None:
    w = AuditWriter.open(path, key, sk, io=CountingIO(sync=False))
    for start in range(0, n, 2000):
        await asyncio.gather(*(w.append({**EVENT, "n": i}) for i in range(start, min(n, start + 2000))))
    w.close()


def raw_syncs(path: Path, n: int) -> float:
    """write + fdatasync of one 600-byte line, n times: what the disk allows."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, b"x" * 599 + b"\n")
            os.fdatasync(fd)
        return n / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=4000, help="appends per scenario (default 4000)")
    ap.add_argument("--verify-records", type=int, default=100_000)
    args = ap.parse_args()
    key, sk = os.urandom(32), Ed25519PrivateKey.generate()
    with tempfile.TemporaryDirectory(prefix="vaultsim-bench-") as tmp:
        root = Path(tmp)
        print(f"disk baseline, write+fdatasync: {raw_syncs(root / 'raw', 500):10,.0f} /s  "
              "(the ceiling for one appender; 8 appenders can reach ~8x)")
        io1 = CountingIO()
        t = asyncio.run(appenders(root / "one.log", key, sk, 1, args.appends, io1))
        print(f"durable appends, 1 appender:   {args.appends / t:10,.0f} /s  "
              f"({io1.syncs} fdatasyncs for {args.appends} appends)")
        io8 = CountingIO()
        each = args.appends // 8
        t = asyncio.run(appenders(root / "eight.log", key, sk, 8, each, io8))
        print(f"durable appends, 8 appenders:  {8 * each / t:10,.0f} /s  "
              f"({io8.syncs} fdatasyncs for {8 * each} appends)")
        big = root / "audit.log"
        asyncio.run(bulk(big, key, sk, args.verify_records))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            report = verify(big)
            best = min(best, time.perf_counter() - t0)
        assert report.intact and report.records == args.verify_records, report
        size = big.stat().st_size / 1e6
        print(f"offline verify:                {args.verify_records / best:10,.0f} records/s  "
              f"({args.verify_records:,} records, {size:.1f} MB, best of 3: {best * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
