"""Worlds a test that did not fail never graded: graded at teardown, and a false pass is said.

A test that runs an agent and asserts only on what it printed (`run.final`) is the grader that
reads only final messages: its agent can claim `done` over a step it did wrongly, and the test
passes with nothing in pytest's output naming what it did. So does a test that skips itself, or
marks itself xfail, after its agent ran (`pytest.skip("flaky")` once `run.final` looked wrong, an
xfail mark over a failing assertion): the run stays green. So when a test passed, skipped or
xfailed in its call, each of its worlds that ran an agent and was never graded (`grade()`,
`assert_verdict()`, `assert_no_*`) is graded as `grade()` grades it (expecting PASS); where an
agent claimed done and the verdict is not PASS, a `VaultsimUngradedWarning` names the verdict and
its findings (and how the test ended, when it did not pass), and the session's response-only
false passes list the test. The test itself is not failed: its assertions were its author's
choice (`-W error::vault.pytest_plugin.ungraded.VaultsimUngradedWarning` fails it). A failing test
already says so, and a test skipped before its call ran no agent.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

from vault.pytest_plugin.setup_notes import notes, only_set_up
from vault.pytest_plugin.summary import mark_ungraded

if TYPE_CHECKING:
    from vault.pytest_plugin.world import Vaultsim

# how the test's call ended: "passed", "skipped", "xfailed" or "failed" (vault.pytest_plugin.plugin)
CALL_OUTCOME = pytest.StashKey[str]()
GREEN = ("passed", "skipped", "xfailed")
SHARED = "shared"  # a module- or session-scoped world graded as its fixture ends (grade_shared)


def outcome(report: pytest.TestReport) -> str:
    if report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return "passed" if report.passed else "failed"


class VaultsimUngradedWarning(UserWarning):
    """A world of a test that did not fail, never graded by the test, grades as a false pass."""


def grade_ungraded(item: pytest.Item, worlds: list[Vaultsim]) -> None:
    """Grade each world of a test that passed, skipped or xfailed in its call, that ran an agent
    and was never graded."""
    how = item.stash.get(CALL_OUTCOME, "")
    if how not in GREEN:
        return  # a failing test already says so, and an interrupted one must end at once
    for world in worlds:
        result = _grade(world)
        if result is None:
            continue
        mark_ungraded(item, result.verdict, result.false_pass, how, only_set_up(result))
        if result.false_pass:
            _warn(world, result, f"{item.nodeid}: an agent claims done, but this world, which the test never "
                  f"graded (grade(), assert_verdict()){'' if how == 'passed' else ' before it ' + how}, grades "
                  f"{result.verdict}")


def grade_shared(worlds: list[Vaultsim]) -> None:
    """Grade each world of a module- or session-scoped factory that ran an agent and that no test
    graded, as its fixture ends: it is no one test's, so the test it ends after (the last of its
    scope) carries the grade. An interrupted run tears such fixtures down after its last test's
    protocol (no test running): nothing is graded then, as a test's world is not."""
    from vault.pytest_plugin.summary import running
    if not running:
        return
    item = running[-1]
    for world in worlds:
        result = _grade(world)
        if result is None:
            continue
        mark_ungraded(item, result.verdict, result.false_pass, SHARED, only_set_up(result))
        if result.false_pass:
            _warn(world, result, f"{item.nodeid}: an agent claims done, but the shared world {world.name!r}, "
                  f"which no test graded (grade(), assert_verdict()), grades {result.verdict} as its fixture "
                  "ends after this test")


def _warn(world: Vaultsim, result: Any, said: str) -> None:
    from vault.pytest_plugin.evidence import report
    warnings.warn(VaultsimUngradedWarning(
        f"{said}:\n" + report(result, world.name, notes(world.live.approver, result))), stacklevel=1)


def _grade(world: Vaultsim) -> Any:
    """The world's grade (expecting PASS) if it ran an agent and was never graded, else None."""
    live: Any = world.live
    if live.result is not None or live.closed or not live.evidence.agents:
        return None
    try:
        world._close_clients()
        return live.grade(None)
    except Exception:  # a world that broke is the test's own failure to report, not this
        return None
