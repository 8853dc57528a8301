"""Red-team pass 24 over the pytest plugin: a user's suite whose tests fail inside their worlds.

No fault found; this pins what a suite relies on. A suite run under xdist (`-n 2`) whose tests
each get an approver rule, a session grant and a remote effect and then fail on purpose, and
whose other tests (parametrised, run on either worker, before or after) must each start from an
empty world: no effect, no prompt, no grant (an unmatched request is denied, not run under an
earlier world's grant), and every world's home gone at the end, a user fixture whose teardown
raises included.

Tried and already right: `--lf` and `-k` over those tests and over scenario items
(`pytest scenarios/ -k ...`, `--lf` after a pass runs all); KeyboardInterrupt raised inside a test
with a request waiting for a person (the home removed, nothing left running).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytest.importorskip("xdist", reason="pytest-xdist is not installed")

SUITE = '''
import pytest

def _note(world):
    with open({homes!r}, "a") as f:
        f.write(str(world.home) + "\\n")

@pytest.mark.parametrize("n", [1, 2, 3])
def test_fails_inside_its_world(vaultsim, n):
    _note(vaultsim)
    vaultsim.approver.allow_session("create_issue")
    r = vaultsim.client("agent-a").call("create_issue", {{"title": f"left-{{n}}"}})
    assert r.category == "success", r
    assert False, "fails on purpose, with a grant and an effect in its world"

@pytest.mark.parametrize("n", [1, 2, 3])
def test_starts_from_an_empty_world(vaultsim, n):
    _note(vaultsim)
    assert vaultsim.effects("create_issue") == 0, vaultsim.ledger
    assert vaultsim.prompts.count == 0
    r = vaultsim.client("agent-a").call("create_issue", {{"title": "fresh"}})
    assert r.category == "approval_denied", r  # no rule here: an earlier world's grant would run it

@pytest.fixture
def teardown_fails(vaultsim):
    yield vaultsim
    raise RuntimeError("the user's teardown fails")

def test_with_a_failing_teardown(teardown_fails):
    _note(teardown_fails)
    assert teardown_fails.effects("create_issue") == 0
'''


def test_failed_worlds_do_not_leak_into_the_next_under_xdist(tmp_path: Path) -> None:
    homes = tmp_path / "homes.txt"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_worlds.py").write_text(SUITE.format(homes=str(homes)))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-n", "2", "--rootdir", str(suite), "-c", "/dev/null", "--basetemp", str(tmp_path / "bt"),
                          str(suite)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = out.stdout + out.stderr
    assert "3 failed, 4 passed, 1 error" in said, said[-4000:]
    assert said.count("fails on purpose") >= 3 and "the user's teardown fails" in said, said[-4000:]
    seen = homes.read_text().split()
    assert 7 == len(set(seen)), seen  # a world of its own each
    assert [] == [h for h in seen if Path(h).exists()], said[-2000:]
