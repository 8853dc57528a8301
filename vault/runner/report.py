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

from vault.runner.scenario import Case, Scenario
from vault.runner.trial import TrialResult


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

    def head(self) -> dict[str, Any]:
        """What the report says of the case itself, whatever its trials found."""
        return {"id": self.id, "scenario": self.scenario.id, "selfcheck": self.case.variant,
                "title": self.scenario.title, "file": str(self.scenario.path or ""),
                "tags": self.scenario.tags, "expected": self.expected, "also": list(self.case.expect.also),
                "policy": str(self.scenario.relative(self.scenario.policy)) if self.scenario.policy else None}

    def to_dict(self) -> dict[str, Any]:
        return scenario_entry(self.head(), [t.to_dict() for t in self.trials])


def scenario_entry(head: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's report entry from its trials' entries, in trial order whatever order they finished in.

    The one place a case's figures are computed: `vaultsim run` calls it with
    its own trials, `vaultsim report merge` with the trials of every shard."""
    trials = sorted(trials, key=lambda t: t.get("trial", 0))
    scopes: dict[str, list[int]] = {}
    for t in trials:  # per scope, the prompt count of every trial (a distribution, not a mean)
        for scope in (t.get("prompts") or {}).get("by_scope", {}):
            scopes.setdefault(scope, [])
    for scope, counts in scopes.items():
        counts.extend(int((t.get("prompts") or {}).get("by_scope", {}).get(scope, 0)) for t in trials)
    return {
        **head,
        # how many trials failed each check (headline or not)
        "failed_checks": dict(Counter(v for t in trials for v in t.get("failed") or [])),
        "trials": len(trials), "verdicts": dict(Counter(t.get("verdict") for t in trials)),
        "ok": all(t.get("ok") for t in trials),
        "response_only_false_pass": sum(bool(t.get("response_only_false_pass")) for t in trials),
        "prompts_by_scope": scopes, "time_s": round(sum(float(t.get("duration_s") or 0) for t in trials), 3),
        "trial_results": trials,
    }


def summary(reports: list[ScenarioReport], wall_s: float) -> dict[str, Any]:
    return summarize([rep.to_dict() for rep in reports], wall_s)


def summarize(entries: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The release decision over scenario entries (`scenario_entry`), from this run or merged shards."""
    verdicts: Counter[str] = Counter()
    for sc in entries:
        verdicts.update(sc.get("verdicts") or {})
    trials = {sc["id"]: sc.get("trial_results") or [] for sc in entries}
    # a harness ERROR is no verdict at all: it leaves the release undecided rather than blocked
    blocked = [sid for sid, ts in trials.items() if any(not t.get("ok") and t.get("verdict") != "ERROR" for t in ts)]
    errors = [sid for sid, ts in trials.items() if any(t.get("verdict") == "ERROR" and not t.get("ok") for t in ts)]
    skipped = [sid for sid, ts in trials.items() if ts and all(t.get("verdict") == "SKIPPED" for t in ts)]
    ran = any(t.get("verdict") != "SKIPPED" for ts in trials.values() for t in ts)
    return {
        "release": "blocked" if blocked else "error" if errors else "ok" if ran else "nothing_ran",
        "blocked_by": blocked,
        "errors": errors,
        "scenarios": len(entries),
        "trials": sum(len(ts) for ts in trials.values()),
        "verdicts": dict(verdicts),
        "response_only_false_pass": sum(int(sc.get("response_only_false_pass") or 0) for sc in entries),
        "skipped": skipped,
        "skip_reasons": {sid: trials[sid][0].get("error") or "" for sid in skipped},
        "wall_time_s": round(wall_s, 3),
    }
