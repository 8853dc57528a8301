"""Leak scan cost: the plain search (`any(n in w for n in needles)`, before) vs vault.runner.needle_scan.

Per 4 MiB window of dense random data and of text-like data (JSON lines: words, numbers, ids in
base64), with the needles of 1 and of 5 credentials (vault.runner.bypass.leak_needles, the
trial's `vsk_` form): ms of CPU per window and MB/s, best of --reps; then per small window of text
(an agent's output) with 5 and 20 credentials' needles (a trial beside others), µs of CPU. Then a trial's end: --files files
of --mib MiB each (half dense, half text) scanned when the agent ended (collect.leak_window with
the trial's needle_scan.Clean), then again at the trial's end, remembered clean vs read again.
Last, building the matcher of a trial beside many others (`-j N` without a jail scans for every
open trial's credentials, and the set changes as trials start and end): ms of CPU for 20 to 160
credentials, with an SSH private key among every 20: from nothing, and once the set changed by one
credential (each credential's part is built once), against pruning all at once and pairwise.

First, an agent's output as the runner scans it at the trial's end (collect.leak_window: the needles,
then compressed streams, dumps, the text unwrapped and by its letters, base64 decoded), MiB/s of
CPU for --out-mib MiB of plain text (JSON lines), lines of one letter (what red team 7 prints to
hold its grading) and lines of base64, with 1, 5 and 20 credentials' needles (a trial beside
others scans for every open trial's).

    .venv/bin/python bench/leak_scan.py [--reps 5] [--files 16] [--mib 4] [--out-mib 16] [--only output]
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vault.runner import bypass, collect, needle_scan, unpack  # noqa: E402

WINDOW = 4 << 20


def text_like(size: int, rnd: random.Random) -> bytes:
    words = [bytes(rnd.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 11)))
             for _ in range(2000)]
    out, n = [], 0
    while n < size:
        line = (b'{"id": "%s", "name": "%s %s", "count": %d, "note": "%s"}\n'
                % (secrets.token_urlsafe(rnd.randint(6, 18)).encode(), rnd.choice(words), rnd.choice(words),
                   rnd.randint(0, 10 ** 6), b" ".join(rnd.choice(words) for _ in range(rnd.randint(3, 12)))))
        out.append(line)
        n += len(line)
    return b"".join(out)[:size]


def best_ms(fn, data: bytes, reps: int) -> float:  # type: ignore[no-untyped-def]
    """CPU time (the process's: steadier than wall time on a shared host), best of `reps`."""
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        fn(data)
        best = min(best, time.process_time() - t)
    return best * 1e3


def windows(reps: int) -> None:
    rnd = random.Random(1)
    tokens = ["vsk_" + secrets.token_urlsafe(24) for _ in range(5)]
    data = {"dense": os.urandom(WINDOW), "text": text_like(WINDOW, rnd),
            # what a hostile agent prints to hold its grading: lines of one letter, lines of base64
            "xlines": (b"x" * 1023 + b"\n") * (WINDOW // 1024),
            "b64": b"".join(base64.b64encode(os.urandom(765)) + b"\n" for _ in range(WINDOW // 1024))}
    print(f"{'data':6} {'tokens':>6} {'needles':>7} {'before ms':>10} {'MB/s':>7} {'after ms':>9} {'MB/s':>7} {'x':>5}")
    for kind, window in data.items():
        for k in (1, 5):
            needles = [n for t in tokens[:k] for n in bypass.leak_needles(t)]
            match = needle_scan.matcher(needles)
            assert match.found(window) == any(n in window for n in needles)
            before = best_ms(lambda w: any(n in w for n in needles), window, reps)
            after = best_ms(match.found, window, reps)
            mb = WINDOW / 1e6
            print(f"{kind:6} {k:>6} {len(needles):>7} {before:>10.1f} {mb / before * 1e3:>7.0f} {after:>9.1f} "
                  f"{mb / after * 1e3:>7.0f} {before / after:>5.1f}")


def outputs(mib: int) -> None:
    """An agent's stdout of `mib` MiB per shape, scanned whole as the trial's end does: MiB/s of CPU."""
    rnd = random.Random(4)
    size = mib << 20
    shapes = {"text": lambda: text_like(size, rnd),
              "x lines": lambda: (b"x" * 1023 + b"\n") * (size // 1024),
              "b64 lines": lambda: b"".join(base64.b64encode(os.urandom(57)) + b"\n" for _ in range(size // 77))}
    tokens = ["vsk_" + secrets.token_urlsafe(24) for _ in range(20)]
    print(f"an agent's output of {mib} MiB scanned whole (collect.leak_window), MiB/s of CPU; credentials:")
    print(f"{'shape':10} " + " ".join(f"{k:>7}" for k in (1, 5, 20)))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "agent-0.out"
        for shape, make in shapes.items():
            path.write_bytes(make())
            row = []
            for k in (1, 5, 20):
                needles = [n for t in tokens[:k] for n in bypass.leak_needles(t)]
                unpack.start()  # the trial's budgets, whole
                t = time.process_time()
                assert collect.leak_window(path, needles) == b""
                row.append(mib / (time.process_time() - t))
            print(f"{shape:10} " + " ".join(f"{r:7.1f}" for r in row), flush=True)


def small_windows(reps: int) -> None:
    """An agent's output and small files, scanned for its trial's and its neighbours' credentials
    (5 and 20): µs of CPU per window of text-like data, against the plain search."""
    rnd = random.Random(3)
    tokens = ["vsk_" + secrets.token_urlsafe(24) for _ in range(20)]
    print(f"{'bytes':>6} {'tokens':>6} {'before us':>10} {'after us':>9} {'x':>5}")
    for size in (200, 2_000, 20_000):
        window = text_like(size, rnd)
        for k in (5, 20):
            needles = [n for t in tokens[:k] for n in bypass.leak_needles(t)]
            match = needle_scan.matcher(needles)
            assert match.found(window) == any(n in window for n in needles)
            before = best_ms(lambda w: [any(n in w for n in needles) for _ in range(50)], window, reps) * 20
            after = best_ms(lambda w: [match.found(w) for _ in range(50)], window, reps) * 20
            print(f"{size:>6} {k:>6} {before:>10.0f} {after:>9.0f} {before / after:>5.1f}")


def trial_end(files: int, mib: int) -> None:
    rnd = random.Random(2)
    needles = [n for _ in range(5) for n in bypass.leak_needles("vsk_" + secrets.token_urlsafe(24))]
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i in range(files):
            p = Path(d) / f"f{i}"
            p.write_bytes(os.urandom(mib << 20) if i % 2 else text_like(mib << 20, rnd))
            paths.append(p)
        # a file changed within SETTLE_NS of its scan is not remembered: the agent ended a while ago
        deadline = time.time_ns() + 2 * needle_scan.SETTLE_NS
        while time.time_ns() < deadline:
            time.sleep(0.01)
        clean = needle_scan.Clean()

        def scan(seen: needle_scan.Clean | None) -> float:
            t = time.process_time()
            for p in paths:
                assert collect.leak_window(p, needles, seen) == b""
            return (time.process_time() - t) * 1e3
        at_exit = scan(clean)
        remembered = scan(clean)
        again = scan(None)
        print(f"trial end, 5 credentials, {files} files x {mib} MiB already scanned at the agent's end "
              f"({at_exit:.0f} ms then): remembered clean {remembered:.1f} ms, read again {again:.0f} ms")


def _pairwise_minimal(needles: tuple[bytes, ...]) -> list[bytes]:
    """The pruning before: each needle checked against every one kept."""
    out: list[bytes] = []
    for n in sorted(dict.fromkeys(needles), key=len):
        if not any(k in n for k in out):
            out.append(n)
    return out


def matcher_build(reps: int) -> None:
    key = ("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(secrets.token_urlsafe(52)[:70] for _ in range(5))
           + "\n-----END OPENSSH PRIVATE KEY-----\n")
    for k in (20, 40, 80, 160):
        values = ["vsk_" + secrets.token_urlsafe(24) for _ in range(k - k // 20)]
        values += [key.replace("A", chr(66 + i)) for i in range(k // 20)]
        needles = tuple(n for v in values for n in bypass.leak_needles(v))

        def first() -> float:  # no credential's part built yet
            needle_scan._part.cache_clear()
            return _cpu_ms(lambda: needle_scan.Matcher(needles))
        build = min(first() for _ in range(reps))
        # the set as a trial beside others sees it change: one credential ends, another begins
        changed = [needles + tuple(bypass.leak_needles("vsk_" + secrets.token_urlsafe(24))) for _ in range(reps)]
        needle_scan.Matcher(needles)
        rebuild = min(_cpu_ms(lambda: needle_scan.Matcher(c)) for c in changed)
        prune = min(_cpu_ms(lambda: needle_scan._minimal(needles)) for _ in range(reps))
        before = _cpu_ms(lambda: _pairwise_minimal(needles)) if k <= 80 else float("nan")
        print(f"matcher for {k:>3} credentials ({len(needles):>5} needles): built in {build:6.1f} ms, with one "
              f"credential new {rebuild:5.1f} ms; all pruned at once {prune:5.1f} ms (pairwise: {before:7.1f} ms)")


def _cpu_ms(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.process_time()
    fn()
    return (time.process_time() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--mib", type=int, default=4)
    ap.add_argument("--out-mib", type=int, default=16)
    ap.add_argument("--only", choices=["output"], help="only the agent's output, scanned whole")
    args = ap.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    outputs(args.out_mib)
    if args.only:
        return
    print(f"ms of CPU per {WINDOW >> 20} MiB window, best of {args.reps}")
    windows(args.reps)
    small_windows(args.reps)
    trial_end(args.files, args.mib)
    matcher_build(min(args.reps, 3))


if __name__ == "__main__":
    main()
