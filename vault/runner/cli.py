"""`vaultsim run [PATHS] [--agent CMD] [--trials N] [--jobs N] [-k PATTERN] [--json F] [--junit F]
[--isolation auto|bwrap|none] [--agent-network none|host]`

Runs every selected scenario's trials in fresh processes, `--jobs` at a time,
prints a line per finished trial and the gate table, and decides the release:
exit 0 when every trial got the verdict its scenario expects, 1 when the
release is blocked, 2 for bad input (a scenario file names the field that is
wrong). Ctrl-C ends every process and removes every vault home before exit.

Every agent runs in a jail (vault.jail) when this machine can build one:
`--isolation auto` (default) falls back to none with one warning, also in
the report; `bwrap` refuses to run without it (exit 2); `none` never jails
(bypasses are then detected, not prevented).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from ..errors import BadInput
from ..proc_guard import make_undumpable
from .procs import ExecLauncher, Registry
from .report import ScenarioReport, progress_line, summary, table, write_json, write_junit
from .scenario import Scenario, load_all
from .select import compile_pattern
from .trial import Runtime, TrialResult, base_env, run_trial


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="scenario files or directories (default: the scenarios/ directory)")
    p.add_argument("--agent", metavar="CMD",
                   help="run this command as every scenario's agent (shell words; {python} is this "
                        "interpreter); it gets VAULTSIM_SOCKET, VAULTSIM_TASK and VAULTSIM_RUN_ID")
    p.add_argument("--trials", type=int, metavar="N", help="trials per scenario (default: the scenario's own)")
    p.add_argument("--jobs", "-j", type=int, metavar="N", default=os.cpu_count() or 1,
                   help="trials run at once (default: the number of cores)")
    p.add_argument("-k", dest="pattern", metavar="PATTERN",
                   help="only scenarios whose id, title or tags match (and / or / not)")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML for CI")
    p.add_argument("--no-fork-server", action="store_true",
                   help="exec every process from scratch instead of forking pre-imported ones (slower)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-trial lines, only the table")
    p.add_argument("--isolation", choices=("auto", "bwrap", "none"), default="auto",
                   help="run every agent in a bubblewrap jail: auto (where it works, else none with a "
                        "warning), bwrap (refuse to run without), none (detect bypasses only)")
    p.add_argument("--agent-network", choices=("none", "host"), default="none",
                   help="a jailed agent's network: none (default), or host for agents that must reach "
                        "a model API (then only detection protects the verdict)")


def select(args: argparse.Namespace) -> list[Scenario]:
    scenarios = load_all(args.paths)
    if args.pattern:
        match = compile_pattern(args.pattern)
        scenarios = [s for s in scenarios if match([s.id, s.title, *s.tags])]
    if not scenarios:
        raise BadInput("no scenario selected" + (f" by -k {args.pattern!r}" if args.pattern else ""))
    if args.trials is not None and args.trials < 1:
        raise BadInput("--trials must be at least 1")
    if args.jobs < 1:
        raise BadInput("--jobs must be at least 1")
    for option, path in (("--json", args.json), ("--junit", args.junit)):
        if path:
            _check_output(option, Path(path))
    return scenarios


def run(args: argparse.Namespace) -> int:
    make_undumpable()  # the runner holds every trial's credentials, mark and approver token
    registry = Registry()
    env = base_env()
    server = None
    if not args.no_fork_server:
        # start it first: it imports while the scenario files are read and checked
        from .forkserver import ForkServer
        server = ForkServer(registry, ExecLauncher(registry))
        try:
            server.launch(env)
        except OSError:
            server = None
    try:
        scenarios = select(args)
        agent = shlex.split(args.agent) if args.agent else None
        if args.agent is not None and not agent:
            raise BadInput("--agent needs a command")
        if agent:
            _check_program(agent[0].replace("{python}", sys.executable))
        from ..jail.probe import resolve
        args.isolation, args.isolation_note = resolve(args.isolation, args.agent_network, "vaultsim run")
        return asyncio.run(_main(scenarios, args, agent, registry, env, server))
    finally:
        if server is not None:
            server.kill()
        registry.reap()  # the backstop: nothing we started outlives the run


def _check_output(option: str, path: Path) -> None:
    """A report that cannot be written is refused before the run, not after it."""
    parent = path.resolve().parent
    if path.is_dir():
        raise BadInput(f"{option}: {path} is a directory")
    if not parent.is_dir():
        raise BadInput(f"{option}: no directory {parent} to write {path.name} in")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise BadInput(f"{option}: {path} is not writable")


def _check_program(program: str) -> None:
    """Refuse --agent at once when its program cannot start, rather than fail every trial."""
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise BadInput(f"--agent: {program!r} is not an executable file")
    elif shutil.which(program) is None:
        raise BadInput(f"--agent: no program {program!r} on PATH")


def expected_cost(sc: Scenario) -> int:
    """A rough rank of how long a trial waits, so the slow ones start first."""
    fault = sc.remote.fault or ""
    if sc.ssh is not None:
        return 4
    if any(word in fault for word in ("timeout", "late_response", "rate_limited")) or sc.task.deadline_s < 5:
        return 3
    slow_approver = any("delay_s" in r for r in (sc.approver.rules or [])) if sc.approver else False
    return 2 if slow_approver or len(sc.agents) > 1 or fault else 1


async def _main(scenarios: list[Scenario], args: argparse.Namespace, agent: list[str] | None,
                registry: Registry, env: dict[str, str], server: object) -> int:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    interrupted = False

    def on_signal(signame: str) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            print(f"\nvaultsim run: {signame}: stopping every trial and cleaning up", file=sys.stderr)
            assert main_task is not None
            main_task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)

    launcher = ExecLauncher(registry)
    if server is not None:
        try:
            await server.connect()  # type: ignore[attr-defined]
            launcher = server  # type: ignore[assignment]
        except OSError:
            pass
    rt = Runtime(launcher=launcher, registry=registry, agent_command=agent, agent_cwd=os.getcwd(),
                 env=env, isolation=args.isolation, network=args.agent_network)
    reports = [ScenarioReport(s) for s in scenarios]
    work = [(rep, n) for rep in reports for n in range(1, (args.trials or rep.scenario.trials) + 1)]
    work.sort(key=lambda w: -expected_cost(w[0].scenario))  # stable: file order within a rank
    jobs = asyncio.Semaphore(args.jobs)
    done = 0
    started = time.monotonic()

    async def one(rep: ScenarioReport, n: int) -> None:
        nonlocal done
        async with jobs:
            result: TrialResult = await run_trial(rt, rep.scenario, n)
        rep.trials.append(result)
        done += 1
        if not args.quiet:
            print(progress_line(done, len(work), result), flush=True)

    try:
        await asyncio.gather(*(one(rep, n) for rep, n in work))
    except asyncio.CancelledError:
        registry.reap()
        return 130
    finally:
        await launcher.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    wall = time.monotonic() - started
    print()
    table(reports, sys.stdout)
    s = summary(reports, wall)
    iso = {"mode": args.isolation, "network": args.agent_network if args.isolation == "bwrap" else "host",
           "note": args.isolation_note}
    print(f"\n{s['trials']} trials of {s['scenarios']} scenarios in {wall:.1f}s; "
          f"response-only false passes: {s['response_only_false_pass']}; "
          + (f"skipped: {', '.join(s['skipped'])}; " if s["skipped"] else "")
          + ("release OK" if s["release"] == "ok" else f"RELEASE BLOCKED by {', '.join(s['blocked_by'])}"))
    if args.isolation_note:
        print(f"isolation: {args.isolation_note}")
    for option, path, write in (("--json", args.json, write_json), ("--junit", args.junit, write_junit)):
        if path:
            try:
                write(Path(path), reports, wall, iso)
            except OSError as exc:  # e.g. the disk filled during the run: the table above still stands
                raise BadInput(f"{option}: cannot write {path}: {exc.strerror}") from None
    return 0 if s["release"] == "ok" else 1
