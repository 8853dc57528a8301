"""Without a jail an agent reaches its trial's directory (its task file is there). A FIFO it put
where the runner next writes (the next agent's task, plan, output, keeper report, the intruder's
output) was opened and waited on for a reader: the whole run held, past its deadlines. The
runner now removes whatever stands there and creates its own file (vault.regular.create_fresh)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault import regular

AGENT = f"{sys.executable} {ROOT / 'tests' / 'agents' / 'plants_fifos.py'}"


@pytest.mark.parametrize("scenario", ["gate-6-restart-resumes-receipt", "fresh-process-no-inherited-approval"])
def test_fifos_planted_for_the_next_agent_neither_hold_the_run_nor_fail_it(tmp_path: Path, scenario: str) -> None:
    # a deadline on the run itself: before, it never ended (TimeoutExpired fails the test)
    run = vaultsim_run([ROOT / "scenarios" / f"{scenario}.yaml"], AGENT, tmp_path / "r.json",
                       "--isolation", "none", timeout=240)
    assert (0, []) == (run["code"], surprises(run)), run["out"]
    assert [t["verdict"] for s in run["json"]["scenarios"] for t in s["trial_results"]] == ["PASS"]

@pytest.mark.timeout(360)  # its run decompresses 64 MiB: 70-74 s at load 9, over half the default 120 s
@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_a_large_archive_a_careful_agent_keeps_is_named_not_graded(tmp_path: Path, isolation: str) -> None:
    """The leak scan decompresses at most 64 MiB in a trial; past that, what a compressed file
    holds is not scanned. That was graded FAIL_SECRET_LEAK ("cannot be ruled out"), so a careful
    agent keeping a release tarball failed; it is named in `errors`, not graded."""
    agent = f"{sys.executable} {ROOT / 'tests' / 'agents' / 'big_archive.py'}"
    run = vaultsim_run([ROOT / "scenarios" / "gate-1-healthy-delivery.yaml"], agent, tmp_path / "r.json",
                       "--isolation", isolation, timeout=300)
    assert (0, []) == (run["code"], surprises(run)), run["out"]
    trial = run["json"]["scenarios"][0]["trial_results"][0]
    assert any("compressed file(s)" in e and "not scanned" in e for e in trial["errors"]), trial["errors"]


def test_create_fresh_replaces_a_fifo_a_link_and_a_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("kept")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dir" / "deep").mkdir(parents=True)
    for name in ("fifo", "link", "dir", "new"):
        fd = regular.create_fresh(tmp_path / name)  # returns at once: never opened what stood there
        os.write(fd, b"mine")
        os.close(fd)
        assert (tmp_path / name).read_bytes() == b"mine" and (tmp_path / name).is_file()
        assert not (tmp_path / name).is_symlink()
    assert victim.read_text() == "kept"
    regular.write_fresh(tmp_path / "fifo", b"again")
    assert (tmp_path / "fifo").read_bytes() == b"again"
