"""The whole scenario suite, timed: wall time of `vaultsim run` and per scenario; the jail's cost.

    .venv/bin/python bench/suite.py [--jobs N] [--runs N] [--isolation M] [PATHS...]
    .venv/bin/python bench/suite.py --jail [--runs N] [--samples N]

Runs `vaultsim run` as a user would (a fresh process, its JSON report in a
temporary file), `--runs` times, and prints the wall time of each run, the
slowest scenarios (time per trial, from the report) and the figure the issue
sets a target for: seconds per 30 scenarios on this machine's cores.

`--jail` measures what the agent jail costs: per agent process (an agent_stub
forked by the fork server that exits at once, with and without its jail:
decoys, tripwires, bwrap, joining, dropping privileges, tearing down), and
for the whole suite (runs with `--isolation bwrap` and `--isolation none`,
alternated so the host's load falls on both alike).

Targets: <= 10 s for 30 scenarios on 2 cores (issue #6); the default suite
(`make run`) in under 15 s on 2 cores (issue #22); the jail < 30 ms per
agent process, and the suite with it within 1.2x of without (issue #23).
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
TARGET_JAIL_MS = 30.0
TARGET_JAIL_RATIO = 1.2
TARGET_SUITE_S = 15.0


def run_once(paths: list[str], jobs: int, isolation: str = "auto") -> tuple[float, dict, int]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "vault.cli.main", "run", *paths, "--jobs", str(jobs), "-q",
                               "--isolation", isolation, "--json", str(report)], cwd=ROOT, capture_output=True,
                              text=True)
        wall = time.monotonic() - started
        if not report.exists():
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"vaultsim run exited {proc.returncode} without a report")
        return wall, json.loads(report.read_text()), proc.returncode


def agent_cost(samples: int) -> None:
    """ms per agent process: the same agent_stub forked by the fork server, jailed and not."""
    import asyncio
    import shutil
    import socket
    import statistics

    sys.path.insert(0, str(ROOT))
    from vault.runner.forkserver import ForkServer
    from vault.runner.procs import ExecLauncher, Registry
    from vault.runner.tripwires import AgentJail

    async def measure() -> tuple[list[float], list[float]]:
        registry = Registry()
        server = ForkServer(registry, ExecLauncher(registry))
        server.launch(dict(os.environ))
        await server.connect()
        root = Path(tempfile.mkdtemp(prefix="vsb-", dir="/tmp"))
        listener = socket.socket(socket.AF_UNIX)
        try:
            (root / "h").mkdir()
            (root / "kr").mkdir()
            (root / "kr" / "keyring.json").write_text("{}")
            for name in ("approver.token", "credentials.enc", "audit.log"):
                (root / "h" / name).write_text("x")
            listener.bind(str(root / "h" / "agent.sock"))
            listener.listen()
            task = root / "task-0.json"
            task.write_text("{}")
            state = root / "st" / "a"
            state.mkdir(parents=True)
            times: dict[bool, list[float]] = {False: [], True: []}
            cpu: dict[bool, list[float]] = {False: [], True: []}
            assert server._proc is not None
            for i in range(2 * samples + 2):
                jailed = bool(i % 2)
                started = time.perf_counter()
                cpu_before = time.process_time() + _children_cpu(server._proc.pid)
                jail = spec = None
                if jailed:
                    jail = AgentJail(root, i, root / "h", [task], state, str(ROOT), "none", (1,))
                    spec = await jail.start()
                out = root / f"agent-{i}.out"
                proc = await server.spawn("agent_stub", ["--help"], env=dict(os.environ), cwd=str(ROOT),
                                          stdout=out, stderr=out, jail=spec)
                code = await proc.wait()
                if jail is not None:
                    await jail.close()
                    jail.remove_decoys()
                if code != 0:
                    raise SystemExit(f"the agent exited {code}: {out.read_text()[-500:]}")
                if i >= 2:  # the first of each is warm-up
                    times[jailed].append((time.perf_counter() - started) * 1000)
                    cpu[jailed].append((time.process_time() + _children_cpu(server._proc.pid) - cpu_before) * 1000)
            return times[False], times[True], cpu[False], cpu[True]
        finally:
            listener.close()
            await server.aclose()
            shutil.rmtree(root, ignore_errors=True)

    plain, jailed, plain_cpu, jailed_cpu = asyncio.run(measure())
    p50 = statistics.median
    q = statistics.quantiles
    cost = p50(jailed) - p50(plain)
    cpu = p50(jailed_cpu) - p50(plain_cpu)
    print(f"per agent process ({samples} each, alternated; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores): unjailed p50 {p50(plain):.1f} ms, jailed p50 {p50(jailed):.1f} ms "
          f"(p90 {q(jailed, n=10)[-1]:.1f} ms); the jail adds {cost:.1f} ms of wall time and {cpu:.1f} ms of "
          f"CPU (target < {TARGET_JAIL_MS:g} ms): " + ("met" if cost < TARGET_JAIL_MS else "MISSED"))


def _children_cpu(pid: int) -> float:
    """CPU seconds of the waited-for children of `pid` (the fork server's: every agent and jail)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def suite_ratio(paths: list[str], jobs: int, runs: int) -> None:
    walls: dict[str, list[float]] = {"bwrap": [], "none": []}
    for i in range(runs):
        for mode in (("bwrap", "none") if i % 2 == 0 else ("none", "bwrap")):
            wall, doc, code = run_once(paths, jobs, mode)
            walls[mode].append(wall)
            s = doc["summary"]
            print(f"  run {i + 1} --isolation {mode:<5}: {wall:.2f}s wall for {s['trials']} trials; "
                  f"release {s['release']} (exit {code})")
    ratios = [b / n for b, n in zip(walls["bwrap"], walls["none"])]
    print(f"suite with the jail / without, per pair of runs: {', '.join(f'{r:.2f}x' for r in ratios)}; "
          f"best walls {min(walls['bwrap']):.2f}s / {min(walls['none']):.2f}s = "
          f"{min(walls['bwrap']) / min(walls['none']):.2f}x (target <= {TARGET_JAIL_RATIO:g}x): "
          + ("met" if min(walls["bwrap"]) / min(walls["none"]) <= TARGET_JAIL_RATIO else "MISSED"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", default=["scenarios/"])
    p.add_argument("--jobs", type=int, default=2 * (os.cpu_count() or 1), help="as `make run` (default: twice the cores)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--top", type=int, default=12, help="how many of the slowest scenarios to list")
    p.add_argument("--isolation", choices=("auto", "bwrap", "none"), default="auto")
    p.add_argument("--jail", action="store_true", help="measure the jail's cost (per agent, and the suite)")
    p.add_argument("--samples", type=int, default=30, help="with --jail: agents timed each way")
    args = p.parse_args()

    if args.jail:
        agent_cost(args.samples)
        suite_ratio(args.paths, args.jobs, args.runs)
        return 0
    walls = []
    for i in range(args.runs):
        wall, doc, code = run_once(args.paths, args.jobs, args.isolation)
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
