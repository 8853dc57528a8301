"""Worlds a passing test never graded: graded at teardown, and a false pass is said.

A test that runs an agent and asserts only on what it printed (`run.final`) is the grader that
reads only final messages: its agent can claim `done` over a step it did wrongly, and the test
passes with nothing in pytest's output naming what it did. So when a test passed, each of its
worlds that ran an agent and was never graded (`grade()`, `assert_verdict()`, `assert_no_*`) is
graded as `grade()` grades it (expecting PASS); where an agent claimed done and the verdict is
not PASS, a `VaultsimUngradedWarning` names the verdict and its findings, and the session's
response-only false passes list the test. The test itself is not failed: its assertions were
its author's choice (`-W error::vault.pytest_plugin.ungraded.VaultsimUngradedWarning` fails it).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

from vault.pytest_plugin.summary import mark_ungraded

if TYPE_CHECKING:
    from vault.pytest_plugin.world import Vaultsim

CALL_PASSED = pytest.StashKey[bool]()


class VaultsimUngradedWarning(UserWarning):
    """A passing test's world, never graded by the test, grades as a false pass."""


def grade_ungraded(item: pytest.Item, worlds: list[Vaultsim]) -> None:
    """Grade each of a passed test's worlds that ran an agent and was never graded."""
    if not item.stash.get(CALL_PASSED, False):
        return  # a failing test already says so, and an interrupted one must end at once
    for world in worlds:
        live: Any = world.live
        if live.result is not None or live.closed or not live.evidence.agents:
            continue
        try:
            world._close_clients()
            result = live.grade(None)
        except Exception:  # a world that broke is the test's own failure to report, not this
            continue
        mark_ungraded(item, result.verdict, result.false_pass)
        if result.false_pass:
            from vault.pytest_plugin.evidence import report
            warnings.warn(VaultsimUngradedWarning(
                f"{item.nodeid}: an agent claims done, but this world, which the test never graded "
                f"(grade(), assert_verdict()), grades {result.verdict}:\n"
                + report(result, world.name)), stacklevel=1)
