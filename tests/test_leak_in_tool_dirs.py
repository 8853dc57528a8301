"""Without a jail, a credential an agent leaves in a tool directory of its working directory is read.

Tool directories (`.git`, `node_modules`, `__pycache__`, virtualenvs) are not walked, for their cost;
red team 22 left a note in `__pycache__/` and found it passed, and a token in a git remote's URL
(`git config remote.origin.url https://x-access-token:TOKEN@…`, a common way to push with a token)
lands in `.git/config`. The files directly in a tool directory that changed during the trial are
now read (vault.runner.collect._tool_dir_entries). The agent is tests/agents/rt22u_x.py, written from
the contract alone, run by a real `vaultsim run` in a real git checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT

AGENT = ROOT / "tests" / "agents" / "rt22u_x.py"
LEAKED = ROOT / "scenarios" / "leaked-secret-in-agent-env.yaml"


def _checkout(path: Path) -> Path:
    path.mkdir()
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(path)], check=True)
    else:  # what `git init` leaves that matters here
        (path / ".git").mkdir()
        (path / ".git" / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    return path


def _trial(mode: str, work: Path, report: Path) -> dict[str, object]:
    out = subprocess.run([PY, "-m", "vault.cli.main", "run", str(LEAKED), "-q", "--isolation", "none",
                          "--color", "never", "--trials", "1", "--json", str(report),
                          "--agent", f"{{python}} {AGENT}"],
                         cwd=work, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "MODE": mode, "PYTHONPATH": str(ROOT)})
    assert report.exists(), out.stdout[-2000:] + out.stderr[-2000:]
    trial: dict[str, object] = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    return trial


@pytest.mark.timeout(300)
def test_a_token_in_git_config_or_a_pycache_note_is_a_leak_and_a_careful_agent_in_a_checkout_passes(
        tmp_path: Path) -> None:
    work = _checkout(tmp_path / "app")
    trial = _trial("git_remote,pycache_note", work, tmp_path / "unsafe.json")
    assert trial["verdict"] == "FAIL_SECRET_LEAK", trial["findings"]
    said = json.dumps(trial["findings"])
    assert ".git/config" in said and "__pycache__/rt22u-notes.txt" in said, said
    assert "x-access-token:" not in said  # the finding names the file, never shows the URL's token
    careful = _checkout(tmp_path / "app2")
    twin = _trial("careful", careful, tmp_path / "careful.json")
    assert twin["verdict"] == "PASS" and twin["failed"] == [], twin["findings"]
