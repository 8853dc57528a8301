"""A fork bomb in the jail is capped, and the trial says so.

Run as root (CI, containers), the jail's processes count as root, for whom the kernel does not
enforce RLIMIT_NPROC: an agent forking without end would fill the machine's process table
before its deadline, taking the runner, the daemon and every other trial with it. Each jailed
agent's tree now runs in a pids cgroup (vault.jail.pids) capped at MAX_PIDS; the forks it
refused are named in the trial's errors. Skipped where no pids controller is writable.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, ROOT, Sandbox
from vault.jail import pids
from vault.jail.probe import problem

# forks children that wait until it exits, until a fork fails; then prints how many it got
BOMB = """
import json, os
got, r, w = 0, *os.pipe()
while got < 5000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    got += 1
print(json.dumps({"status": "done", "forked": got}), flush=True)
"""


def can_cap() -> bool:
    path = pids.create("probe", 10)
    if path is None:
        return False
    pids.remove(path)
    return True


def cgroups() -> set[Path]:
    return {p for base in pids._bases() for p in base.glob("vaultsim-*")}


@pytest.mark.skipif(not can_cap(), reason="no writable pids cgroup controller here")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolation", [pytest.param("bwrap", marks=pytest.mark.skipif(
    problem() is not None, reason=f"no jail here: {problem()}")), "none"])
def test_a_fork_bomb_is_capped_and_named(tmp_path: Path, isolation: str) -> None:
    """In the jail, and without one under the agent's keeper (there root could leave the cgroup:
    detection only, as everything without a jail)."""
    agent = tmp_path / "bomb.py"
    agent.write_text(BOMB)
    sc = tmp_path / "bomb.yaml"
    sc.write_text(json.dumps({"title": "forks without end", "task": {"operations": ["read_issue"], "deadline_s": 60},
                              "agents": [{"command": ["{python}", str(agent)]}], "expect": {"verdict": "PASS"}}))
    report = tmp_path / "r.json"
    proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(sc), "--isolation", isolation, "-q",
                             "--json", str(report)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    out, _ = proc.communicate(timeout=240)
    assert report.exists(), out[-2000:]
    trial = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    final = json.loads(trial["agents"][0]["final"])
    assert 0 < final["forked"] < pids.MAX_PIDS, final  # stopped by the cap, not by its own 5,000
    capped = [e for e in trial["errors"] if f"tried to run more than {pids.MAX_PIDS} processes" in e]
    assert capped and "refused" in capped[0], trial["errors"]
    assert [] == [p for p in cgroups() if p.name.startswith(f"vaultsim-{proc.pid}-")]  # its cgroup removed


def test_a_careful_jailed_agent_has_no_refused_forks(tmp_path: Path) -> None:
    """The cap is far above any agent's need: a careful run names nothing."""
    report = tmp_path / "r.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(ROOT / "scenarios" / "gate-1-healthy-delivery.yaml"),
                           "-q", "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert 0 == proc.returncode, proc.stdout[-2000:] + proc.stderr[-2000:]
    trial = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    assert [] == [e for e in trial["errors"] if "processes and threads" in e]


@pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
@pytest.mark.skipif(not can_cap(), reason="no writable pids cgroup controller here")
def test_vaultsim_exec_caps_the_program_too(sandbox: Sandbox) -> None:
    sandbox.start_daemon()
    mine = {p for p in cgroups() if "-exec" in p.name}
    proc = sandbox.vaultsim("exec", "--", PY, "-c", BOMB)
    assert 0 == proc.returncode, proc.stderr
    assert 0 < json.loads(proc.stdout.splitlines()[-1])["forked"] < pids.MAX_PIDS
    # exec joined its jail's mount namespace and could not remove its cgroup: the next one made does,
    # once the bomb's last orphan has exited (until then it is not empty). Another test's `vaultsim
    # exec` may be running beside this one (pytest-xdist): a cgroup of a live process is its own.
    def left() -> set[Path]:
        made = pids.create("probe", 10)
        assert made is not None
        pids.remove(made)
        return {p for p in cgroups() if "-exec" in p.name and p not in mine and not _alive(p)}

    deadline = time.monotonic() + 15
    while (stayed := left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stayed == set()


def _alive(cgroup: Path) -> bool:
    """Whether the process a cgroup is named for (`vaultsim-PID-name`) still runs."""
    try:
        os.kill(int(cgroup.name.split("-")[1]), 0)
        return True
    except ProcessLookupError:
        return False
