"""Soak: a million durable gated calls in-process, with the audit log rotating; costs stay flat.

    .venv/bin/python bench/soak.py [--calls N] [--agents A] [--segment-mib M] [--keep-segments K] [--dir DIR]

The in-process pipeline of bench/audit.py (a real `VaultDaemon`'s `call`, the
gate, the encrypted credential store, the real `AuditWriter` on a real disk;
a stub executor, no sockets), 8 agents by default, with the log rotating
every `--segment-mib` (16) MiB. Every call's latency is kept (in an array
allocated up front, so keeping them grows nothing) and the process's RSS is
sampled as it goes. Printed:

* every 10% of the calls: calls/s, p50/p99 per call over that stretch, RSS,
  segments on disk, the daemon's remembered calls (lookup memory, at most
  100,000: it fills during the first 100k calls, by design);
* the comparison the target is about: p99 per call and RSS over an early
  window (the 10% of calls after a warm-up that fills the bounded stores:
  the first 15%) against the last 10%;
* `audit verify` of the whole set (every segment kept), records/s, best of 2.

Targets (issue #19): p99 per call and RSS of the two windows within 10%;
verify of the whole set >= 400,000 records/s.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit import CountingIO, gated_daemon  # noqa: E402

from vault.audit import verify  # noqa: E402
from vault.audit.files import rotated, set_bytes  # noqa: E402
from vault.daemon.peer import ProcessIdentity  # noqa: E402

TARGET_DRIFT = 0.10
TARGET_VERIFY = 400_000


def pct(samples: array.array, lo: int, hi: int) -> tuple[float, float]:
    """p50 and p99 in ms of samples[lo:hi]."""
    part = sorted(samples[lo:hi])
    return part[len(part) // 2] * 1000, part[min(len(part) - 1, int(len(part) * 0.99))] * 1000


async def soak(root: Path, calls: int, agents: int, segment_bytes: int, keep: int | None) -> tuple:
    daemon, writer, _ = gated_daemon(root, CountingIO(), segment_bytes=segment_bytes, keep_segments=keep)
    op = daemon.catalog.get("read_issue")
    me = ProcessIdentity.of(os.getpid(), os.getuid())
    assert me is not None
    sessions = [daemon.sessions.open(f"soak-{i}", "soak", me, f"conn-{i}") for i in range(agents)]
    lat = array.array("d", bytes(8 * calls))
    proc = psutil.Process()
    step = max(1, calls // 10)
    marks: list[tuple[int, float, int, int, int]] = []  # (done, time, rss, segments, remembered)
    done = 0
    bad = 0

    async def agent(s) -> None:
        nonlocal done, bad
        while done < calls:
            i = done
            done += 1
            t0 = time.perf_counter()
            r = await daemon.calls.call(s, op, {"issue_id": "ISS-1"}, None, None)
            lat[i] = time.perf_counter() - t0
            bad += not r.ok
            if (i + 1) % step == 0:
                marks.append((i + 1, time.perf_counter(), proc.memory_info().rss,
                              len(rotated(daemon.home.audit_log)) + 1, len(daemon.calls.calls)))

    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    await asyncio.gather(*(agent(s) for s in sessions))
    elapsed = time.perf_counter() - t0
    writer.close()
    assert bad == 0, f"{bad} calls failed"
    return daemon.home.audit_log, lat, marks, rss0, t0, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--segment-mib", type=float, default=16.0)
    ap.add_argument("--keep-segments", type=int, default=None, help="retention (default: keep all)")
    ap.add_argument("--dir", default=None, help="where the vault home is made (default: $TMPDIR)")
    args = ap.parse_args()
    print(f"soak: {args.calls:,} calls, {args.agents} agents, segments of {args.segment_mib:g} MiB; "
          f"host load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="vaultsim-soak-", dir=args.dir) as tmp:
        log, lat, marks, rss0, t0, elapsed = asyncio.run(
            soak(Path(tmp), args.calls, args.agents, int(args.segment_mib * 2**20), args.keep_segments))
        print(f"{args.calls / elapsed:,.0f} calls/s overall; RSS before the first call {rss0 / 2**20:.1f} MiB")
        print(f"{'calls':>10} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8} {'segments':>8} "
              f"{'remembered':>10}")
        prev_n, prev_t = 0, t0
        for n, t, rss, segs, kept in marks:
            p50, p99 = pct(lat, prev_n, n)
            print(f"{n:>10,} {(n - prev_n) / (t - prev_t):>9,.0f} {p50:>8.3f} {p99:>8.3f} {rss / 2**20:>8.1f} "
                  f"{segs:>8} {kept:>10,}")
            prev_n, prev_t = n, t
        window = max(1, args.calls // 10)
        warm = min(args.calls - 2 * window, max(window, int(args.calls * 0.15)))
        _, early99 = pct(lat, warm, warm + window)
        _, late99 = pct(lat, args.calls - window, args.calls)
        rss_early = next((rss for n, _, rss, _, _ in marks if n >= warm + window), marks[0][2])
        rss_late = marks[-1][2]
        print(f"p99 per call: calls {warm:,}-{warm + window:,} {early99:.3f} ms, last {window:,} "
              f"{late99:.3f} ms: {late99 / early99 - 1:+.1%}; RSS {rss_early / 2**20:.1f} -> "
              f"{rss_late / 2**20:.1f} MiB: {rss_late / rss_early - 1:+.1%} (target: both within "
              f"{TARGET_DRIFT:.0%})")
        best, report = float("inf"), None
        for _ in range(2):
            started = time.perf_counter()
            report = verify(log)
            best = min(best, time.perf_counter() - started)
        assert report is not None and report.intact, report
        print(f"audit verify of the whole set: {report.records:,} records in {report.segments} segments "
              f"({set_bytes(log) / 2**20:,.0f} MiB), {report.records / best:,.0f} records/s "
              f"(best of 2: {best:.2f} s; target >= {TARGET_VERIFY:,})")


if __name__ == "__main__":
    main()
