"""Scenario files as pytest items: `pytest scenarios/` runs the suite as `vaultsim run` does.

Opt-in (ini `vaultsim_scenarios = true`, or `--vaultsim-scenarios`), so a
project's other YAML files are never collected. A YAML file is a scenario when
its top level has `agents` (policies, approver scripts, plans and the catalog
beside the scenarios are not); `selfcheck/` folders only with
`--vaultsim-selfcheck`. A file that does not load is a collection error naming
the field, as `vaultsim run` exits 2.

Each case (the scenario's `expect`, and with `--vaultsim-selfcheck` each
self-check variant) is one item; its trials run through the runner's own
`run_trial`, so the verdicts are those of `vaultsim run`. `-k`, `-x`,
`--junitxml` are pytest's; each item records its verdicts as JUnit properties, and the
session ends with the count of response-only false passes (vault.pytest_plugin.summary).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vault.catalog import load_yaml_file
from vault.errors import BadInput


def is_scenario_file(path: Path, selfcheck: bool) -> bool:
    if path.suffix not in (".yaml", ".yml") or path.name == "catalog.yaml":
        return False
    if path.parent.name == "selfcheck" and not selfcheck:
        return False
    try:  # bounded: a FIFO, a huge integer or an alias bomb is not a scenario, not a hang or a crash
        doc = load_yaml_file(path)
    except BadInput:
        return False
    return isinstance(doc, dict) and "agents" in doc


class ScenarioFailed(Exception):
    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        from vault.errors import BadInput
        from vault.runner.scenario import cases, load_scenario
        selfcheck = bool(self.config.getoption("vaultsim_selfcheck"))
        try:
            sc = load_scenario(self.path)
        except BadInput as exc:
            raise self.CollectError(f"vaultsim: bad scenario file: {exc.message}") from None
        for case in cases(sc, selfchecks=selfcheck):
            yield ScenarioItem.from_parent(self, name=case.id, case=case)


class ScenarioItem(pytest.Item):
    def __init__(self, *, case: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.case = case
        # tags are keywords (`-k matrix`), not markers: --strict-markers would refuse unknown ones
        self.keywords.update({t: True for t in case.scenario.tags})

    def runtest(self) -> None:
        from vault.pytest_plugin.evidence import evidence_lines
        from vault.runner.table import trial_line
        from vault.runner.trial import run_trial
        from vault.pytest_plugin.plugin import engine as session_engine, isolation, network
        from vault.pytest_plugin.summary import mark
        engine = session_engine(self.config)
        rt = engine.runtime()
        rt.isolation, rt.network = isolation(self.config), network(self.config)  # as `vaultsim run` jails them
        agent = self.config.getoption("vaultsim_agent")
        if agent:
            from vault.programs import split_command
            rt.agent_command = split_command(agent, "--vaultsim-agent")  # read by the usage check first
            rt.agent_cwd = str(self.config.invocation_params.dir)
        trials = self.config.getoption("vaultsim_trials") or self.case.scenario.trials
        results = [engine.call(run_trial(rt, self.case, n), timeout=600) for n in range(1, trials + 1)]
        for r in results:
            mark(self, r.verdict, r.false_pass, r.trial)
        if all(r.verdict == "SKIPPED" for r in results):
            pytest.skip(results[0].error or "skipped")
        bad = [r for r in results if not r.ok]
        if bad:
            lines = []
            for r in bad:
                lines.append(trial_line(r.trial, trials, self.case.id, r.to_dict()).plain.split("] ", 1)[-1])
                lines += evidence_lines(r)  # as the fixture's assert_verdict: prompts, effects, transcript
            raise ScenarioFailed(lines)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ScenarioFailed):
            return "\n".join(excinfo.value.lines)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario {self.case.id} (expects {self.case.expect.verdict})"
