"""A runner that is pid 1 (a container's entrypoint) still reads `kin` (late45's gap).

The daemon reads a session opener's kin (its tree root's older children, the agent among them while
it is there) only below a runner: an ancestor it shares with the daemon other than init, since a
desktop's or session's root has hundreds of children. A runner that is itself pid 1 was taken for
init, so an orphan the agent left (no agent among its ancestors) had no kin, and a call it sent the
instant the agent exited was timed by the keeper's clock, inside its lag, unnamed. Now pid 1 counts
as a runner when it started the daemon and runs the daemon's own interpreter (never a system's init).
Run here with `unshare --pid --fork --mount-proc`, without the fork server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_late45 import AGENT, SAID, SCENARIO


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    got = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, timeout=60)
    return got.returncode == 0 and got.stdout.strip() == "1"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["call", "open"])
def test_an_orphan_acting_the_instant_the_agent_exited_is_named_under_a_pid_1_runner(tmp_path: Path,
                                                                                    mode: str) -> None:
    if not _unshare_works():
        pytest.skip("unshare --pid --fork --mount-proc is not available here (needs root or user namespaces)")
    path = tmp_path / "late45.yaml"
    path.write_text(SCENARIO)
    report = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LATE45_MODE": mode, "LATE45_WAIT": "pidfd",
           "LATE45_LOG": str(tmp_path / "gc.log")}
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", PY, "-m", "vault.cli.main", "run", str(path),
                           "-q", "--color", "never", "--trials", "1", "--isolation", "none", "--no-fork-server",
                           "--json", str(report), "--agent", AGENT],
                          env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=240)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    t = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    assert (tmp_path / "gc.log").read_text().split()[0] == mode, (tmp_path / "gc.log").read_text()
    assert t["verdict"] == "FAIL_DEADLINE", t["findings"]
    assert SAID[mode] in " | ".join(t["findings"]["FAIL_DEADLINE"]), t["findings"]
