"""An agent that leaves a process running outside its group is caught and its process ended.

Without a jail (`--isolation none`), ending the agent's process group ends what
stayed in it, but a grandchild that called setsid outlived the trial, and the
gate passed the agent. tests/agents/leaves_grandchild.py does its task right and
leaves one: the trial must be FAIL_DEADLINE ("was still running"), saying so,
and the process must be gone when `vaultsim run` returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from helpers import PY, ROOT

AGENT = ROOT / "tests" / "agents" / "leaves_grandchild.py"


def marked(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in (p.info["cmdline"] or []):
            out.append(p.pid)
    return out


@pytest.mark.timeout(300)
def test_a_grandchild_left_running_is_a_deadline_failure_and_is_ended(tmp_path: Path) -> None:
    marker = f"vaultsim-test-{uuid.uuid4().hex}"
    report = tmp_path / "r.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(ROOT / "scenarios"), "-q", "-k",
                           "gate-1-healthy", "--isolation", "none", "--agent", f"{sys.executable} {AGENT} {marker}",
                           "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    left = marked(marker)
    for pid in left:  # never leave it behind, even when the assertion below fails
        psutil.Process(pid).kill()
    trial = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    assert [] == left, "the agent's grandchild outlived the run"
    assert ("FAIL_DEADLINE", ["FAIL_DEADLINE"]) == (trial["verdict"], trial["failed"]), proc.stdout[-2000:]
    assert ["agent 0 (triage-bot) left 1 process(es) running outside its process group when it exited; "
            "the runner ended them"] == trial["findings"]["FAIL_DEADLINE"]
    assert 1 == proc.returncode
