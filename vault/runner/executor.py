"""Where a run's trials execute: one small interface, a local and a Ray implementation.

`vaultsim run` decides what to run, shows progress, builds the report and
decides the release; an executor only turns (case, trial number) into a
`TrialResult`. Both build the same world (vault.runner.trial.run_trial: fresh
home, daemon, remote, approver, agents; the same isolation, faults and
grading), so a verdict never depends on where the trial ran.

    local   this machine, `--jobs` trials at once (the default)
    ray     a Ray cluster, each trial a Ray task (vault.runner.ray_executor;
            the optional extra `vaultsim[ray]`)

    await ex.start()          -> what the report's `run` header records about it
    await ex.trial(case, n)   -> TrialResult (a harness failure is an ERROR result)
    await ex.aclose()         every trial ended, everything it started gone
"""

from __future__ import annotations

from typing import Any, Protocol

from vault.runner.procs import Launcher
from vault.runner.scenario import Case
from vault.runner.trial import Runtime, TrialResult, run_trial


class Executor(Protocol):
    name: str
    slots: int  # trials the runner keeps in flight at once

    async def start(self) -> dict[str, Any]: ...

    async def trial(self, case: Case, number: int) -> TrialResult: ...

    async def aclose(self) -> None: ...


class LocalExecutor:
    """Trials on this machine, in fresh processes started by the run's launcher."""

    name = "local"

    def __init__(self, rt: Runtime, jobs: int) -> None:
        self.rt, self.slots = rt, jobs

    async def start(self) -> dict[str, Any]:
        return {}

    async def trial(self, case: Case, number: int) -> TrialResult:
        return await run_trial(self.rt, case, number)

    async def aclose(self) -> None:
        launcher: Launcher = self.rt.launcher
        await launcher.aclose()
