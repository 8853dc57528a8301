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


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = new_sandbox()
    try:
        yield box
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)
