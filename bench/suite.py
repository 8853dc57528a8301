"""The whole scenario suite, timed: wall time of `vaultsim run` and per scenario.

    .venv/bin/python bench/suite.py [--jobs N] [--runs N] [PATHS...]

Runs `vaultsim run` as a user would (a fresh process, its JSON report in a
temporary file), `--runs` times, and prints the wall time of each run, the
slowest scenarios (time per trial, from the report) and the figure the issue
sets a target for: seconds per 30 scenarios on this machine's cores.

Targets: <= 10 s for 30 scenarios on 2 cores (issue #6); the default suite
(`make run`) in under 15 s on 2 cores (issue #22).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S_PER_30 = 10.0
TARGET_SUITE_S = 15.0


def run_once(paths: list[str], jobs: int) -> tuple[float, dict, int]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "vault.cli", "run", *paths, "--jobs", str(jobs), "-q",
                               "--json", str(report)], cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - started
        if not report.exists():
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"vaultsim run exited {proc.returncode} without a report")
        return wall, json.loads(report.read_text()), proc.returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", default=["scenarios/"])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--top", type=int, default=12, help="how many of the slowest scenarios to list")
    args = p.parse_args()

    walls = []
    for i in range(args.runs):
        wall, doc, code = run_once(args.paths, args.jobs)
        walls.append(wall)
        s = doc["summary"]
        print(f"run {i + 1}: {wall:.2f}s wall ({s['wall_time_s']:.2f}s inside the runner) for "
              f"{s['scenarios']} scenarios / {s['trials']} trials, --jobs {args.jobs} on {os.cpu_count()} cores; "
              f"release {s['release']} (exit {code})")
    scenarios = doc["scenarios"]
    per = sorted(((sc["time_s"] / max(1, sc["trials"]), sc["id"]) for sc in scenarios), reverse=True)
    print("\nper scenario (seconds per trial, slowest first):")
    for seconds, name in per[: args.top]:
        print(f"  {seconds:6.2f}  {name}")
    rest = per[args.top:]
    if rest:
        print(f"  ... {len(rest)} more, {min(x for x, _ in rest):.2f}-{max(x for x, _ in rest):.2f}s each")
    total = sum(x for x, _ in per)
    best = min(walls)
    per30 = best * 30 / len(scenarios)
    print(f"\nsum of trial times {total:.1f}s; best wall {best:.2f}s; "
          f"{per30:.2f}s per 30 scenarios (target <= {TARGET_S_PER_30:g}s on 2 cores): "
          + ("met" if per30 <= TARGET_S_PER_30 else "MISSED"))
    print(f"whole run: best wall {best:.2f}s (target < {TARGET_SUITE_S:g}s on 2 cores for `make run`): "
          + ("met" if best < TARGET_SUITE_S else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
