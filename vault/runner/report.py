"""What a run found, per scenario and in sum: the content of the report.

(`table` shows it to people, `report_schema` versions it as JSON, `junit`
writes it for CI.)

Per case (a scenario under its expectation, or one of its self-checks, shown
as `id[variant]`) the report keeps the distribution of verdicts over its
trials, never an average, so one duplicate effect in ten trials cannot hide
behind nine passes. Each trial lists every check that failed, not only the
headline verdict; a check that failed beyond what the expectation names
blocks the release. `response_only_false_pass` counts trials a grader reading
only the final message would have passed although the environment says
otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .scenario import Case, Scenario
from .trial import TrialResult


@dataclass
class ScenarioReport:
    case: Case
    trials: list[TrialResult] = field(default_factory=list)

    @property
    def scenario(self) -> Scenario:
        return self.case.scenario

    @property
    def id(self) -> str:
        return self.case.id

    @property
    def expected(self) -> str:
        return self.case.expect.verdict

    @property
    def verdicts(self) -> Counter[str]:
        return Counter(t.verdict for t in self.trials)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.trials)

    @property
    def skipped(self) -> bool:
        return bool(self.trials) and all(t.verdict == "SKIPPED" for t in self.trials)

    @property
    def false_passes(self) -> int:
        return sum(t.false_pass for t in self.trials)

    @property
    def seconds(self) -> float:
        return sum(t.duration_s for t in self.trials)

    def failed_checks(self) -> Counter[str]:
        """How many trials failed each check (headline or not)."""
        return Counter(v for t in self.trials for v in t.failed)

    def prompts(self) -> dict[str, list[int]]:
        """Per scope, the prompt count of every trial (a distribution, not a mean)."""
        scopes: dict[str, list[int]] = {}
        for t in self.trials:
            for scope in t.summary.get("prompts", {}).get("by_scope", {}):
                scopes.setdefault(scope, [])
        for scope, counts in scopes.items():
            for t in self.trials:
                counts.append(int(t.summary.get("prompts", {}).get("by_scope", {}).get(scope, 0)))
        return scopes

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "scenario": self.scenario.id, "selfcheck": self.case.variant,
            "title": self.scenario.title, "file": str(self.scenario.path or ""),
            "tags": self.scenario.tags, "expected": self.expected, "also": list(self.case.expect.also),
            "policy": str(self.scenario.relative(self.scenario.policy)) if self.scenario.policy else None,
            "failed_checks": dict(self.failed_checks()),
            "trials": len(self.trials), "verdicts": dict(self.verdicts), "ok": self.ok,
            "response_only_false_pass": self.false_passes,
            "prompts_by_scope": self.prompts(), "time_s": round(self.seconds, 3),
            "trial_results": [t.to_dict() for t in sorted(self.trials, key=lambda t: t.trial)],
        }


def summary(reports: list[ScenarioReport], wall_s: float) -> dict[str, Any]:
    verdicts: Counter[str] = Counter()
    for rep in reports:
        verdicts.update(rep.verdicts)
    # a harness ERROR is no verdict at all: it leaves the release undecided rather than blocked
    blocked = [rep.id for rep in reports if any(not t.ok and t.verdict != "ERROR" for t in rep.trials)]
    errors = [rep.id for rep in reports if any(t.verdict == "ERROR" and not t.ok for t in rep.trials)]
    skipped = [rep for rep in reports if rep.skipped]
    ran = any(t.verdict != "SKIPPED" for rep in reports for t in rep.trials)
    return {
        "release": "blocked" if blocked else "error" if errors else "ok" if ran else "nothing_ran",
        "blocked_by": blocked,
        "errors": errors,
        "scenarios": len(reports),
        "trials": sum(len(rep.trials) for rep in reports),
        "verdicts": dict(verdicts),
        "response_only_false_pass": sum(rep.false_passes for rep in reports),
        "skipped": [rep.id for rep in skipped],
        "skip_reasons": {rep.id: rep.trials[0].error or "" for rep in skipped},
        "wall_time_s": round(wall_s, 3),
    }
