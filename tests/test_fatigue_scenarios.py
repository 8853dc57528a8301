"""Approval fatigue graded end to end, and a policy that asks less, proven by re-running.

Real `vaultsim run` processes on the shipped scenarios: a scripted approver
answering 20 prompts in 0.2 s each fails FAIL_APPROVAL_FATIGUE naming the
rate; the same work with a 3 s think time under a session policy passes.
`vaultsim policy suggest` reads the shipped suite's report and its suggestion
is run again with `--policy`: fewer prompts, the same verdicts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT
from run_report_fixture import report
from vault.runner.report_schema import Report

SCENARIOS = ROOT / "scenarios"
DESTRUCTIVE = {"delete", "execute", "spend", "permission", "credential"}


def vaultsim(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def run_json(tmp: Path, name: str, *args: str) -> dict[str, Any]:
    out = tmp / name
    # -j 4, as `make run` on two cores: the whole suite mostly waits (approvals due, deadlines)
    done = vaultsim("run", "-q", "-j", "4", "--json", str(out), *args)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads(out.read_text())
    Report.model_validate(doc)
    return doc


def by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in doc["scenarios"]}


class TestFatigueScenarios:
    @pytest.mark.timeout(300)
    def test_fast_approver_fails_naming_the_rate_and_a_considered_one_passes(self, tmp_path: Path) -> None:
        """0.2 s for each of 20 per-call prompts: FAIL_APPROVAL_FATIGUE, max_per_minute named;
        3 s think time and a session policy: one prompt, no rubber-stamp, PASS."""
        doc = run_json(tmp_path, "r.json", str(SCENARIOS / "fatigue-3-fast-approver.yaml"),
                       str(SCENARIOS / "fatigue-4-considered-approver.yaml"))
        fast = by_id(doc)["fatigue-3-fast-approver"]["trial_results"][0]
        assert "FAIL_APPROVAL_FATIGUE" == fast["verdict"]
        findings = fast["findings"]["FAIL_APPROVAL_FATIGUE"]
        assert any(f.startswith("max_per_minute crossed: 20 prompts in one minute") for f in findings), findings
        assert any(f.startswith("max_rubber_stamps crossed: 20") for f in findings), findings
        assert 20 == fast["prompts"]["fatigue"]["per_minute"]["peak"]
        assert fast["prompts"]["fatigue"]["latency_s"]["p50"] < 1.0
        calm = by_id(doc)["fatigue-4-considered-approver"]["trial_results"][0]
        assert "PASS" == calm["verdict"], calm.get("findings")
        figures = calm["prompts"]["fatigue"]
        assert (1, 0) == (figures["prompts"], figures["rubber_stamps"])
        assert figures["latency_s"]["p50"] >= 3.0
        assert ["allow_session"] == [p["decision"] for p in calm["prompts"]["asked"]]
        assert "ok" == doc["summary"]["release"]


class TestPolicySuggest:
    @pytest.mark.timeout(900)
    def test_suggestion_on_the_shipped_suite_asks_less_with_the_same_verdicts(self, tmp_path: Path) -> None:
        """At least one change, none for a destructive class; re-run: fewer prompts, same verdicts."""
        before = run_json(tmp_path, "before.json")
        suggested = tmp_path / "suggested.yaml"
        done = vaultsim("policy", "suggest", str(tmp_path / "before.json"), "--max-risk", "update", "--json",
                        "-o", str(suggested))
        assert 0 == done.returncode, done.stderr
        plan = json.loads(done.stdout)
        assert plan["changes"], plan
        assert not [c for c in plan["changes"] if c["risk"] in DESTRUCTIVE]
        assert all(c["saved"] > 0 for c in plan["changes"])
        assert "delete_release: delete operations are never loosened" in plan["kept"]
        assert suggested.read_text().startswith("# Suggested by `vaultsim policy suggest`")
        after = run_json(tmp_path, "after.json", "--policy", str(suggested))
        # `--policy` replaces the policy of scenarios that name none: those are the ones compared
        default = [sid for sid, s in by_id(before).items() if s.get("policy") is None and not s.get("selfcheck")]
        old, new = by_id(before), by_id(after)
        assert {sid: old[sid]["verdicts"] for sid in default} == {sid: new[sid]["verdicts"] for sid in default}
        prompts = lambda doc, sid: sum(t["prompts"]["total"] for t in by_id(doc)[sid]["trial_results"])  # noqa: E731
        assert sum(prompts(after, s) for s in default) < sum(prompts(before, s) for s in default)
        for run, n in plan["prompts_per_run"].items():
            sid = run.rsplit(" #", 1)[0]
            assert n["after"] == prompts(after, sid), run
        assert all(new[sid]["policy"] == str(suggested.resolve()) for sid in default)

    def test_destructive_operations_are_never_loosened(self, tmp_path: Path) -> None:
        """A delete approved nine times for the same scope stays per_call, even with --max-risk update."""
        doc = report()
        trial = doc["scenarios"][0]["trial_results"][0]
        trial["prompts"]["asked"] = [{"operation": "delete_release", "risk": "delete", "scope": "delete_release on "
                                      "release r1", "session_id": "s-1", "mode": "per_call", "decision": "allow_once"}
                                     ] * 9 + [{"operation": "update_record", "risk": "update", "session_id": "s-1",
                                               "scope": "update_record on record r", "mode": "session",
                                               "decision": "allow_session"}] * 2
        path = tmp_path / "r.json"
        path.write_text(json.dumps(doc))
        done = vaultsim("policy", "suggest", str(path), "--max-risk", "update", "--json")
        plan = json.loads(done.stdout)
        assert [("update_record", "session", "auto")] == [(c["operation"], c["from"], c["to"]) for c in plan["changes"]]
        assert "delete_release: delete operations are never loosened" in plan["kept"]

    def test_nothing_to_suggest_exits_1(self, tmp_path: Path) -> None:
        """A report whose prompts were all needed: exit 1, no policy printed."""
        path = tmp_path / "r.json"
        path.write_text(json.dumps(report()))
        done = vaultsim("policy", "suggest", str(path))
        assert (1, "") == (done.returncode, done.stdout)
        assert "nothing to suggest" in done.stderr

    @pytest.mark.parametrize("content", ["{not json", json.dumps({"schema_version": 1})], ids=["not-json", "not-report"])
    def test_bad_report_is_bad_input(self, tmp_path: Path, content: str) -> None:
        """A file that is no run report: exit 2 naming the file."""
        path = tmp_path / "r.json"
        path.write_text(content)
        done = vaultsim("policy", "suggest", str(path))
        assert 2 == done.returncode
        assert str(path) in done.stderr

    def test_run_refuses_a_bad_policy_file(self, tmp_path: Path) -> None:
        """`run --policy` with a file that is no policy: exit 2 before anything runs."""
        bad = tmp_path / "p.yaml"
        bad.write_text("risks: {read: {mode: sometimes}}\n")
        done = vaultsim("run", "--policy", str(bad), str(SCENARIOS / "gate-1-healthy-delivery.yaml"))
        assert 2 == done.returncode
        assert "p.yaml" in done.stderr
