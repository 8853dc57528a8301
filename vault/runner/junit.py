"""`vaultsim run --junit FILE`: the run as JUnit XML, for CI servers' test tabs.

The shape is the one Jenkins' xUnit plugin validates (junit-10.xsd), which
pytest's `xunit2` output follows and GitLab, GitHub and Azure read:

    <testsuites name="vaultsim release gate" tests= failures= errors= time=>
      <testsuite name=SCENARIO-ID file=FILE tests= failures= errors= skipped= time=>
        <properties>  scenario.*, and per trial: trial.N.verdict, .expected,
                      .prompts, .prompts.SCOPE, .effects.OP, .attempts.OP, .isolation, .network
        <testcase classname=FILE-WITHOUT-.yaml name="TITLE [trial N]" time=>
          <failure type=VERDICT message="VERDICT, expected X"> every failed check
          <error type=ERROR> the harness failure | <skipped message=WHY>
          <system-out> the trial's evidence summary (JSON)

A testcase is one trial. That schema allows properties on a suite, not on a
testcase, so each scenario is a suite and its trials' verdicts, prompts and
effects are its properties. A trial fails when its verdict differs from the
expectation (a scenario may expect a FAIL_* verdict: the gate caught it).
Everything an agent chose is escaped (`printable`): XML 1.0 cannot even hold
control characters. Written all-or-nothing, like the JSON report.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from vault.text import printable
from vault.runner.report_schema import write_atomic
from vault.runner.table import ERROR, SKIPPED, UNEXPECTED, display_path, distribution, trial_status, why_lines

EVIDENCE = ("verdict", "expected", "findings", "prompts", "effects", "attempts", "audit", "isolation", "network")


def _secs(value: Any) -> str:
    return f"{float(value or 0):.3f}"


def _prop(props: ET.Element, name: str, value: Any) -> None:
    ET.SubElement(props, "property", name=printable(name), value=printable(str(value)))


def testcase_name(sc: dict[str, Any], trial: int) -> str:
    return f"{printable(sc.get('title') or sc.get('id') or '?')} [trial {trial}]"


def classname(sc: dict[str, Any]) -> str:
    shown = display_path(sc.get("file")) or str(sc.get("id", ""))
    for suffix in (".yaml", ".yml"):
        if shown.endswith(suffix):
            return printable(shown[: -len(suffix)])
    return printable(shown)


def build(doc: dict[str, Any]) -> ET.Element:
    root = ET.Element("testsuites", name="vaultsim release gate")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for sc in doc.get("scenarios", []):
        trials = sorted(sc.get("trial_results", []), key=lambda t: t.get("trial", 0))
        if not trials:
            continue
        statuses = [trial_status(t) for t in trials]
        counts = {"tests": len(trials), "failures": statuses.count(UNEXPECTED), "errors": statuses.count(ERROR)}
        for k, v in counts.items():
            totals[k] += v
        suite = ET.SubElement(root, "testsuite", {"name": printable(str(sc.get("id", "?"))),
                                                  "file": printable(display_path(sc.get("file"))),
                                                  **{k: str(v) for k, v in counts.items()},
                                                  "skipped": str(statuses.count(SKIPPED)),
                                                  "time": _secs(sc.get("time_s"))})
        props = ET.SubElement(suite, "properties")
        _prop(props, "scenario.title", sc.get("title", ""))
        _prop(props, "scenario.expected", sc.get("expected", ""))
        _prop(props, "scenario.verdicts", distribution(sc.get("verdicts", {}), doc.get("verdict_order", [])))
        for t in trials:
            _trial_properties(props, t)
        for t, status in zip(trials, statuses):
            _testcase(suite, sc, t, status)
    root.attrib.update({k: str(v) for k, v in totals.items()})
    root.set("time", _secs(doc.get("summary", {}).get("wall_time_s")))
    return root


def _trial_properties(props: ET.Element, t: dict[str, Any]) -> None:
    n = f"trial.{t.get('trial')}"
    _prop(props, f"{n}.verdict", t.get("verdict", ""))
    _prop(props, f"{n}.expected", t.get("expected", ""))
    for key in ("isolation", "network"):  # how the trial's agents were isolated (a jail, or detection only)
        if t.get(key):
            _prop(props, f"{n}.{key}", t[key])
    prompts = t.get("prompts") or {}
    if prompts:
        _prop(props, f"{n}.prompts", prompts.get("total", 0))
        for scope, count in sorted((prompts.get("by_scope") or {}).items()):
            _prop(props, f"{n}.prompts.{scope}", count)
    for kind in ("effects", "attempts"):
        for op, count in sorted((t.get(kind) or {}).items()):
            _prop(props, f"{n}.{kind}.{op}", count)
    if t.get("response_only_false_pass"):
        _prop(props, f"{n}.response_only_false_pass", "true")


def _testcase(suite: ET.Element, sc: dict[str, Any], t: dict[str, Any], status: str) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname(sc), name=testcase_name(sc, t.get("trial", 0)),
                         time=_secs(t.get("duration_s")))
    if status == SKIPPED:
        ET.SubElement(case, "skipped", message=printable(str(t.get("error") or "skipped")))
    elif status == ERROR:
        # JSON escapes every control character, so the logs are safe XML text
        ET.SubElement(case, "error", type="ERROR", message=printable(str(t.get("error") or "harness error"))
                      ).text = json.dumps(t.get("logs", {}), indent=1)
    elif status == UNEXPECTED:
        ET.SubElement(case, "failure", type=str(t.get("verdict")),
                      message=f"{t.get('verdict')}, expected {t.get('expected')}").text = "\n".join(why_lines(t, 50))
    evidence = {k: t[k] for k in EVIDENCE if k in t}
    ET.SubElement(case, "system-out").text = json.dumps(evidence, indent=1, ensure_ascii=True)


def write_junit(path: Path, doc: dict[str, Any], through: bool | None = None) -> None:
    tree = ET.ElementTree(build(doc))
    ET.indent(tree, space=" ")
    buf = io.BytesIO()
    tree.write(buf, encoding="utf-8", xml_declaration=True)
    data = buf.getvalue().decode("utf-8") + "\n"
    if through if through is not None else (path.is_char_device() or path.is_fifo()):  # /dev/stdout, a pipe
        path.write_text(data, encoding="utf-8")
    else:
        write_atomic(path, data)
