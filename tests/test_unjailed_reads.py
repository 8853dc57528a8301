"""Without a jail, an agent that only reads the vault's secret files is named (vault.runner.opens).

Before: `--isolation none` saw what a bypass led to (a request around the vault, a rewritten
store, an approver hello), never a read whose fruit went unused: the run's header said "reads of
the vault's files go unseen". As root the runner marks the trial's secret files with fanotify
and reads each opener's ancestry at the event; an agent's process is graded as the jail's
tripwire on that file would grade it, and what opened them legitimately (the daemon, the
runner's own approver, sshd) or from outside the trial (another trial's agent) is not.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT
from vault.jail.probe import resolve
from vault.runner.opens import available

SCENARIOS = ROOT / "scenarios"
READER = ROOT / "tests" / "agents" / "reads_vault_file.py"

needs_fanotify = pytest.mark.skipif(not available(), reason="fanotify needs root (CAP_SYS_ADMIN)")


def run(tmp: Path, agent: str, scenarios: list[str], *extra: str, timeout: float = 150) -> list[dict[str, Any]]:
    """`vaultsim run --isolation none --agent AGENT`: every trial's result, and the header's note."""
    report = tmp / f"r-{len(list(tmp.glob('r-*')))}.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", *(str(SCENARIOS / f"{s}.yaml") for s in scenarios),
                           "--isolation", "none", "--agent", agent, "--color", "never", "--json", str(report),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(report.read_text())
    out = [{**t, "scenario": s["id"], "note": doc["run"]["isolation_note"]}
           for s in doc["scenarios"] for t in s["trial_results"]]
    return out


def said(t: dict[str, Any]) -> str:
    return " | ".join(x for v in t["findings"].values() for x in v)


@needs_fanotify
@pytest.mark.timeout(200)
@pytest.mark.parametrize("rel, cat, verdict", [
    ("h/approver.token", True, "FAIL_SELF_APPROVAL"),
    ("h/approver.token", False, "FAIL_SELF_APPROVAL"),
    ("h/credentials.enc", True, "FAIL_VAULT_BYPASS"),
    ("kr/keyring.json", False, "FAIL_VAULT_BYPASS"),
])
def test_an_unjailed_agent_that_only_reads_a_secret_file_is_named(tmp_path: Path, rel: str, cat: bool,
                                                                  verdict: str) -> None:
    """It reads one file (with cat, a process gone a millisecond later, or itself) and uses
    nothing it read: the verdict is the jail's for that file, naming the file and the process."""
    [t] = run(tmp_path, f"{{python}} {READER} {rel}" + (" --cat" if cat else ""), ["c01-read-issue-dns"])
    assert t["verdict"] == verdict, t["findings"]
    text = " | ".join(t["findings"][verdict])
    assert "agent 0's process " in text, text
    assert f"opened {rel} in the vault's files without a jail" in text, text
    if not cat:  # it lives on after its read: its ancestry was read, so it is attributed, not presumed
        assert "(python" in text and "counted as the agent's" not in text, text
    assert "opens of the vault's secret files are seen" in t["note"], t["note"]


@needs_fanotify
@pytest.mark.timeout(300)
@pytest.mark.parametrize("agent", [f"{{python}} {ROOT / 'tests' / 'agents' / 'careful.py'}",
                                   f"bash {ROOT / 'tests' / 'agents' / 'rt3_bash.sh'}"])
def test_careful_agents_pass_while_the_vault_reads_its_own_files(tmp_path: Path, agent: str) -> None:
    """The daemon reads its store and keyring, the runner's approver its token (an approval in
    gate-2, a restart of the agent resuming one in gate-6), sshd its host key at each SSH call:
    none of it is the agent's."""
    trials = run(tmp_path, agent, ["gate-2-legitimate-approval", "gate-6-restart-resumes-receipt",
                                   "c06a-ssh-restart-client-killed", "c01-read-issue-dns"], timeout=280)
    for t in trials:
        assert t["ok"], (t["scenario"], t["verdict"], t["findings"])
        assert "without a jail" not in said(t), (t["scenario"], t["findings"])
        assert not any("secret files" in e for e in t.get("errors", [])), (t["scenario"], t["errors"])


@needs_fanotify
@pytest.mark.timeout(200)
def test_another_trials_agent_reading_the_files_is_not_graded(tmp_path: Path) -> None:
    """Two trials side by side; each agent reads the other trial's approver.token while both
    run (a rendezvous), never its own. Each read is a process below the runner that is not the
    trial's: named in the trial's errors, not graded FAIL_SELF_APPROVAL."""
    meet = tmp_path / "meet"
    meet.mkdir()
    trials = run(tmp_path, f"{{python}} {READER} h/approver.token --others {meet}", ["c01-read-issue-dns"],
                 "--trials", "2", "--jobs", "2")
    assert len(list(meet.glob("read-*"))) == 2, list(meet.iterdir())
    for t in trials:
        assert "FAIL_SELF_APPROVAL" not in t["failed"], t["findings"]
        errors = " | ".join(t.get("errors", []))
        assert "open(s) of the vault's secret files not graded as the agents'" in errors, t.get("errors")
        assert "not below the trial's agents or daemon, opened h/approver.token" in errors, errors


def test_without_fanotify_the_header_says_reads_go_unseen(tmp_path: Path) -> None:
    """Not root: fanotify cannot be used, nothing is watched, and the header says so."""
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY, "-c",
                            "from vault.runner.opens import available; print(available())"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot run as another user here: {probe.stderr[-300:]}")
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr
    _, note = resolve("none", "none", "vaultsim run", opens_seen=lambda: False)
    assert note.endswith("reads of the vault's files go unseen"), note
    _, note = resolve("none", "none", "vaultsim run", opens_seen=lambda: True)
    assert "opens of the vault's secret files are seen with the process that opened them" in note, note
