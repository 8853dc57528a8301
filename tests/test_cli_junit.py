"""The run's machine-readable reports: JUnit XML checked against an XSD, JSON against its schema.

A recorded report with every kind of outcome (tests/run_report_fixture.py)
and a real `vaultsim run` both go through the writers; the XML must be valid
against tests/junit.xsd (and any published XSD named in $VAULTSIM_JUNIT_XSD,
e.g. Jenkins xUnit's junit-10.xsd or Maven Surefire's), the JSON against
`vaultsim schema report`.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import xmlschema

from helpers import PY, ROOT
from run_report_fixture import report
from vault.runner.junit import write_junit
from vault.runner.report_schema import SCHEMA_VERSION, Report

XSD = Path(__file__).with_name("junit.xsd")
SCENARIOS = ROOT / "scenarios"


def schemas() -> list[xmlschema.XMLSchema]:
    extra = [p for p in os.environ.get("VAULTSIM_JUNIT_XSD", "").split(os.pathsep) if p]
    return [xmlschema.XMLSchema(str(p)) for p in (XSD, *extra)]


def report_schema() -> dict[str, Any]:
    out = subprocess.run([PY, "-m", "vault.cli.main", "schema", "report"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three shipped scenarios, run for real: a pass, an expected FAIL_*, and an SSH one (skipped without sshd)."""
    tmp = tmp_path_factory.mktemp("run")
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(SCENARIOS / "gate-1-healthy-delivery.yaml"),
                           str(SCENARIOS / "gate-7-unrouted-wait.yaml"),
                           str(SCENARIOS / "c06a-ssh-restart-client-killed.yaml"),
                           "--json", str(tmp / "r.json"), "--junit", str(tmp / "r.xml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert 0 == proc.returncode, proc.stdout + proc.stderr
    yield {"json": json.loads((tmp / "r.json").read_text()), "junit": tmp / "r.xml"}


class TestJUnit:
    def test_recorded_report_is_valid_junit(self, tmp_path: Path) -> None:
        """Failure, error, skipped and passing trials all validate against the XSD."""
        path = tmp_path / "r.xml"
        write_junit(path, report())
        for schema in schemas():
            schema.validate(str(path))

    def test_real_run_is_valid_junit(self, real_run: dict[str, Any]) -> None:
        for schema in schemas():
            schema.validate(str(real_run["junit"]))

    def test_testcase_names_say_which_scenario_and_trial(self, tmp_path: Path) -> None:
        """name: the scenario's title and trial number; classname: its file; one suite per scenario."""
        path = tmp_path / "r.xml"
        write_junit(path, report())
        root = ET.parse(path).getroot()
        suite = next(s for s in root.iter("testsuite") if s.get("name") == "c05-create-deployment-late-response")
        names = [(c.get("classname"), c.get("name")) for c in suite.iter("testcase")]
        title = "C05 create deployment: committed, answered after the client's deadline"
        assert [("/work/suite/c05-create-deployment-late-response", f"{title} [trial {n}]") for n in (1, 2, 3)] \
            == names
        assert "/work/suite/c05-create-deployment-late-response.yaml" == suite.get("file")
        assert ("3", "1", "0") == (suite.get("tests"), suite.get("failures"), suite.get("errors"))

    def test_properties_carry_verdicts_prompts_and_effects(self, tmp_path: Path) -> None:
        path = tmp_path / "r.xml"
        write_junit(path, report())
        suite = next(s for s in ET.parse(path).getroot().iter("testsuite")
                     if s.get("name") == "c05-create-deployment-late-response")
        props = {p.get("name"): p.get("value") for p in suite.iter("property")}
        assert {"trial.2.verdict": "FAIL_RECOVERY", "trial.2.expected": "PASS", "trial.2.prompts": "2",
                "trial.2.prompts.create_deployment on staging": "2", "trial.2.effects.create_issue": "1",
                "scenario.expected": "PASS"}.items() <= props.items()

    def test_outcomes(self, tmp_path: Path) -> None:
        """An unexpected verdict is a failure naming both verdicts; a harness error an error; no sshd a skip."""
        path = tmp_path / "r.xml"
        write_junit(path, report())
        root = ET.parse(path).getroot()
        failure = next(root.iter("failure"))
        assert ("FAIL_RECOVERY", "FAIL_RECOVERY, expected PASS") == (failure.get("type"), failure.get("message"))
        assert "resent create_deployment after outcome_unknown without a lookup" in (failure.text or "")
        assert "the daemon did not answer in time" in next(root.iter("error")).get("message", "")
        assert "no OpenSSH server" in next(root.iter("skipped")).get("message", "")
        assert ("8", "1", "1") == (root.get("tests"), root.get("failures"), root.get("errors"))

    def test_agent_text_cannot_put_control_characters_in_the_xml(self, tmp_path: Path) -> None:
        """The agent's stderr held an escape sequence: it arrives escaped, and the file is still valid XML."""
        path = tmp_path / "r.xml"
        write_junit(path, report())
        text = path.read_text(encoding="utf-8")
        assert "\x1b" not in text
        assert "exited 3: \\x1b[1A\\x1b[2K[1/1] ok PASS faked" in text

    def test_real_run_counts_match_the_json(self, real_run: dict[str, Any]) -> None:
        root = ET.parse(real_run["junit"]).getroot()
        assert real_run["json"]["summary"]["trials"] == len(list(root.iter("testcase"))) == int(root.get("tests", ""))
        assert "0" == root.get("failures")


class TestJsonReport:
    def test_schema_is_a_valid_json_schema(self) -> None:
        schema = report_schema()
        jsonschema.validators.validator_for(schema).check_schema(schema)

    def test_real_report_validates_and_is_versioned(self, real_run: dict[str, Any]) -> None:
        """The report of a real run carries schema_version and validates against `vaultsim schema report`."""
        doc = real_run["json"]
        jsonschema.validate(doc, report_schema())
        assert SCHEMA_VERSION == doc["schema_version"] == 1
        assert doc["vaultsim_version"]
        assert "agent_stub" in doc["run"]["agent"]

    def test_recorded_report_validates(self) -> None:
        jsonschema.validate(report(), report_schema())
        Report.model_validate(report())

    def test_a_report_of_another_version_is_refused(self) -> None:
        doc = report()
        doc["schema_version"] = 2
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, report_schema())

    def test_fields_added_later_are_allowed(self) -> None:
        """Readers must ignore fields they do not know: the schema does not forbid them."""
        doc = report()
        doc["scenarios"][0]["trial_results"][0]["failed_checks"] = [{"verdict": "PASS", "reason": "-"}]
        doc["run"]["agent_network"] = "none"
        jsonschema.validate(doc, report_schema())
