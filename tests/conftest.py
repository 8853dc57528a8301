"""Shared fixtures: a private sandbox per test with real processes, cleaned up always."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from helpers import Sandbox, new_sandbox

pytest_plugins = ["pytester"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Import the project's modules now, while nothing has been left for the garbage collector.

    pytest rewrites the asserts of every module of a distribution that registers a plugin (ours:
    vault.pytest_plugin), compiling each on first import. On CPython 3.11.7 a finaliser that
    runs during that compile (a subprocess transport a finished test's closed loop left behind)
    breaks it with "AST constructor recursion depth mismatch" (gh-106905, fixed in 3.11.8): a
    test failed only because it imported a module first. Compiled here, nothing is compiled
    later."""
    import importlib
    import pkgutil

    for top in ("vault", "tui", "agent_stub"):
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional extra not installed (mcp, ray): its tests skip
                continue


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """With --durations, also the slowest test files (setup, call and teardown summed): CI has a
    90-minute limit and a file's whole cost, module fixtures included, is what a trim must cut."""
    if not config.getoption("durations", None):
        return
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport):
                path = rep.nodeid.split("::", 1)[0]
                per_file[path] = per_file.get(path, 0.0) + rep.duration
    if per_file:
        terminalreporter.write_sep("=", f"slowest 30 files of {len(per_file)} ({sum(per_file.values()) / 60:.0f} "
                                        "test-minutes in all)")
        for path, spent in sorted(per_file.items(), key=lambda kv: -kv[1])[:30]:
            terminalreporter.write_line(f"{spent:8.1f}s {path}")


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = new_sandbox()
    try:
        yield box
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)
