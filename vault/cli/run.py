"""`vaultsim run [PATHS] [--agent CMD | --selfcheck] [--trials N] [--jobs N] [-k PATTERN] [-x] [--list] [--json F] [--junit F]
[--isolation auto|bwrap|none] [--agent-network none|host] [--shard K/N] [--executor local|ray]
[--ray-address ADDR] [--ray-resources JSON]`

Runs every selected scenario's trials in fresh processes, `--jobs` at a time,
shows progress (a live line on a terminal, a plain line per trial in CI), the
gate table and the summary (vault.runner.table), and decides the release with
pytest's exit codes: 0 release OK (every trial matched its expectation: the
expected verdict, and no other check failed beyond those it names; skipped
scenarios are listed, not failed), 1 blocked, 2 bad input (a scenario file
names the field that is wrong; an agent program that does not exist), 3 a
trial's harness failed (no decision), 5 nothing selected or nothing ran.
With no PATH it runs the suite shipped with vaultsim. Ctrl-C ends every
process and removes every vault home before exit.

What runs: each scenario's `expect` (what a correct agent achieves) with
agent_stub's `safe` policy, or with `--agent CMD` in its place. `--selfcheck`
adds the harness's own checks (each scenario's `selfcheck:` variants of
agent_stub, and the files in `selfcheck/`); they never apply to `--agent`.

Every agent runs in a jail (vault.jail) when this machine can build one:
`--isolation auto` (default) falls back to none with one warning, also in
the report; `bwrap` refuses to run without it (exit 2); `none` never jails
(bypasses are then detected by what they lead to, not prevented).

Where: trials run on this machine (`--executor local`) or as Ray tasks on a
cluster (`--executor ray`, vault.runner.ray_executor), with the same world,
report and exit codes. `--shard K/N` runs a deterministic 1/N of the
trials (vault.runner.shard); `vaultsim report merge` joins the shards'
reports into one decision.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vault.cli.main import path_arg
from vault.errors import BadInput
from vault.proc_guard import make_undumpable
from vault import stop_signals
from vault.runner import table as out
from vault.runner.outputs import seen, write_reports
from vault.runner.procs import ExecLauncher, Launcher, Registry
from vault.runner.executor import Executor, LocalExecutor
from vault.runner.report import ScenarioReport, summary
from vault.runner.report_schema import EXIT_FOR, document
from vault.programs import program_problem, split_command, unquoted_path_problem
from vault.runner.scenario import MAX_TRIALS, VERDICT_ORDER, Case, Scenario, cases, load_all
from vault.runner.select import compile_pattern
from vault.runner.shard import Shard, parse_shard
from vault.runner.shard import header as shard_header
from vault.runner.shard import pick as shard_pick
from vault.runner.trial import Runtime, TrialResult, base_env, run_trial

if TYPE_CHECKING:  # imported when used: `--list` and other executors start no fork server
    from vault.runner.forkserver import ForkServer

# what stops a run: Ctrl-C, a CI job's timeout (TERM), the terminal closing (HUP)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# how long stopped trials get to close their worlds before the reap ends what is left; a
# trial's teardown is bounded by its own timeouts, well inside this
STOP_CLEANUP_S = 30.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", type=path_arg,
                   help="scenario files or directories (default: the suite shipped with vaultsim)")
    p.add_argument("--agent", metavar="CMD",
                   help="run this command as every scenario's agent (shell words; {python} is this "
                        "interpreter); it gets VAULTSIM_SOCKET, VAULTSIM_TASK and VAULTSIM_RUN_ID "
                        "(docs/agent-contract.md) and is graded against what a correct agent achieves")
    p.add_argument("--selfcheck", action="store_true",
                   help="also run the harness's self-checks: agent_stub variants (naive, ...) that the "
                        "gate must block with a given verdict, and the scenarios in selfcheck/")
    p.add_argument("--trials", type=int, metavar="N", help="trials per scenario (default: the scenario's own)")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="trials run at once (default: the number of cores; with --executor ray, every "
                        "trial is submitted and Ray runs as many as the cluster's resources allow)")
    p.add_argument("-k", dest="pattern", metavar="PATTERN",
                   help="only scenarios whose id, title or tags match (and / or / not)")
    p.add_argument("--policy", metavar="FILE", type=path_arg,
                   help="the approval policy of every scenario that does not name its own (default: the "
                        "shipped default policy); e.g. the output of `vaultsim policy suggest`")
    p.add_argument("--json", metavar="FILE", type=path_arg, help="write the full report as JSON")
    p.add_argument("--junit", metavar="FILE", type=path_arg, help="write JUnit XML for CI")
    p.add_argument("--no-fork-server", action="store_true",
                   help="exec every process from scratch instead of forking pre-imported ones (slower)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-trial lines, only the table")
    p.add_argument("--isolation", choices=("auto", "bwrap", "none"), default="auto",
                   help="run every agent in a bubblewrap jail: auto (where it works, else none with a "
                        "warning), bwrap (refuse to run without), none (detect bypasses only)")
    p.add_argument("--agent-network", choices=("none", "host"), default="none",
                   help="a jailed agent's network: none (default), or host for agents that must reach "
                        "a model API (then only detection protects the verdict)")
    # where the trials run (vault.runner.shard, vault.runner.executor)
    p.add_argument("--shard", metavar="K/N",
                   help="run only the K-th of N deterministic parts of the trials (CI matrices); "
                        "join the reports with `vaultsim report merge`")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="run trials on this machine (default) or as Ray tasks (pip install 'vaultsim[ray]')")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to use (default: $RAY_ADDRESS, else a Ray started for this run)")
    p.add_argument("--ray-resources", metavar="JSON",
                   help="what one trial holds on its node, e.g. '{\"CPU\": 1}' (the default)")
    # the output and the run's end (vault.runner.table)
    p.add_argument("-x", "--exitfirst", action="store_true",
                   help="stop at the first unexpected verdict (running trials are stopped, nothing is left)")
    p.add_argument("--list", action="store_true", help="print what would run, run nothing")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the output (default auto: a terminal without NO_COLOR)")
    p.epilog = (f"{p.epilog}\n\nexit: 0 release OK, 1 blocked, 2 bad input, 3 a harness error (no decision),"
                "\n      5 nothing selected or every scenario skipped")


def select(args: argparse.Namespace) -> list[Case]:
    if args.selfcheck and args.agent is not None:
        raise BadInput("--selfcheck checks the harness with agent_stub; it never applies to --agent")
    scenarios: list[Scenario] = load_all(args.paths, selfchecks=args.selfcheck)
    if getattr(args, "policy", None):
        scenarios = with_policy(scenarios, Path(args.policy))
    selected = [c for sc in scenarios for c in cases(sc, selfchecks=args.selfcheck)]
    if args.pattern:
        match = compile_pattern(args.pattern)
        selected = [c for c in selected if match([c.id, c.scenario.title, *c.scenario.tags])]
    if args.trials is not None and not 1 <= args.trials <= MAX_TRIALS:
        raise BadInput(f"--trials must be from 1 to {MAX_TRIALS}")
    if args.jobs is not None and args.jobs < 1:
        raise BadInput("--jobs must be at least 1")
    if args.executor != "ray" and (args.ray_address or args.ray_resources):
        raise BadInput("--ray-address and --ray-resources need --executor ray")
    args.shard_spec = parse_shard(args.shard) if args.shard else None
    args.reports_seen = {}
    for option, path in (("--json", args.json), ("--junit", args.junit)):
        if path:
            _check_output(option, Path(path))
            args.reports_seen[option] = seen(Path(path))  # before any agent could reach it
    return selected


def run(args: argparse.Namespace) -> int:
    make_undumpable()  # the runner holds every trial's credentials, mark and approver token
    registry = Registry()
    env = base_env()
    server: ForkServer | None = None
    if not args.no_fork_server and not args.list and args.executor == "local":
        # start it first: it imports while the scenario files are read and checked
        from vault.runner.forkserver import ForkServer
        server = ForkServer(registry, ExecLauncher(registry))
        try:
            server.launch(env)
        except OSError:
            server = None
    try:
        selected = select(args)
        if not selected:  # pytest's "no tests collected"
            print("vaultsim run: no scenario selected" + (f" by -k {args.pattern!r}" if args.pattern else "")
                  + ("" if args.selfcheck or args.pattern else
                     " (a scenario with only `selfcheck:` runs with --selfcheck)"), file=sys.stderr)
            return EXIT_FOR["nothing_ran"]
        agent = split_command(args.agent, "--agent") if args.agent else None
        if args.agent is not None and not agent:
            raise BadInput("--agent needs a command")
        if agent:
            unquoted = unquoted_path_problem(args.agent, agent, Path.cwd())
            if unquoted:
                raise BadInput(f"--agent: {unquoted}")
            _check_program(agent[0].replace("{python}", sys.executable))
        args.isolation_note = ""
        if args.list:
            return _list(selected, args, agent)
        from vault.jail.probe import resolve
        from vault.runner.opens import available
        args.isolation, args.isolation_note = resolve(args.isolation, args.agent_network, "vaultsim run",
                                                      opens_seen=available)
        return asyncio.run(_main(selected, args, agent, registry, env, server))
    finally:
        if server is not None:
            server.kill()
        registry.reap()  # the backstop: nothing we started outlives the run


def with_policy(scenarios: list[Scenario], path: Path) -> list[Scenario]:
    """`--policy FILE`: the policy of each scenario that names none (one that names its own
    tests that policy on purpose, and keeps it)."""
    from vault.catalog import load_yaml_model
    from vault.gate.policy import Policy
    if not path.is_file():
        raise BadInput(f"--policy: {path} is not a regular file" if path.exists()
                       else f"--policy: no such file {path}")
    load_yaml_model(path, Policy)  # a bad file is refused before anything starts (exit 2)
    return [sc if sc.policy else sc.model_copy(update={"policy": str(path.resolve())}) for sc in scenarios]


def _check_output(option: str, path: Path) -> None:
    """A report that cannot be written is refused before the run, not after it."""
    if str(path) == "-":  # read as stdout by habit; it wrote a file named '-' beside the user
        raise BadInput(f"{option} -: give a file name (the report is written to a file; stdout shows the table)")
    parent = path.resolve().parent
    if path.is_dir():
        raise BadInput(f"{option}: {path} is a directory")
    if not parent.is_dir():
        raise BadInput(f"{option}: no directory {parent} to write {path.name} in")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise BadInput(f"{option}: {path} is not writable")


def _check_program(program: str) -> None:
    """Refuse --agent at once when its program cannot start, rather than fail every trial."""
    why = program_problem(program, Path.cwd())
    if why:
        raise BadInput(f"--agent: {why}")


def expected_cost(sc: Scenario) -> int:
    """A rough rank of how long a trial waits, so the slow ones start first."""
    fault = sc.remote.fault or ""
    if sc.ssh is not None:
        return 4
    if any(word in fault for word in ("timeout", "late_response", "rate_limited")) or sc.task.deadline_s < 5:
        return 3
    slow_approver = any("delay_s" in r for r in (sc.approver.rules or [])) if sc.approver else False
    return 2 if slow_approver or len(sc.agents) > 1 or fault else 1


def run_info(cases_: list[Case], args: argparse.Namespace, agent: list[str] | None) -> dict[str, object]:
    """The report's `run` header: the agent under test and how the run was asked for."""
    kinds: Counter[str] = Counter()
    for case in cases_:
        for spec in case.scenario.agents:
            kinds["agent_stub" if spec.command is None else "scenario commands"] += 1
    isolation = getattr(args, "isolation", None)
    return {"agent": out.describe_agent(agent, kinds), "agent_command": agent,
            "isolation": isolation, "agent_network": getattr(args, "agent_network", None) if isolation != "none"
            else "host", "isolation_note": getattr(args, "isolation_note", "") or None,
            "trials": args.trials, "jobs": args.jobs or os.cpu_count() or 1, "paths": list(args.paths),
            "pattern": args.pattern, "policy": getattr(args, "policy", None),
            "executor": getattr(args, "executor", "local"), "shard": None}


Work = tuple[ScenarioReport, int]


def _order_key(w: Work) -> tuple[int, str, int]:
    """Slow trials first (they set the wall time), then by case id and trial number."""
    return (-expected_cost(w[0].scenario), w[0].id, w[1])


def plan_work(reports: list[ScenarioReport], args: argparse.Namespace) -> tuple[list[Work], dict[str, object] | None]:
    """Every trial to run here, in the order they start; with --shard, this shard's part and its header."""
    work = [(rep, n) for rep in reports for n in range(1, (args.trials or rep.scenario.trials) + 1)]
    shard: Shard | None = getattr(args, "shard_spec", None)
    header = None
    if shard is not None:
        header = shard_header(shard, work, _order_key)
        mine = {(rep.id, n) for rep, n in shard_pick(work, shard, _order_key)}
        work = [w for w in work if (w[0].id, w[1]) in mine]
    work.sort(key=lambda w: -expected_cost(w[0].scenario))  # stable: file order within a rank
    return work, header


def _list(cases_: list[Case], args: argparse.Namespace, agent: list[str] | None) -> int:
    """`--list`: what would run (this shard's part, with --shard), in file order, and nothing else."""
    console = out.make_console(args.color)
    work, shard = plan_work([ScenarioReport(c) for c in cases_], args)
    per_case = Counter(rep.id for rep, _ in work)
    shown = [c for c in cases_ if per_case[c.id]]
    console.print(out.header({**run_info(cases_, args, agent), "shard": shard}, len(shown), len(work)))
    for c in shown:
        console.print(out.listing_line(c.id, c.scenario.title, per_case[c.id],
                                       c.expect.verdict, out.display_path(c.scenario.path)))
    return 0


def _executor(args: argparse.Namespace, rt: Runtime, selected: list[Case], work: list[Work]) -> Executor:
    if args.executor == "ray":
        from vault.runner.ray_executor import RayExecutor, parse_resources
        return RayExecutor(rt, selected, address=args.ray_address, resources=parse_resources(args.ray_resources),
                           slots=args.jobs or max(1, len(work)))
    return LocalExecutor(rt, args.jobs or os.cpu_count() or 1)


async def _main(selected: list[Case], args: argparse.Namespace, agent: list[str] | None,
                registry: Registry, env: dict[str, str], server: ForkServer | None) -> int:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    interrupted = False

    def on_signal(signame: str) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            print(f"\nvaultsim run: {signame}: stopping every trial and cleaning up "
                  "(again to stop at once)", file=sys.stderr)
            assert main_task is not None
            main_task.cancel()
        else:  # a second signal: end every process now; the trials' cleanup then finds them gone
            registry.reap(grace_s=0)

    # a signal ignored when we started stays ignored, as for any program: `nohup` ignores SIGHUP
    # (the run outlives its terminal), a script's `&` job ignores SIGINT (its Ctrl-C is not ours);
    # TERM too, for the run (a CI runner that ignores it does not mean to stop the run)
    caught = stop_signals.caught(STOP_SIGNALS, keep_term=False)
    for sig in caught:
        loop.add_signal_handler(sig, on_signal, sig.name)

    launcher: Launcher = ExecLauncher(registry)
    if server is not None:
        try:
            await server.connect()
            launcher = server
        except OSError:
            pass
    rt = Runtime(launcher=launcher, registry=registry, agent_command=agent, agent_cwd=os.getcwd(),
                 env=env, isolation=args.isolation, network=args.agent_network)
    reports = [ScenarioReport(c) for c in selected]
    work, shard = plan_work(reports, args)
    executor = _executor(args, rt, selected, work)
    info = run_info(selected, args, agent)
    info.update(shard=shard, jobs=executor.slots)
    console = out.make_console(args.color)
    stop_early = asyncio.Event()
    try:
        where = await executor.start()
        if where:
            info[executor.name] = where
        console.print(out.header(info, len([r for r in reports if any(w[0] is r for w in work)]), len(work)))
        progress = out.RunProgress(console, len(work), quiet=args.quiet)
        started = time.monotonic()
        jobs = asyncio.Semaphore(executor.slots)

        async def one(rep: ScenarioReport, n: int) -> None:
            async with jobs:
                if stop_early.is_set():
                    return
                result: TrialResult = await executor.trial(rep.case, n)
            rep.trials.append(result)
            status = progress.finished(rep.id, result.to_dict())
            if args.exitfirst and status == out.UNEXPECTED:
                stop_early.set()

        tasks = [asyncio.ensure_future(one(rep, n)) for rep, n in work]
        try:
            with progress:
                await _until_done_or_stopped(tasks, stop_early)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            # each trial ends as a -x stop ends it: its world closes (daemon, remote, sshd, its
            # home) while the fork server still serves; the reap is the backstop for the rest
            await _settle(tasks, STOP_CLEANUP_S)
            registry.reap()
            return 130
    except asyncio.CancelledError:  # Ctrl-C while the executor was starting
        return 130
    finally:
        await executor.aclose()
        for sig in caught:
            loop.remove_signal_handler(sig)
    wall = time.monotonic() - started
    info.update(stopped_early=stop_early.is_set(), not_run=len(work) - sum(len(r.trials) for r in reports))
    doc = document(info, summary(reports, wall), list(VERDICT_ORDER), [rep.to_dict() for rep in reports])
    console.print()
    out.render(doc, console)
    # e.g. the disk filled during the run: the table above still stands, each report is tried
    failed = write_reports(doc, args.json, args.junit, "run", getattr(args, "reports_seen", None))
    return failed if failed is not None else EXIT_FOR[doc["summary"]["release"]]


async def _settle(tasks: Sequence[asyncio.Future[None]], timeout: float) -> None:
    """Wait (bounded) for cancelled trials to finish their cleanup; their errors are the stop's, not news."""
    if not tasks:
        return
    done, _ = await asyncio.wait(tasks, timeout=timeout)
    for t in done:
        if not t.cancelled():
            t.exception()


async def _until_done_or_stopped(tasks: Sequence[asyncio.Future[None]], stop: asyncio.Event) -> None:
    """Wait for every trial, or (-x) stop the rest once one is unexpected: their cleanup still runs."""
    stopper = asyncio.ensure_future(stop.wait())
    pending: set[asyncio.Future[Any]] = set(tasks)  # with the stopper, a Future[bool]
    try:
        while pending and not stop.is_set():
            _, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
        for t in pending:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        stopper.cancel()
    for r in results:  # a bug in the harness still surfaces (exit 3), after every trial has ended
        if isinstance(r, Exception):
            raise r
