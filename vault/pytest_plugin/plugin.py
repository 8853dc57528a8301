"""The pytest11 entry point: options, fixtures and the scenario collector.

Fixtures:

    vaultsim          a started world for this test (options from
                      `@pytest.mark.vaultsim(policy=..., catalog=..., fault=...,
                      locked=..., approver=...)`), stopped and removed at teardown
                      whether the test passed or not
    vaultsim_factory  makes more worlds in one test (same options as keywords)
    vaultsim_engine   the session's engine: one loop thread and one fork server
                      (daemon and agent_stub forked pre-imported), so a world
                      costs a fork, not an interpreter start

Options: `--vaultsim-scenarios` (or ini `vaultsim_scenarios = true`) collects
scenario files (vault.pytest_plugin.scenarios); `--vaultsim-selfcheck` adds their
self-checks; `--vaultsim-agent CMD` puts CMD in every scenario's agent's place,
as `vaultsim run --agent`; `--vaultsim-isolation auto|bwrap|none` and
`--vaultsim-agent-network none|host` (as `vaultsim run --isolation/--agent-network`); `--vaultsim-trials N`; `--vaultsim-no-fork-server`.
"""

from __future__ import annotations

import contextlib

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported on first use: collecting tests starts no engine
    from vault.runner.live import Engine

_ENGINE = pytest.StashKey["Engine"]()
WORLD_OPTIONS = frozenset({"policy", "catalog", "fault", "locked", "approver", "credentials", "call_timeout_s",
                           "timeouts"})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vaultsim", "vaultsim: vault worlds and scenario files")
    parser.addini("vaultsim_scenarios", type="bool", default=False,
                  help="collect vaultsim scenario YAML files as test items")
    group.addoption("--vaultsim-scenarios", action="store_true", dest="vaultsim_scenarios",
                    help="collect vaultsim scenario YAML files as test items (as ini vaultsim_scenarios)")
    group.addoption("--vaultsim-selfcheck", action="store_true", dest="vaultsim_selfcheck",
                    help="also collect each scenario's agent_stub self-checks and selfcheck/ files")
    group.addoption("--vaultsim-agent", metavar="CMD", dest="vaultsim_agent",
                    help="run CMD as every scenario's agent (as `vaultsim run --agent`)")
    group.addoption("--vaultsim-isolation", choices=("auto", "bwrap", "none"), default="auto",
                    dest="vaultsim_isolation",
                    help="scenario agents' jail, as `vaultsim run --isolation` (default auto: the jail where "
                         "bubblewrap works)")
    group.addoption("--vaultsim-agent-network", choices=("none", "host"), default="none",
                    dest="vaultsim_agent_network",
                    help="a jailed scenario agent's network, as `vaultsim run --agent-network` (host: for "
                         "agents that call a model API)")
    group.addoption("--vaultsim-trials", type=int, metavar="N", dest="vaultsim_trials",
                    help="trials per scenario (default: the scenario's own)")
    group.addoption("--vaultsim-no-fork-server", action="store_true", dest="vaultsim_no_fork_server",
                    help="exec every daemon and agent from scratch (slower)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vaultsim(**options): options of the `vaultsim` fixture's world "
                                       "(policy, catalog, fault, locked, approver, credentials, call_timeout_s)")
    _check_options(config)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a pytest-xdist worker: the controller's `python -W` options
        from vault.pytest_plugin.warnoptions import apply
        apply(workerinput)
    if not hasattr(config, "workerinput"):  # the process that prints the session's end
        from vault.pytest_plugin.summary import FalsePasses
        config.pluginmanager.register(FalsePasses(), "vaultsim-false-passes")
    if _xdist_controller(config):
        # the controller starts no world, so it never got the handler (installed with the first
        # world's engine): a SIGTERM to it (docker stop, a CI job that ends the main process)
        # killed it outright and its workers went on running their worlds, agents included, for
        # 10-15 s with nobody to report to. Now it is interrupted and passes the signal on
        _interrupt.forward = True
        _interrupt_on_terminate()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, before a worker starts: it is a fresh interpreter without this one's `-W`
    options (vault.pytest_plugin.warnoptions), so they go in its input."""
    from vault.pytest_plugin.warnoptions import forward
    forward(node.workerinput)


def _xdist_controller(config: pytest.Config) -> bool:
    """This process hands tests to pytest-xdist workers (-n N) and runs none itself."""
    if hasattr(config, "workerinput"):
        return False
    try:
        return config.getoption("dist", "no") != "no" and bool(config.getoption("numprocesses", 0))
    except ValueError:
        return False


def _check_options(config: pytest.Config) -> None:
    """Refuse bad options before anything runs, as `vaultsim run` exits 2 for them (not one failed
    or crashed item per scenario)."""
    from vault.runner.scenario import MAX_TRIALS
    trials = config.getoption("vaultsim_trials", None)
    if trials is not None and not 1 <= trials <= MAX_TRIALS:  # as `vaultsim run --trials`
        raise pytest.UsageError(f"--vaultsim-trials {trials}: at least 1 and at most {MAX_TRIALS}")
    agent = config.getoption("vaultsim_agent", None)
    if agent is not None:
        import sys
        from vault.errors import BadInput
        from vault.programs import program_problem, split_command, unquoted_path_problem
        try:
            words = split_command(agent, "--vaultsim-agent")
        except BadInput as exc:
            raise pytest.UsageError(str(exc)) from None
        here = config.invocation_params.dir
        why = (unquoted_path_problem(agent, words, here, "--vaultsim-agent")
               or program_problem(words[0].replace("{python}", sys.executable), here)) if words else "needs a command"
        if why:
            raise pytest.UsageError(f"--vaultsim-agent: {why}")


_ISOLATION = pytest.StashKey[str]()


def isolation(config: pytest.Config) -> str:
    """The scenario items' isolation, resolved once as `vaultsim run` resolves its --isolation
    (auto: the jail where bubblewrap works, else none with one warning); bwrap where none can be
    built is a usage error. Without this the items ran every agent unjailed, where `vaultsim run`
    jails them: an agent reading the vault's files was caught by one and not the other."""
    found = config.stash.get(_ISOLATION, None)
    if found is None:
        from vault.errors import BadInput
        from vault.jail.probe import resolve
        from vault.runner.opens import available
        try:
            found, _ = resolve(config.getoption("vaultsim_isolation") or "auto", network(config), "vaultsim",
                               opens_seen=available)
        except BadInput as exc:
            raise pytest.UsageError(f"--vaultsim-isolation: {exc.message}") from None
        config.stash[_ISOLATION] = found
    return found


def network(config: pytest.Config) -> str:
    return str(config.getoption("vaultsim_agent_network", None) or "none")


def engine(config: pytest.Config) -> Engine:
    """The session's engine, started on first use."""
    found = config.stash.get(_ENGINE, None)
    if found is None:
        from vault.runner.live import Engine
        found = config.stash[_ENGINE] = Engine(fork_server=not config.getoption("vaultsim_no_fork_server"))
        _interrupt_on_terminate()
    return found


class Interrupt:
    """The handler: the first signal raises KeyboardInterrupt; a later one (CI sends SIGINT, then
    SIGTERM a few seconds later) is ignored, so it cannot cut the teardown it started short."""

    def __init__(self) -> None:
        self.seen = False
        self.forward = False  # an xdist controller: its workers hear the signal too

    def __call__(self, signum: int, frame: Any) -> None:
        if self.seen:
            return
        self.seen = True
        if self.forward:
            _signal_children(signum)
        raise KeyboardInterrupt(f"vaultsim: {signal.Signals(signum).name}: ending every world")


_interrupt = Interrupt()


def _signal_children(signum: int) -> None:
    """The signal, to this process's children: an xdist controller's are its workers, which end
    their worlds on it (teardown, at once) instead of waiting out xdist's 10 s and a SIGKILL."""
    import psutil
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.send_signal(signum)


def _interrupt_on_terminate() -> None:
    """SIGTERM or SIGHUP (a CI job cancelled or timed out, a closed terminal) ends the run as Ctrl-C
    does: teardown runs and every world's processes and home go, instead of the interpreter
    dying with agents still running and homes left behind. A handler someone else set stays."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    found = config.stash.get(_ENGINE, None)
    if found is not None:
        found.close()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is _interrupt:
                signal.signal(sig, signal.SIG_DFL)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    config = parent.config
    if not (config.getoption("vaultsim_scenarios") or config.getini("vaultsim_scenarios")):
        return None
    from vault.pytest_plugin.scenarios import ScenarioFile, is_scenario_file
    if is_scenario_file(file_path, bool(config.getoption("vaultsim_selfcheck"))):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """The test running now: a world a module- or session-scoped fixture made (no test of its
    own) records its grade on the test that graded it (world.Vaultsim.grade)."""
    from vault.pytest_plugin.summary import running
    running.append(item)
    try:
        return (yield)
    finally:
        running.remove(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failing test that used a world gets a `vaultsim` section: its evidence and the daemon's log
    tail (redacted), read before teardown removes them."""
    report = yield
    if call.when == "call":  # whether its never-graded worlds are graded at teardown (ungraded.py)
        from vault.pytest_plugin.ungraded import CALL_OUTCOME, outcome
        item.stash[CALL_OUTCOME] = outcome(report)
    world = getattr(item, "funcargs", {}).get("vaultsim")
    if report.failed and call.when == "call" and world is not None:
        report.sections.append(("vaultsim", world.describe()))
    return report


@pytest.fixture(scope="session")
def vaultsim_engine(pytestconfig: pytest.Config) -> Any:
    """The session's engine behind every vaultsim world (a background event loop and fork server)."""
    return engine(pytestconfig)


@pytest.fixture
def vaultsim_factory(vaultsim_engine: Any, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """More worlds in one test: `vaultsim_factory(fault=..., policy=..., ...)` returns a
    `Vaultsim` (from vault.pytest_plugin); every one is stopped and removed at teardown."""
    from vault.pytest_plugin.world import VaultsimFactory
    # homes in tmp_path (a deep one moves to a short /tmp directory: AF_UNIX paths are short)
    factory = VaultsimFactory(vaultsim_engine, tmp_path, request.node.name, request.node)
    try:
        yield factory
        from vault.pytest_plugin.ungraded import grade_ungraded
        grade_ungraded(request.node, factory.made)
    finally:
        factory.close()


@pytest.fixture
def vaultsim(vaultsim_factory: Any, request: pytest.FixtureRequest) -> Any:
    """A fresh vault world (daemon, fake remote, scripted approver) shaped by
    `@pytest.mark.vaultsim(...)`: set `.approver` rules, `.run_agent(cmd, task=...)`, then
    `.assert_verdict(...)`, `.assert_effects(...)`, `.assert_prompts(...)` (docs/ci.md).
    Annotate it as `vault.pytest_plugin.Vaultsim`."""
    options: dict[str, Any] = {}
    for mark in reversed(list(request.node.iter_markers("vaultsim"))):  # the closest mark wins
        if mark.args:  # silently ignored, a positional fault or policy would test another world
            raise pytest.UsageError(f"@pytest.mark.vaultsim takes keyword options only "
                                    f"({', '.join(sorted(WORLD_OPTIONS))}); got the positional "
                                    f"argument {mark.args[0]!r}")
        options.update(mark.kwargs)
    unknown = sorted(set(options) - WORLD_OPTIONS)
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.vaultsim: unknown option {unknown[0]!r} "
                                f"({', '.join(sorted(WORLD_OPTIONS))})")
    return vaultsim_factory(**options)
