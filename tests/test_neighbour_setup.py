"""A neighbour's world being set up is not read by this trial's walk of the shared places.

Before: the walk (vault.runner.shared_dirs) passed over another live world only when its daemon
held `daemon.lock`, and it read every file it had listed only once the walk was done. A
neighbour run (two `vaultsim run`s at once: pytest-xdist, two CI jobs) whose daemon was still
starting when the walk went by was read a second later, while its agent ran under its
fanotify watch: that run's errors named this runner ("process N (python), not below the
trial's agents or daemon, opened h/credentials.enc"), and its careful agent's trial was not
clean. Three parallel loops of `vaultsim run` with a careful agent showed it in 9 of 30 runs.

Now a run root is locked (`run.lock`) by the runner that made it, from before its first file
until it is removed, and the walk's files are checked against their directories' locks
afresh before any is read.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY
from test_noise18 import _holder as flock_holder  # a process holding a lock, as a neighbour's runner


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


def _setting_up(root: Path) -> None:
    """A run root as a neighbour's set-up leaves it before its daemon starts: credentials and a
    keyring written, no daemon (so no held `daemon.lock`) yet."""
    for d in ("h", "kr"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "h" / "credentials.enc").write_bytes(b"\0" * 64)
    (root / "kr" / "keyring.json").write_text("{}")


def _read(tmp: Path, since: float, outside: object) -> set[str]:
    from vault.runner import shared_dirs
    files, _ = shared_dirs.written([str(tmp)], since, set(), outside=outside)  # type: ignore[arg-type]
    return {p.relative_to(tmp).as_posix() for p in files}


def test_a_neighbours_run_root_is_passed_over_while_its_daemon_starts(tmp_path: Path) -> None:
    since = time.time() - 1
    root = tmp_path / "vsr-neighbour"
    root.mkdir()
    neighbour = flock_holder(root / "run.lock")  # taken as the root was made, before its first file
    try:
        _setting_up(root)
        (tmp_path / "leak").write_text("x")  # beside it: still read
        assert _read(tmp_path, since, lambda pid: pid == neighbour.pid) == {"leak"}
        # the judge's word, not the lock's alone: a holder the trial cannot rule out is read past
        assert "vsr-neighbour/h/credentials.enc" in _read(tmp_path, since, lambda pid: False)
    finally:
        _stop(neighbour)
    # its runner gone (the lock released): nothing vouches for it any more
    assert "vsr-neighbour/h/credentials.enc" in _read(tmp_path, since, lambda pid: True)


def test_a_world_whose_lock_is_taken_after_the_walk_passed_it_is_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk looks at the kernel's lock table once; the neighbour's daemon takes its lock just
    after. Its files, listed by then, are not read."""
    from vault.daemon import instance
    from vault.runner import shared_dirs
    since = time.time() - 1
    root = tmp_path / "vs0"
    _setting_up(root)
    (root / "h" / "daemon.lock").touch()
    (tmp_path / "leak").write_text("x")
    real = instance.flock_holders
    started: list[subprocess.Popen[str]] = []

    def daemon_starts_right_after() -> dict[str, int]:
        table = real()
        if not started:
            started.append(flock_holder(root / "h" / "daemon.lock"))
        return table

    monkeypatch.setattr(shared_dirs, "flock_holders", daemon_starts_right_after)
    try:
        assert _read(tmp_path, since, lambda pid: bool(started) and pid == started[0].pid) == {"leak"}
        assert len(started) == 1  # the lock was looked at before it was held: the second look passed it over
    finally:
        for proc in started:
            _stop(proc)


def test_hold_locks_a_root_for_its_maker(tmp_path: Path) -> None:
    from vault.daemon.instance import flock_holders, lock_key
    from vault.runner import shared_dirs
    fd = shared_dirs.hold(tmp_path)
    try:
        st = os.stat(tmp_path / shared_dirs.RUN_LOCK)
        assert flock_holders()[lock_key(st)] == os.getpid()
        assert st.st_mode & 0o777 == 0o600
    finally:
        os.close(fd)
    assert lock_key(os.stat(tmp_path / shared_dirs.RUN_LOCK)) not in flock_holders()


def test_a_plugin_world_holds_its_root_while_it_lives(vaultsim: object) -> None:
    """The pytest plugin's world (vault.runner.live, as `vaultsim run`'s trials): its root's lock
    is held by this process while the world lives."""
    from vault.daemon.instance import flock_holders, lock_key
    from vault.runner import shared_dirs
    root = Path(vaultsim.live.root)  # type: ignore[attr-defined]
    assert flock_holders().get(lock_key(os.stat(root / shared_dirs.RUN_LOCK))) == os.getpid()


CHECK = """import os, sys
root = os.path.dirname(os.path.dirname(os.environ["VAULTSIM_SOCKET"]))
st = os.stat(os.path.join(root, "run.lock"))
key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
held = [l.split()[4] for l in open("/proc/locks") if l.split()[1] == "FLOCK" and l.split()[5] == key]
open(sys.argv[1], "w").write(" ".join(held))
"""


def test_a_trials_root_is_held_by_its_runner_while_its_agent_runs(tmp_path: Path) -> None:
    from helpers import ROOT
    (tmp_path / "check.py").write_text(CHECK)
    out = tmp_path / "held"
    proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(ROOT / "scenarios" / "c01-read-issue-dns.yaml"),
                             "--isolation", "none", "--agent", f"{{python}} {tmp_path / 'check.py'} {out}",
                             "--color", "never"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said, _ = proc.communicate(timeout=120)
    assert out.exists(), said[-3000:]
    # the runner (this Popen's process) holds it: not the agent, nor anything the agent started
    assert out.read_text().split() == [str(proc.pid)], said[-3000:]


def test_an_agents_working_directory_in_tmp_passes_over_other_worlds(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`vaultsim run` started from /tmp: `--agent` runs there, and the scan of what the agent wrote
    in its working directory read every changed file below it, a neighbour run's credentials and
    this trial's own vault home included. Now they are passed over as in the shared places."""
    from types import SimpleNamespace

    from vault.runner import collect
    from vault.runner.evidence import AgentRun, Evidence
    since = time.time() - 1
    theirs, mine = tmp_path / "vsr-neighbour", tmp_path / "vsr-mine"
    theirs.mkdir()
    neighbour = flock_holder(theirs / "run.lock")
    try:
        _setting_up(theirs)
        _setting_up(mine)  # this trial's root (vault.runner.world), read by its own rules
        (tmp_path / "notes.txt").write_text("x")  # what the agent wrote: read
        trial = SimpleNamespace(outside=lambda chain: bool(chain) and chain[0][0] == neighbour.pid)
        world = SimpleNamespace(root=mine, remote=SimpleNamespace(vouch=SimpleNamespace(trial=lambda: trial)))
        ev = Evidence(run_id="r", started=since, deadline=since + 60, isolation={"mode": "none"},
                      secrets={"k": "vsk_" + "a" * 32})
        ev.agents = [AgentRun(0, "a", "a", 1, since, since + 1, 0, False, "", "", cwd=str(tmp_path))]
        read: list[Path] = []
        monkeypatch.setattr(collect, "leak_window", lambda path, needles, clean=None: read.append(path) or b"")
        collect.working_dir_files(world, ev)  # type: ignore[arg-type]
        assert sorted(p.relative_to(tmp_path).as_posix() for p in read) == ["notes.txt"]
    finally:
        _stop(neighbour)
