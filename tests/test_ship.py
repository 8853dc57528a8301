"""What `--executor ray` ships to the nodes: the files a trial needs, at paths that mean the same there."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from vault.errors import BadInput
from vault.runner import ship
from vault.runner.scenario import cases, load_all

from helpers import ROOT


def suite(tmp_path: Path) -> Path:
    """A user's suite: a scenario whose policy sits beside it and whose plan sits outside its folder."""
    (tmp_path / "suite" / "policies").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    shutil.copy(ROOT / "scenarios" / "plans" / "file-issue.yaml", tmp_path / "shared" / "plan.yaml")
    shutil.copy(ROOT / "scenarios" / "policies" / "owner-release-manager.yaml",
                tmp_path / "suite" / "policies" / "p.yaml")
    (tmp_path / "suite" / ".git").mkdir()
    (tmp_path / "suite" / ".git" / "big").write_bytes(b"x" * 1000)
    (tmp_path / "suite" / "one.yaml").write_text(textwrap.dedent("""\
        policy: policies/p.yaml
        agents: [{plan: ../shared/plan.yaml}]
        expect: {verdict: PASS}
        """))
    return tmp_path / "suite"


class TestStage:
    def test_a_staged_scenario_finds_its_files(self, tmp_path: Path) -> None:
        """On a node, the scenario's relative names point at copies of what the driver had."""
        found = [c for sc in load_all([str(suite(tmp_path))]) for c in cases(sc)]
        stage = ship.stage(found, None)
        try:
            moved = ship.remap_case(found[0], stage)
            sc, orig = moved.scenario, found[0].scenario
            assert sc.path is not None and sc.path.is_file() and sc.path != orig.path
            for name in ("policies/p.yaml", "../shared/plan.yaml"):
                assert orig.relative(name).read_bytes() == sc.relative(name).read_bytes()
            assert not list(stage.rglob(".git"))
        finally:
            shutil.rmtree(stage)

    def test_the_agent_directory_is_shipped_and_remapped(self, tmp_path: Path) -> None:
        """`--agent CMD` runs in the directory the run started from: its copy on the node."""
        found = [c for sc in load_all([str(suite(tmp_path))]) for c in cases(sc)]
        (tmp_path / "agent").mkdir()
        (tmp_path / "agent" / "my_agent.py").write_text("print('done')\n")
        stage = ship.stage(found, str(tmp_path / "agent"))
        try:
            assert "print('done')\n" == (ship.remap(tmp_path / "agent", stage) / "my_agent.py").read_text()
        finally:
            shutil.rmtree(stage)

    def test_too_much_to_ship_is_refused(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A home directory as the agent's directory is refused, and nothing is left staged."""
        found = [c for sc in load_all([str(suite(tmp_path))]) for c in cases(sc)]
        (tmp_path / "big").mkdir()
        (tmp_path / "big" / "blob").write_bytes(b"x" * 5000)
        monkeypatch.setattr(ship, "MAX_BYTES", 4000)
        before = set(Path("/tmp").glob("vaultsim-ship-*"))
        with pytest.raises(BadInput, match="files to ship"):
            ship.stage(found, str(tmp_path / "big"))
        assert before == set(Path("/tmp").glob("vaultsim-ship-*"))
