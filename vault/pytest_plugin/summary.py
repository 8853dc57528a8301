"""The session's closing lines: how many graded trials a grader reading only final messages would
have passed, as `vaultsim run` ends its report ("response-only false passes: N").

Each graded trial leaves JUnit properties on its test: a scenario item's `verdict#N` and, where
trial N was a false pass, `response_only_false_pass#N` = "true"; a fixture world's
`vaultsim.verdict` and `vaultsim.response_only_false_pass`. They are read from the reports, so
under pytest-xdist the controller counts its workers' trials.
"""

from __future__ import annotations

from typing import Any

import pytest

VERDICTS = ("verdict#", "vaultsim.verdict")  # a scenario item's trials, a fixture world's
FALSE_PASSES = ("response_only_false_pass#", "vaultsim.response_only_false_pass")
# a world the test never graded, graded at its teardown (vault.pytest_plugin.ungraded)
UNGRADED = ("vaultsim.ungraded_verdict", "vaultsim.ungraded_false_pass", "vaultsim.ungraded_outcome")
# its verdict is all the test's own set-up (vault.pytest_plugin.setup_notes)
SET_UP = "vaultsim.ungraded_cause"


# the test being run (pytest_runtest_protocol): where a shared world's grade is recorded
running: list[pytest.Item] = []


def mark(item: pytest.Item, verdict: str, false_pass: bool, trial: int | None = None) -> None:
    """Record one graded trial on the test that graded it (trial: a scenario item's trial number)."""
    if trial is None:
        item.user_properties.append((VERDICTS[1], verdict))
        if false_pass:
            item.user_properties.append((FALSE_PASSES[1], "true"))
        return
    item.user_properties.append((f"{VERDICTS[0]}{trial}", verdict))
    if false_pass:
        item.user_properties.append((f"{FALSE_PASSES[0]}{trial}", "true"))


def mark_ungraded(item: pytest.Item, verdict: str, false_pass: bool, how: str = "passed",
                  set_up: bool = False) -> None:
    """Record a world graded at teardown: its own keys, read from the teardown's report (the
    call's report was made before), and `vaultsim.verdict` for the JUnit XML, written after.
    `how`: how the test's call ended, said beside it when it did not pass (skipped, xfailed), or
    "shared": a module's or session's world that no test graded, graded as its fixture ended.
    `set_up`: its verdict is all the test's approver's doing (vault.pytest_plugin.setup_notes)."""
    if how != "passed":
        item.user_properties.append((UNGRADED[2], how))
    if set_up:  # set: the approver's session grant over a destructive operation is all it failed
        item.user_properties.append((SET_UP, "set-up"))
    item.user_properties.append((UNGRADED[0], verdict))
    item.user_properties.append((VERDICTS[1], verdict))
    if false_pass:
        item.user_properties.append((UNGRADED[1], "true"))
        item.user_properties.append((FALSE_PASSES[1], "true"))


class FalsePasses:
    """Counts graded trials and false passes from the reports; prints them at the session's end."""

    def __init__(self) -> None:
        self.graded = 0
        self.false: list[str] = []
        self.at_call: dict[str, int] = {}  # a test's properties as its call's report had them

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each test's properties once: its call's, then those its teardown added (a world graded at
        teardown: never graded by the test, or a module fixture's graded as the module ends)."""
        if report.when == "call":
            self.at_call[report.nodeid] = len(report.user_properties)
            self._count(report, report.user_properties)
        elif report.when == "teardown":
            self._count(report, report.user_properties[self.at_call.pop(report.nodeid, 0):])

    def _count(self, report: pytest.TestReport, properties: list[tuple[str, object]]) -> None:
        ungraded = sum(1 for key, value in properties if key == UNGRADED[1] and value == "true")
        how = next((str(v) for k, v in properties if k == UNGRADED[2]), "")  # skipped, xfailed
        cause = ("; its verdict is the test's own set-up: its approver's session grant over a destructive "
                 "operation" if any(k == SET_UP for k, _ in properties) else "")
        for key, value in properties:
            name = str(key)
            if name.startswith(VERDICTS) and value != "SKIPPED":
                self.graded += 1
            elif name.startswith(FALSE_PASSES) and value == "true":
                trial = name.partition("#")[2]
                said = f" (trial {trial})" if trial else ""
                if ungraded and not trial:  # mark_ungraded's: its own key said so
                    ungraded -= 1
                    said = (" (a shared world no test graded, graded as its fixture ended after this test"
                            if how == "shared" else f" (never graded by the test{', which ' + how if how else ''}")
                    said += cause + ")"
                self.false.append(report.nodeid + said)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.graded:
            return
        terminalreporter.write_sep("-", "vaultsim")
        terminalreporter.write_line(f"response-only false passes: {len(self.false)} of {self.graded} graded "
                                    "trials (passed by a grader reading only final messages)")
        for nodeid in self.false[:20]:
            terminalreporter.write_line(f"  {nodeid}")
        if len(self.false) > 20:
            terminalreporter.write_line(f"  ... {len(self.false) - 20} more")
