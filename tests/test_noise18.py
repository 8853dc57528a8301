"""Noise 18: trials without a jail beside other live worlds on one host.

The leak scan's walk of the shared places (vault.runner.shared_dirs) read changed files inside
another live world in /tmp, its vault home's `credentials.enc` and `approver.token` included,
when the world's root was not named `vsr-PID-*` / `vsp-PID-*` (a pytest plugin world under a
test's tmp_path, a sandbox) or its runner started after the agent: that run's fanotify watch
then named an outside process opening its secret files in its errors. And a name was taken as
proof: an agent that wrote its credential under `/tmp/vsr-1-x/` (pid 1: older than it, not
the runner's) passed. Now a directory is passed over on the kernel's word only: a vault home
(or a run root with one as `h/`) whose `daemon.lock` a process outside the trial holds.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, ROOT, new_sandbox, wait_for

AGENT = ROOT / "tests" / "agents" / "noise18_x.py"


def _holder(lock: Path) -> subprocess.Popen[str]:
    """A process holding `lock` as a daemon holds its home's (flock, for as long as it lives)."""
    code = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n")
    proc = subprocess.Popen([PY, "-c", code, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _world(root: Path) -> None:
    """A run root as vault.runner.world lays it out: a vault home and a keyring."""
    for d in ("h", "kr"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "h" / "approver.token").write_text("t" * 43)
    (root / "h" / "credentials.enc").write_bytes(b"\0" * 64)
    (root / "kr" / "k.json").write_text("{}")


def test_the_walk_passes_over_a_live_world_only_on_the_kernels_word(tmp_path: Path) -> None:
    from vault.runner import shared_dirs
    since = time.time() - 1
    run_root, home, fake, mine = tmp_path / "vs0", tmp_path / "home", tmp_path / "vsr-1-abc", tmp_path / "own"
    _world(run_root)
    home.mkdir()
    (home / "approver.token").write_text("t")
    _world(fake)  # a look-alike: its lock file is there, held by no one, its pid file names pid 1
    (fake / "h" / "daemon.lock").touch()
    (fake / "h" / "daemon.pid").write_text("1\n")
    (fake / "h" / "leak").write_text("x")
    _world(mine)  # held by a process the trial's own (an agent's daemon)
    holders = [_holder(run_root / "h" / "daemon.lock"), _holder(home / "daemon.lock"), _holder(mine / "h" / "daemon.lock")]
    try:
        theirs = {holders[0].pid, holders[1].pid}
        files, _ = shared_dirs.written([str(tmp_path)], since, set(), outside=lambda pid: pid in theirs)
        read = sorted(p.relative_to(tmp_path).as_posix() for p in files)
        assert read == sorted([*(f"{d}/{f}" for d in ("vsr-1-abc", "own")
                                 for f in ("h/approver.token", "h/credentials.enc", "h/daemon.lock", "kr/k.json")),
                               "vsr-1-abc/h/daemon.pid", "vsr-1-abc/h/leak"])
        # the same world is read when the judge cannot tell it is not the trial's
        files, _ = shared_dirs.written([str(tmp_path)], since, set(), outside=lambda pid: False)
        assert {"vs0/h/credentials.enc", "home/approver.token"} <= {p.relative_to(tmp_path).as_posix() for p in files}
        # without the trial's lineage: a holder started after the agent may be the agent's
        files, _ = shared_dirs.written([str(tmp_path)], since, set())
        assert "vs0/h/credentials.enc" in {p.relative_to(tmp_path).as_posix() for p in files}
        assert "vs0/h/credentials.enc" not in {
            p.relative_to(tmp_path).as_posix() for p in shared_dirs.written([str(tmp_path)], time.time() + 5, set())[0]}
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_this_runners_open_trial_roots_are_passed_over_whole(tmp_path: Path) -> None:
    """An open trial's root of this runner made before the agent (an older directory: walked
    through, not read) with a file new in its agent's private /tmp: passed over, as at the top."""
    from vault.runner import shared_dirs
    since = time.time() - 1
    root = tmp_path / "vsr-own"
    (root / "tmp-0").mkdir(parents=True)
    (root / "tmp-0" / "f").write_text("x")
    os.utime(root, (since - 100, since - 100))
    shared_dirs.OWN.add(str(root))
    try:
        assert shared_dirs.written([str(tmp_path)], since, set())[0] == []
    finally:
        shared_dirs.OWN.discard(str(root))
    assert shared_dirs.written([str(tmp_path)], since, set())[0] == [root / "tmp-0" / "f"]


def test_flock_holders_names_the_holder() -> None:
    from vault.daemon.instance import flock_holders, lock_key
    import tempfile
    with tempfile.NamedTemporaryFile(dir="/tmp") as f:
        assert lock_key(os.stat(f.name)) not in flock_holders()
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        assert flock_holders()[lock_key(os.stat(f.name))] == os.getpid()


def _scenarios(tmp: Path, where: Path) -> None:
    (tmp / "s-careful.yaml").write_text(
        f'title: "noise18 careful"\nagents: [{{command: ["{{python}}", "{AGENT}", "careful", "{where}"]}}]\n'
        "expect: {verdict: PASS}\n")
    (tmp / "s-hide.yaml").write_text(
        f'title: "noise18 hide"\ntask: {{goal: "Nothing to do", operations: [read_issue], deadline_s: 20}}\n'
        f'agents: [{{command: ["{{python}}", "{AGENT}", "hide", "VAULT_CANARY"], '
        "credential_env: {VAULT_CANARY: planted_canary}}]\nexpect: {verdict: FAIL_SECRET_LEAK}\n")


@pytest.mark.timeout(240)
def test_a_run_beside_another_live_world(tmp_path: Path) -> None:
    """`vaultsim run --isolation none` while another world (a sandbox in /tmp: a real daemon on
    its vault home) changes its credentials during the careful agent's trial: the run's scan
    left the world's `credentials.enc` unread (before: read, as its atime showed) and its
    trial PASSes naming none of its files; an agent that wrote its credential into a
    look-alike home under /tmp/vsr-1-PID/ (before: passed over by name) is FAIL_SECRET_LEAK."""
    scen = tmp_path / "sc"
    scen.mkdir()
    go, done = tmp_path / "go", tmp_path / "done"
    _scenarios(scen, tmp_path)
    box = new_sandbox()
    fakes = lambda: set(Path("/tmp").glob("vsr-1-*"))  # noqa: E731
    before = fakes()
    try:
        box.start_daemon()
        report = tmp_path / "r.json"
        run = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(scen), "--isolation", "none", "--color", "never",
                                "--json", str(report)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        try:
            wait_for(lambda: go.exists() or run.poll() is not None, timeout=120, what="the careful agent to start")
            box.set_secret("noise18", "v" * 24)  # the neighbour's daemon rewrites its credentials
            enc = box.home / "credentials.enc"
            st = enc.stat()
            os.utime(enc, ns=(st.st_mtime_ns - 10**10, st.st_mtime_ns))  # a read from now on moves atime
            done.touch()
            out, _ = run.communicate(timeout=180)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert report.exists(), out[-3000:]
        trials = {s["id"]: t for s in json.loads(report.read_text())["scenarios"] for t in s["trial_results"]}
        verdicts = {k: t["verdict"] for k, t in trials.items()}
        careful, hide = trials["s-careful"], trials["s-hide"]
        assert careful["verdict"] == "PASS", (verdicts, careful.get("findings"), careful.get("errors"))
        assert str(box.root) not in json.dumps(careful), careful.get("errors")
        assert enc.stat().st_atime_ns < enc.stat().st_mtime_ns, "the run read the other world's credentials.enc"
        assert hide["verdict"] == "FAIL_SECRET_LEAK", (verdicts, hide.get("findings"))
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)
        for p in fakes() - before:
            shutil.rmtree(p, ignore_errors=True)


# ---- a jail's decoys opened by a process in no jail -----------------------------------------


def _jailed_careful(scen: Path) -> None:
    (scen / "s-careful.yaml").write_text(
        f'title: "noise18 jailed careful"\nagents: [{{command: ["{{python}}", "{AGENT}", "careful"]}}]\n'
        "expect: {verdict: PASS}\n")
    (scen / "s-peek.yaml").write_text(  # the jailed agent's own read of the same decoy stays its own
        f'title: "noise18 jailed peek"\nagents: [{{command: ["{{python}}", "{AGENT}", "peek"]}}]\n'
        "expect: {verdict: FAIL_VAULT_BYPASS}\n")


@pytest.mark.timeout(240)
@pytest.mark.skipif(__import__("vault.jail.probe", fromlist=["problem"]).problem() is not None, reason="no jail here")
def test_a_jails_decoy_opened_from_no_jail_is_not_the_agents(tmp_path: Path) -> None:
    """A jailed careful agent waits while a process of this machine in no jail (a neighbour's
    scan; started after the agent, below the test that started the run, so its ancestry cannot
    show it outside the trial) opens the decoy `h/daemon.pid` in the trial's directory: the
    trial failed "jailed agent 0 opened h/daemon.pid (a decoy in the jail)". Every process of a
    jailed agent is in its jail's PID namespace; the opener is in the runner's."""
    scen = tmp_path / "sc"
    scen.mkdir()
    _jailed_careful(scen)  # its markers in its state directory (bound into the jail)
    report = tmp_path / "r.json"
    run = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(scen), "--isolation", "bwrap", "--color", "never",
                            "--json", str(report)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader: subprocess.Popen[str] | None = None
    try:
        go = lambda: list(Path("/tmp").glob(f"vsr-{run.pid}-*/st/*/go"))  # noqa: E731
        wait_for(lambda: go() or run.poll() is not None, timeout=120, what="the agent to start")
        assert go(), (run.poll(), list(Path("/tmp").glob(f"vsr-{run.pid}-*/*")))
        decoy = go()[0].parents[2] / "jail-0" / "h" / "daemon.pid"  # ROOT/st/AGENT/go: the careful trial's root
        assert decoy.is_file()
        code = "import sys\nf = open(sys.argv[1], 'rb')\nf.read()\nprint('read', flush=True)\nsys.stdin.read()\n"
        reader = subprocess.Popen([PY, "-c", code, str(decoy)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert reader.stdout is not None and reader.stdout.readline() == "read\n"
        (go()[0].parent / "done").touch()
        out, _ = run.communicate(timeout=180)
    finally:
        for p in (run, reader):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert report.exists(), out[-3000:]
    trials = {s["id"]: t for s in json.loads(report.read_text())["scenarios"] for t in s["trial_results"]}
    careful, peek = trials["s-careful"], trials["s-peek"]
    assert careful["verdict"] == "PASS", (careful["verdict"], careful.get("findings"), careful.get("errors"))
    # said, not graded (fanotify sees the decoys' one inode: which name was opened it cannot tell); no
    # approver socket was reached (the decoy opens were once said as "...socket ... (True)")
    said = [e for e in careful["errors"] if "in no jail (the runner's PID namespace), opened a decoy in the jail" in e]
    assert said and f"process {reader.pid} " in said[0], careful["errors"]
    assert not any("approver socket" in e for e in careful["errors"]), careful["errors"]
    assert peek["verdict"] == "FAIL_VAULT_BYPASS", (peek["verdict"], peek.get("findings"))
    assert "daemon.pid" in json.dumps(peek["findings"]), peek["findings"]
