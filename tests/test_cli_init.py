"""`vaultsim init [DIR]`: a starter suite that runs as written and is the user's to edit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from helpers import PY

FILES = ["catalog.yaml", "policies/default.yaml", "approvers/allow-session.yaml", "plans/file-and-triage.yaml",
         "plans/deploy.yaml", "healthy-delivery.yaml", "deploy-answer-lost.yaml"]


def vaultsim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=180)


class TestInit:
    def test_starter_suite_runs_and_passes(self, tmp_path: Path) -> None:
        """init x, then run x: both starter scenarios get their expected verdicts (exit 0)."""
        out = vaultsim("init", "x", cwd=tmp_path)
        assert 0 == out.returncode, out.stderr
        assert sorted(FILES) == sorted(str(p.relative_to(tmp_path / "x")) for p in (tmp_path / "x").rglob("*")
                                       if p.is_file())
        assert "vaultsim run x" in out.stdout
        ran = vaultsim("run", "x", cwd=tmp_path)
        assert 0 == ran.returncode, ran.stdout + ran.stderr
        assert "2 trials of 2 scenarios" in ran.stdout and "release OK" in ran.stdout

    def test_the_copied_policy_is_the_one_that_runs(self, tmp_path: Path) -> None:
        """Editing the starter's policy changes the run: reads that prompt break the prompt budget."""
        assert 0 == vaultsim("init", str(tmp_path / "x"), cwd=tmp_path).returncode
        policy_file = tmp_path / "x" / "policies" / "default.yaml"
        policy = yaml.safe_load(policy_file.read_text())
        policy["risks"]["read"] = {"mode": "per_call"}
        policy_file.write_text(yaml.safe_dump(policy))
        ran = vaultsim("run", "x", "-k", "healthy", cwd=tmp_path)
        assert 1 == ran.returncode, ran.stdout + ran.stderr
        assert "FAIL_APPROVAL_FATIGUE" in ran.stdout

    def test_a_scenario_catalog_file_that_is_missing_is_named(self, tmp_path: Path) -> None:
        assert 0 == vaultsim("init", "x", cwd=tmp_path).returncode
        (tmp_path / "x" / "catalog.yaml").unlink()
        ran = vaultsim("run", "x", cwd=tmp_path)
        assert 2 == ran.returncode
        assert "field catalog: no such file 'catalog.yaml'" in ran.stderr

    def test_existing_files_are_never_overwritten(self, tmp_path: Path) -> None:
        """A second init changes nothing and names what is there; --force overwrites."""
        assert 0 == vaultsim("init", cwd=tmp_path).returncode
        (tmp_path / "healthy-delivery.yaml").write_text("# mine\n")
        (tmp_path / "plans" / "deploy.yaml").unlink()
        again = vaultsim("init", cwd=tmp_path)
        assert 2 == again.returncode
        assert "healthy-delivery.yaml" in again.stderr and "nothing written" in again.stderr
        assert "# mine\n" == (tmp_path / "healthy-delivery.yaml").read_text()
        assert not (tmp_path / "plans" / "deploy.yaml").exists()
        assert 0 == vaultsim("init", "--force", cwd=tmp_path).returncode
        assert "title:" in (tmp_path / "healthy-delivery.yaml").read_text()

    def test_a_file_in_the_way_is_bad_input(self, tmp_path: Path) -> None:
        (tmp_path / "x").write_text("")
        out = vaultsim("init", "x", cwd=tmp_path)
        assert 2 == out.returncode and "not a directory" in out.stderr
