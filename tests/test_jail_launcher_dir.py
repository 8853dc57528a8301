"""An agent unpacked in a temp dir as a bundle without a project file: `bin/run` runs `../src/`.

Red team 21 (careful) left this: the jail showed a program in a temp dir with its project (the
nearest directory above it holding .git, package.json, pyproject.toml, ...), and without one only
its own directory, so a launcher in `bin/` that runs `../src/agent.py` found nothing in the jail
(FAIL_OUTCOME for a careful agent). A launcher directory (`bin`, `scripts`, `sbin`) now brings the
directory above it, unless that is a place the jail hides itself or holds the trial or a vault home.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.jail.probe import problem
from vault.runner.tripwires import AgentJail

needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
AGENT = ROOT / "tests" / "agents" / "rt21c_lazy.py"  # a careful agent (stdlib only)
LAUNCHER = '#!/bin/sh\nexec python3 "$(dirname "$0")/../src/agent.py" "$@"\n'


@pytest.fixture
def bundle() -> Iterator[Path]:
    """/tmp/<bundle>/bin/run and /tmp/<bundle>/src/agent.py, no project file anywhere (in /tmp: what
    every jail makes private)."""
    top = Path(tempfile.mkdtemp(prefix="launcher-bundle-", dir="/tmp"))
    try:
        (top / "bin").mkdir()
        (top / "src").mkdir()
        (top / "bin" / "run").write_text(LAUNCHER)
        (top / "bin" / "run").chmod(0o755)
        shutil.copy(AGENT, top / "src" / "agent.py")
        yield top
    finally:
        shutil.rmtree(top)


def _shown(trial: Path, *command: str) -> list[str]:
    return AgentJail(trial, 0, trial / "h", [], trial / "st" / "a", "/", command=list(command))._program_paths()


def test_a_launcher_in_bin_is_shown_with_the_directory_above(bundle: Path) -> None:
    trial = Path(tempfile.mkdtemp(prefix="vsr-test-", dir="/tmp"))
    try:
        assert _shown(trial, str(bundle / "bin" / "run")) == [str(bundle)]
        # any other directory name stays as it was: its own directory
        (bundle / "tools").mkdir()
        (bundle / "tools" / "run").write_text(LAUNCHER)
        assert _shown(trial, str(bundle / "tools" / "run")) == [str(bundle / "tools")]
        # never /tmp itself (a launcher at /tmp/bin/run), nor a directory holding the trial
        (trial / "bin").mkdir()
        (trial / "bin" / "run").write_text(LAUNCHER)
        assert _shown(trial, str(trial / "bin" / "run")) == []
    finally:
        shutil.rmtree(trial)


@needs_bwrap
@pytest.mark.timeout(600)
def test_a_bundle_s_launcher_runs_its_src_in_the_jail(bundle: Path, tmp_path: Path) -> None:
    """Before the fix: `python3: can't open file '/tmp/launcher-bundle-…/bin/../src/agent.py'`,
    FAIL_OUTCOME."""
    run = vaultsim_run([ROOT / "scenarios" / "gate-1-healthy-delivery.yaml"], str(bundle / "bin" / "run"),
                       tmp_path / "r.json", "--isolation", "bwrap")
    assert surprises(run) == [], surprises(run)
    assert run["code"] == 0 and len(run["json"]["scenarios"]) == 1, run["out"][-2000:]
