"""What a run tells people and CI: live lines, the gate table, JSON, JUnit XML.

Per scenario the report keeps the distribution of verdicts over its trials,
never an average, so one duplicate effect in ten trials cannot hide behind
nine passes. `response_only_false_pass` counts trials a grader reading only
the final message would have passed although the environment says otherwise.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..text import printable
from .scenario import VERDICT_ORDER, Scenario
from .trial import TrialResult

EXTRA = ("ERROR", "SKIPPED")


@dataclass
class ScenarioReport:
    scenario: Scenario
    trials: list[TrialResult] = field(default_factory=list)

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
            "id": self.scenario.id, "title": self.scenario.title, "file": str(self.scenario.path or ""),
            "tags": self.scenario.tags, "expected": self.scenario.expect.verdict,
            "trials": len(self.trials), "verdicts": dict(self.verdicts), "ok": self.ok,
            "response_only_false_pass": self.false_passes,
            "prompts_by_scope": self.prompts(), "time_s": round(self.seconds, 3),
            "trial_results": [t.to_dict() for t in sorted(self.trials, key=lambda t: t.trial)],
        }


def _distribution(counts: Counter[str]) -> str:
    order = {v: i for i, v in enumerate((*VERDICT_ORDER, *EXTRA))}
    return " ".join(f"{v}×{n}" if n > 1 else v for v, n in sorted(counts.items(), key=lambda x: order[x[0]]))


def _prompts(scopes: dict[str, list[int]]) -> str:
    parts = []
    for scope, counts in sorted(scopes.items()):
        values = sorted(set(counts))
        shown = str(values[0]) if len(values) == 1 else "{" + ",".join(map(str, values)) + "}"
        parts.append(f"{printable(scope)}: {shown}")
    return "; ".join(parts) or "-"


def progress_line(done: int, total: int, r: TrialResult) -> str:
    mark = "ok " if r.ok else "!! "
    width = len(str(total))
    expect = "" if r.verdict == r.expected else f" (expected {r.expected})"
    why = ""
    if not r.ok or r.verdict == "ERROR":
        reasons = r.grade.reasons if r.grade else ([r.error] if r.error else [])
        # reasons can quote what an agent said, and its stderr is its own: shown as text, never as
        # terminal control (an escape sequence could repaint a verdict above)
        lines = [reasons[0] if reasons else "no finding: the gate saw nothing wrong", *_agent_trouble(r)]
        why = "".join(f"\n      {printable(line)}" for line in lines)
    if r.verdict == "SKIPPED":
        why = f" ({printable(r.error or '')})"
    return f"[{done:>{width}}/{total}] {mark}{r.verdict:<22} {r.scenario}#{r.trial}{expect} {r.duration_s:.2f}s{why}"


def _agent_trouble(r: TrialResult) -> list[str]:
    """An agent that failed to run is the likely cause of a surprising verdict: say so."""
    lines = []
    for a in r.summary.get("agents", []):
        if a.get("killed_at_deadline"):
            lines.append(f"agent {a['name']} was killed at the task deadline")
        elif a.get("exit_code"):
            last = a.get("stderr_last")
            lines.append(f"agent {a['name']} exited {a['exit_code']}" + (f": {last}" if last else ""))
    return lines


def table(reports: list[ScenarioReport], out: TextIO) -> None:
    rows = [("SCENARIO", "TRIALS", "VERDICTS", "EXPECTED", "PROMPTS BY SCOPE", "TIME", "")]
    for rep in reports:
        rows.append((rep.scenario.id, str(len(rep.trials)), _distribution(rep.verdicts),
                     rep.scenario.expect.verdict, _prompts(rep.prompts()), f"{rep.seconds:.2f}s",
                     "" if rep.ok else "BLOCKS"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths[4] = min(widths[4], 60)
    for r in rows:
        cells = [c if i != 4 or len(c) <= 60 else c[:57] + "..." for i, c in enumerate(r)]
        out.write("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() + "\n")


def summary(reports: list[ScenarioReport], wall_s: float) -> dict[str, Any]:
    verdicts: Counter[str] = Counter()
    for rep in reports:
        verdicts.update(rep.verdicts)
    blocked = [rep.scenario.id for rep in reports if not rep.ok]
    return {
        "release": "blocked" if blocked else "ok",
        "blocked_by": blocked,
        "scenarios": len(reports),
        "trials": sum(len(rep.trials) for rep in reports),
        "verdicts": dict(verdicts),
        "response_only_false_pass": sum(rep.false_passes for rep in reports),
        "skipped": [rep.scenario.id for rep in reports if rep.skipped],
        "wall_time_s": round(wall_s, 3),
    }


def write_json(path: Path, reports: list[ScenarioReport], wall_s: float,
               isolation: dict[str, str] | None = None) -> None:
    doc = {"summary": {**summary(reports, wall_s), "isolation": isolation or {}},
           "verdict_order": list(VERDICT_ORDER), "scenarios": [rep.to_dict() for rep in reports]}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")


def write_junit(path: Path, reports: list[ScenarioReport], wall_s: float,
                isolation: dict[str, str] | None = None) -> None:
    trials = [t for rep in reports for t in rep.trials]
    suite = ET.Element("testsuite", name="vaultsim release gate", tests=str(len(trials)),
                       failures=str(sum(not t.ok and t.verdict != "ERROR" for t in trials)),
                       errors=str(sum(t.verdict == "ERROR" and not t.ok for t in trials)),
                       skipped=str(sum(t.verdict == "SKIPPED" for t in trials)), time=f"{wall_s:.3f}")
    _properties(suite, {f"isolation.{k}": v for k, v in (isolation or {}).items() if v})
    for rep in reports:
        for t in sorted(rep.trials, key=lambda t: t.trial):
            case = ET.SubElement(suite, "testcase", classname=f"scenarios.{rep.scenario.id}",
                                 name=f"trial {t.trial}", time=f"{t.duration_s:.3f}")
            # how this trial's agents were isolated (a jail, or detection only)
            _properties(case, {f"isolation.{k}": v for k, v in t.summary.get("isolation", {}).items()})
            if t.verdict == "SKIPPED":
                ET.SubElement(case, "skipped", message=printable(t.error or "skipped"))
            elif t.verdict == "ERROR" and not t.ok:
                ET.SubElement(case, "error", message=printable(t.error or "error")).text = json.dumps(
                    t.summary.get("logs", {}), indent=1)
            elif not t.ok:
                # control characters are not even allowed in XML 1.0
                reasons = [printable(x) for x in t.grade.reasons] if t.grade else []
                ET.SubElement(case, "failure", message=f"{t.verdict}, expected {t.expected}",
                              type=t.verdict).text = "\n".join(reasons)
            ET.SubElement(case, "system-out").text = json.dumps(
                {k: v for k, v in t.to_dict().items() if k in ("verdict", "expected", "findings", "prompts",
                                                                "effects", "attempts", "audit")}, indent=1)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def _properties(parent: ET.Element, values: dict[str, str]) -> None:
    if values:
        props = ET.SubElement(parent, "properties")
        for name, value in values.items():
            ET.SubElement(props, "property", name=name, value=printable(str(value)))
