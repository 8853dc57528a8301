"""Twelfth hostile pass: a vault home whose file system the kernel turns read-only under a running
daemon, and CLI options that are empty or huge.

Real processes only: a daemon with its fake remote on a real ext4 file system (a loop device,
mounted errors=remount-ro; root only, skipped with the reason elsewhere), `vaultsim` run as a
user runs it (with an address-space cap, so a command that would take the machine fails the
test instead).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import PY, ROOT, Sandbox, new_sandbox, stop_process, wait_for
from hostile_fixtures import RawClient, frame, run_script, setup

CALL = "client.open_session('a', 'run-1')\nout(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"
MEMORY_CAP = 2 << 30  # bytes of address space for one CLI run


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VAULTSIM_HOME": str(cwd / "home")}
    return subprocess.run([PY, "-m", "vault.cli.main", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env, preexec_fn=_capped, stdin=subprocess.DEVNULL)


class Ext4Home:
    """The sandbox's vault home on its own small ext4 file system (a loop device), mounted so
    that the kernel remounts it read-only on an error, as a real disk's first I/O error does."""

    def __init__(self, box: Sandbox) -> None:
        self.box = box
        self.image = box.root / "home.img"
        self.device = ""

    def mount(self) -> None:
        try:
            subprocess.run(["truncate", "-s", "32M", str(self.image)], check=True)
            made = subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], capture_output=True, text=True)
            attached = subprocess.run(["losetup", "-f", "--show", str(self.image)], capture_output=True, text=True)
        except FileNotFoundError as exc:
            pytest.skip(f"no {exc.filename} here (e2fsprogs, util-linux)")
        if made.returncode != 0 or attached.returncode != 0:
            pytest.skip(f"cannot make a loop-mounted ext4 here (needs root): {made.stderr}{attached.stderr}".strip())
        self.device = attached.stdout.strip()
        self.box.home.mkdir(mode=0o700)
        done = subprocess.run(["mount", "-o", "errors=remount-ro", self.device, str(self.box.home)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount ext4 here: {done.stderr.strip()}")
        os.chmod(self.box.home, 0o700)

    def fail(self) -> None:
        """An error the file system cannot go on from: the kernel remounts it read-only."""
        trigger = Path("/sys/fs/ext4") / os.path.basename(self.device) / "trigger_fs_error"
        trigger.write_text("test: a failing disk\n")
        wait_for(lambda: self.read_only(), what="the kernel to remount the home read-only")

    def read_only(self) -> bool:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if fields[1] == str(self.box.home):
                # newer kernels keep "rw" and add "emergency_ro" (ext4's shutdown state)
                return bool({"ro", "emergency_ro"} & set(fields[3].split(",")))
        return False

    def remove(self) -> None:
        subprocess.run(["umount", "-l", str(self.box.home)], capture_output=True)
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True)


@pytest.fixture
def ext4_box() -> Iterator[tuple[Sandbox, Ext4Home]]:
    box = new_sandbox()
    disk = Ext4Home(box)
    try:
        disk.mount()
        yield box, disk
    finally:
        box.close()
        disk.remove()
        subprocess.run(["rm", "-rf", "--one-file-system", str(box.root)], capture_output=True)


class TestAHomeTheKernelRemountsReadOnly:
    def test_stop_says_stopped_and_the_daemon_still_closes_its_parts(
            self, ext4_box: tuple[Sandbox, Ext4Home]) -> None:
        """The home's disk fails under a serving daemon (ext4, errors=remount-ro). Calls are
        refused with the reason; then `vaultsim stop` waited its whole timeout and said "did not
        stop" (exit 1), since it waited for the socket file to go, which a read-only home keeps;
        and the daemon's stop ended at that unlink (EROFS): its executors were never closed
        ("Unclosed client session") and its log never told it could not be signed. Now stop
        says stopped, and the daemon's last line names the audit log's failure."""
        box, disk = ext4_box
        setup(box)
        assert "success" == run_script(box, CALL)[0]["category"]
        disk.fail()
        refused = run_script(box, CALL)[0]
        assert "local_failure" == refused["category"] and "audit log" in refused["message"], refused
        out = box.vaultsim("stop", "--timeout", "20")
        assert (0, "") == (out.returncode, out.stderr), out
        assert "stopped" in out.stdout
        daemon = next(p for p in box.procs if "daemon" in p.args)
        assert 1 == daemon.wait(timeout=15)  # its log could not be signed: not a clean stop
        logged = (box.root / "daemon.stderr").read_text()
        assert "Unclosed" not in logged and "Traceback" not in logged, logged[-2000:]
        assert "cannot remove" in logged and "Read-only file system" in logged
        assert logged.strip().splitlines()[-1].startswith("vaultsim daemon: stopped; audit log failed")


SCENARIO = ROOT / "scenarios" / "gate-1-healthy-delivery.yaml"

# every file or directory argument, given empty (`--policy "$POLICY"` with POLICY unset)
EMPTY_PATHS = {
    "run PATH": ("run", ""),
    "run --json": ("run", str(SCENARIO), "--json", ""),
    "run --junit": ("run", str(SCENARIO), "--junit", ""),
    "run --policy": ("run", str(SCENARIO), "--policy", "", "--list"),
    "daemon --policy": ("daemon", "--foreground", "--unlocked", "--policy", ""),
    "daemon --catalog": ("daemon", "--foreground", "--unlocked", "--catalog", ""),
    "daemon --config": ("daemon", "--foreground", "--unlocked", "--config", ""),
    "init DIR": ("init", ""),
    "audit verify LOG": ("audit", "verify", ""),
    "audit show --log": ("audit", "show", "--log", ""),
    "policy suggest -o": ("policy", "suggest", "r.json", "-o", ""),
    "report merge --json": ("report", "merge", "r.json", "--json", ""),
    "approve --log": ("approve", "--script", "rules.yaml", "--log", ""),
    "remote --events": ("remote", "--events", ""),
    "mcp --socket": ("mcp", "--socket", ""),
    "exec --workdir": ("exec", "--workdir", "", "--", "true"),
}


class TestAnEmptyPath:
    @pytest.mark.parametrize("argv", EMPTY_PATHS.values(), ids=EMPTY_PATHS.keys())
    def test_is_refused_naming_the_option_and_nothing_is_done(self, tmp_path: Path, argv: tuple[str, ...]) -> None:
        """An empty path was read as the current directory (`run ''` ran the scenarios found here,
        `init ''` wrote a suite here) or, tested for truth, as the option left out: `daemon
        --policy ''` served with the default policy instead of the one meant, `run --json ''`
        ran every trial and wrote no report, `audit show --log ''` showed the home's log. Now
        exit 2 at once, naming the option, and nothing is started or written."""
        out = cli(tmp_path, *argv, timeout=60)
        assert 2 == out.returncode, out
        assert "empty path" in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert [] == sorted(p.name for p in tmp_path.iterdir())  # no home, no suite, no report


class TestTrialsPastAnyUse:
    def test_are_refused_before_memory_is_taken(self, tmp_path: Path) -> None:
        """`run --trials 99999999999999999999` listed every trial before starting one: it took
        every byte of the machine (the kernel's OOM killer ended it; capped, a MemoryError
        traceback, exit 3). Now exit 2 naming the bound, nothing run."""
        out = cli(tmp_path, "run", str(SCENARIO), "--trials", "9" * 20)
        assert 2 == out.returncode, out.stderr[-2000:]
        assert "--trials must be from 1 to 10000" in out.stderr and "Traceback" not in out.stderr
        assert "SCENARIO" not in out.stdout


class TestADiagnosticThatIsNotAFile:
    @pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
    def test_diag_show_refuses_it_at_once(self, tmp_path: Path, kind: str) -> None:
        """A same-user process (an agent run without the jail) puts a FIFO, or a symbolic link to
        /dev/zero, where a diagnostic's file goes: `vaultsim diag show ID` waited forever for a
        writer, or read /dev/zero until memory ran out. Now exit 1 at once naming the id and why;
        the runner's scan of the diagnostics (leaks) reads none of them either."""
        box = new_sandbox()
        try:
            box.set_secret("tracker_token", "a-value")
            where = box.home / "diagnostics"
            where.mkdir(mode=0o700, exist_ok=True)
            did = "d-" + "0" * 27
            planted = where / f"{did}.diag"
            if kind == "fifo":
                os.mkfifo(planted, 0o600)
            else:
                planted.symlink_to("/dev/zero")
            out = subprocess.run([PY, "-m", "vault.cli.main", "diag", "show", did], capture_output=True, text=True,
                                 timeout=60, env=box.env, preexec_fn=_capped, stdin=subprocess.DEVNULL)
            assert 1 == out.returncode, out.stderr
            assert f"cannot read diagnostic {did}" in out.stderr and "Traceback" not in out.stderr, out.stderr
            assert 1 == len(out.stderr.strip().splitlines()), out.stderr
            from vault.home import VaultHome
            from vault.runner.collect import diagnostics
            from vault.store.keyring_backend import FileKeyring
            from vault.store.keystore import KeyStore
            home = VaultHome(box.home)
            world = SimpleNamespace(home=home, keystore=KeyStore(home, FileKeyring(box.root / "kr")))
            assert {} == diagnostics(world, [b"never-in-any-file"])  # type: ignore[arg-type]
        finally:
            box.close()
            subprocess.run(["rm", "-rf", str(box.root)], capture_output=True)


# without the jail, files of the trial's own directory an agent can reach: the task file its
# environment names, and the keeper's report beside it; (the file, the verdict that names it)
FIFO_TARGETS = {
    "task file": ('"$VAULTSIM_TASK"', "FAIL_OUTCOME"),
    "keeper report": ('"$(dirname "$VAULTSIM_TASK")/keeper-0.log"', "FAIL_DEADLINE"),
    "its own stdout file": ('"$(dirname "$VAULTSIM_TASK")/agent-0.out"', "FAIL_OUTCOME"),
}


class TestAnAgentThatTurnsATrialFileIntoAFifo:
    @pytest.mark.parametrize("target", FIFO_TARGETS.values(), ids=FIFO_TARGETS.keys())
    def test_the_run_ends_with_a_verdict(self, tmp_path: Path, target: tuple[str, str]) -> None:
        """Without the jail an agent can replace the task file its environment names, or the
        keeper's report or its own output file beside it, with a FIFO. The runner opened them to
        read them: the open waited forever for a writer (the task file in a thread the
        interpreter joins at exit, the others in the event loop itself), so `vaultsim run` hung
        past TERM; only KILL ended it. Now only regular files are read there; the run ends with its verdict (a report that
        is no file fails closed: the keeper's count is missing)."""
        where, verdict = target
        agent = tmp_path / "fifo_agent.sh"
        agent.write_text(f'rm -f {where}; mkfifo {where}; echo \'{{"status": "done"}}\'\n')
        out = cli(tmp_path, "run", str(SCENARIO), "--isolation", "none", "--agent", f"sh {agent}", timeout=240)
        assert 1 == out.returncode, out.stdout[-2000:] + out.stderr[-2000:]
        assert verdict in out.stdout and "RELEASE BLOCKED" in out.stdout
        assert "Traceback" not in out.stderr


class TestRemoteInputFilesThatAreNotFiles:
    @pytest.mark.parametrize("option", ["--credentials", "--sim-token-file"])
    def test_a_fifo_is_refused_at_once_not_waited_on(self, tmp_path: Path, option: str) -> None:
        """`vaultsim remote --credentials F` where F is a FIFO (a shell's `<(...)` that never
        writes) waited forever for a writer: the remote never started and never said why. Now
        exit 2 at once naming the file, as the daemon's --policy/--catalog/--config do."""
        fifo = tmp_path / "creds.yaml"
        os.mkfifo(fifo, 0o600)
        out = cli(tmp_path, "remote", option, str(fifo), timeout=60)
        assert 2 == out.returncode, out.stderr
        assert f"{fifo}: not a regular file" in out.stderr and "Traceback" not in out.stderr
