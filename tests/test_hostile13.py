"""Thirteenth hostile pass: an approver token that is no token, a home that leaves its path under
a running daemon, a socket taken over by another listener, the "disk nearly full" warning on a
small disk, and `--vaultsim-trials` past any use.

Real processes only: daemons with their fake remote, `vaultsim` run as a user runs it, homes on
their own tmpfs (root only, skipped with the reason elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT, Sandbox, new_sandbox, wait_for
from hostile_fixtures import run_script, served, setup  # noqa: F401  (served: a module-scoped daemon)

# each command that reads the approver token, with what it needs besides
TOKEN_READERS = {
    "lock": ("lock",),
    "unlock": ("unlock",),
    "stats": ("stats",),
    "stop": ("stop", "--timeout", "5"),
    "approve": ("approve", "--script", "{script}"),
}


def _plant(token: Path, kind: str, box: Sandbox) -> None:
    """Put `kind` where the approver token is (the token file itself removed first)."""
    token.unlink()
    if kind == "fifo":
        os.mkfifo(token, 0o600)
    elif kind == "directory":
        token.mkdir(mode=0o700)
    elif kind == "link to /dev/zero":
        token.symlink_to("/dev/zero")
    elif kind == "huge file":
        with open(token, "wb") as f:
            f.truncate(1 << 30)
        os.chmod(token, 0o600)
    elif kind == "link to a token":
        elsewhere = box.root / "token-copy"
        elsewhere.write_text("A" * 43)
        token.symlink_to(elsewhere)
    elif kind == "long line":  # under the read bound, over what approver.hello takes
        token.write_text("A" * 600)
        os.chmod(token, 0o600)


class TestAnApproverTokenThatIsNoToken:
    @pytest.mark.parametrize("kind", ["fifo", "directory", "link to /dev/zero", "huge file", "link to a token",
                                      "long line"])
    def test_every_command_that_reads_it_exits_2_at_once(self, served: Sandbox, kind: str) -> None:  # noqa: F811
        """`vaultsim lock`, `unlock`, `stats`, `stop` and `approve` read the home's approver token:
        given a FIFO, a directory or a link to /dev/zero there they said "not a regular file" with
        exit 1 (a negative answer, as if the daemon refused), a GiB file went to the daemon as a
        "token" (exit 1, "invalid params"), a link to another file was followed. (A short or wrong
        token still goes to the daemon, whose refusal is exit 1: test_cli_router.) Now each is bad
        input: exit 2 at once, naming the file and what to do, and the daemon serves on."""
        token = served.home / "approver.token"
        saved = token.read_bytes()
        script = ROOT / "scenarios" / "approvers" / "deny-all.yaml"
        try:
            _plant(token, kind, served)
            for name, argv in TOKEN_READERS.items():
                started = time.monotonic()
                out = served.vaultsim(*(a.format(script=script) for a in argv), timeout=30)
                assert 2 == out.returncode, (name, out.stdout, out.stderr)
                said = out.stderr.strip()
                assert f"vaultsim {name}: {token}" in said and "restart the daemon" in said, (name, said)
                assert "Traceback" not in said and 1 == len(said.splitlines()), said
                assert time.monotonic() - started < 20, name
        finally:
            if token.is_dir() and not token.is_symlink():
                token.rmdir()
            else:
                token.unlink()
            token.write_bytes(saved)
            os.chmod(token, 0o600)
        assert served.status() is not None  # `stop` stopped nothing
        assert 0 == served.vaultsim("lock").returncode and 0 == served.vaultsim("unlock").returncode


def _tmpfs(where: Path, size: str = "32m") -> None:
    where.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")


@pytest.fixture
def tmpfs_box() -> Iterator[Sandbox]:
    """A sandbox whose vault home is its own 32 MiB tmpfs."""
    box = new_sandbox()
    try:
        _tmpfs(box.home)
        yield box
    finally:
        box.close()
        for _ in range(3):  # a mount left by the test, then the one under it
            if subprocess.run(["umount", "-l", str(box.home)], capture_output=True).returncode != 0:
                break
        subprocess.run(["rm", "-rf", "--one-file-system", str(box.root)], capture_output=True)


class TestAHomeThatLeavesItsPath:
    def test_the_daemon_stops_saying_why_and_writes_nothing_in_the_other_directory(self, tmpfs_box: Sandbox) -> None:
        """`umount -l` of the home under a serving daemon: the daemon served on through held
        connections, but `status` and `stop` said no daemon serves, a second daemon could start on
        the same path, and what it wrote by path (the audit head) went into that other directory.
        Now the daemon notices within its housekeeping period, ends its log through the open
        file, says why in its last line and stops (exit 1: its log is left unsigned); nothing is
        written in the directory now at the path, and a second daemon starts there cleanly."""
        box = tmpfs_box
        setup(box)
        daemon = next(p for p in box.procs if "daemon" in p.args)
        subprocess.run(["umount", "-l", str(box.home)], check=True)
        assert 1 == daemon.wait(timeout=15)
        logged = (box.root / "daemon.stderr").read_text()
        assert "is no longer at its path (unmounted, moved or replaced)" in logged, logged[-2000:]
        assert "Traceback" not in logged
        assert logged.strip().splitlines()[-1].startswith("vaultsim daemon: stopped; audit log failed")
        assert [] == os.listdir(box.home)  # no head file, no socket removed or made, no pid file
        box.start_daemon()  # a second daemon on the path: it serves, as status says
        assert 0 == box.vaultsim("status").returncode


class TestASocketTakenOverByAnotherListener:
    def test_is_said_once_and_left_in_place_at_stop(self) -> None:
        """A same-user process (an agent without the jail) removes agent.sock and listens there
        itself. The daemon said nothing, and at its stop removed the other process's socket file.
        Now its log says once that the path is no longer its socket, and its stop leaves it."""
        box = new_sandbox()
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            daemon = box.start_daemon()
            box.agent_sock.unlink()
            other.bind(str(box.agent_sock))
            other.listen(1)
            theirs = os.lstat(box.agent_sock).st_ino
            log = box.root / "daemon.stderr"
            wait_for(lambda: "agent.sock is no longer this daemon's socket" in log.read_text(),
                     what="the daemon to notice its socket was replaced")
            daemon.send_signal(signal.SIGTERM)
            assert 0 == daemon.wait(timeout=15)
            assert theirs == os.lstat(box.agent_sock).st_ino  # still the other listener's
            assert 1 == log.read_text().count("agent.sock is no longer this daemon's socket (removed or replaced)")
            assert not (box.home / "approver.sock").exists()  # its own one it removed
        finally:
            other.close()
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestStatusOnASmallDisk:
    def test_warns_only_when_the_headroom_is_short(self, tmpfs_box: Sandbox) -> None:
        """On a 32 MiB disk with 32 MiB free `status` warned "the disk is nearly full" (a fixed
        512 MiB threshold): a warning that is always on is one nobody reads. Now it warns under
        a tenth of a small disk, never under the 8 MiB the vault's own writes need."""
        box = tmpfs_box
        quiet = box.vaultsim("status")
        assert 1 == quiet.returncode and "free on its disk" in quiet.stdout, quiet
        assert "nearly full" not in quiet.stdout, quiet.stdout
        filler = box.home / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * (26 << 20))  # tmpfs: written pages count, a sparse file would not
        loud = box.vaultsim("status")
        assert "WARNING: the disk is nearly full" in loud.stdout, loud.stdout
        filler.unlink()


class TestPluginTrialsPastAnyUse:
    def test_are_a_usage_error(self, pytester: pytest.Pytester) -> None:
        """`pytest --vaultsim-trials 99999999999` had no upper bound (`vaultsim run --trials` stops
        at 10000): every trial of every scenario item was run. Now a usage error naming the bound."""
        (pytester.path / "sc.yaml").write_text("agents: [{plan: {steps: []}}]\nexpect: {verdict: PASS}\n")
        out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vaultsim-scenarios",
                                            "--vaultsim-trials=99999999999")
        text = out.stdout.str() + out.stderr.str()
        assert "--vaultsim-trials 99999999999: at least 1 and at most 10000" in text, text[-2000:]
        assert "Traceback" not in text and out.ret == pytest.ExitCode.USAGE_ERROR


class TestADaemonCutOffFromItsSockets:
    def test_status_names_it_and_stop_stops_it(self) -> None:
        """A same-user process removes both socket files of a serving daemon. `status` said no
        daemon serves (nothing else), `stop` said the same and exit 1, while the daemon lived on
        holding the home (a new start: "already serves"): nothing a user ran could stop it short
        of finding its pid. Now `status` names the pid that holds the home, and `stop` stops it
        cleanly (SIGTERM: its log signed, exit 0)."""
        box = new_sandbox()
        try:
            daemon = box.start_daemon()
            box.agent_sock.unlink()
            (box.home / "approver.sock").unlink()
            status = box.vaultsim("status", "--json")
            assert 1 == status.returncode, status
            assert daemon.pid == json.loads(status.stdout)["held_by_pid"]
            assert f"but daemon pid {daemon.pid} holds it" in box.vaultsim("status").stdout
            out = box.vaultsim("stop", "--timeout", "20")
            assert (0, "") == (out.returncode, out.stderr), out
            assert f"daemon (pid {daemon.pid}) stopped; it answered on no socket" in out.stdout
            assert 0 == daemon.wait(timeout=15)
            assert 1 == box.vaultsim("stop").returncode  # nothing left to stop
            assert "held_by_pid" not in json.loads(box.vaultsim("status", "--json").stdout)
        finally:
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)

    def test_stop_never_signals_another_process_that_holds_the_lock(self, tmp_path: Path) -> None:
        """Only a vaultsim daemon is stopped this way: a `flock` of the lock file is left alone."""
        home = tmp_path / "h"
        home.mkdir(mode=0o700)
        holder = subprocess.Popen(["flock", str(home / "daemon.lock"), "sleep", "600"])
        try:
            from vault.daemon.instance import lock_holder
            from vault.home import VaultHome
            wait_for(lambda: lock_holder(VaultHome(home)) is not None, what="the lock to be held")
            out = subprocess.run([sys.executable, "-m", "vault.cli.main", "stop", "--home", str(home)],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert 1 == out.returncode and "no daemon serves" in out.stderr, out
            assert holder.poll() is None
        finally:
            holder.kill()
            holder.wait()


CALLS = "client.open_session('a', 'run-1')\nfor i in range(40): out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"


class TestAnAuditLogReplacedWhileRunning:
    @pytest.mark.parametrize("kind", ["fifo", "symlink"])
    def test_is_not_rotated_into_the_set_and_calls_stop(self, kind: str) -> None:
        """A same-user process (an agent without the jail) replaces the active audit log with a FIFO
        or a link to a file of its own. The daemon's next rotation renamed that into the log's set
        (audit.000000000000.log a FIFO) while what it had written, unlinked, was gone; it served
        on and `status` said nothing was wrong. Now the rotation checks the file at the path is
        the one it writes: if not, the log fails closed (calls refused, `status` exit 2 naming
        it), nothing is renamed, and the daemon still stops cleanly."""
        box = new_sandbox()
        try:
            setup(box, "--audit-segment-mib", "0.01")  # rotates every ~10 KiB: within a few calls
            log = box.home / "audit.log"
            log.unlink()
            if kind == "fifo":
                os.mkfifo(log, 0o600)
            else:
                theirs = box.root / "theirs.log"
                theirs.write_text("")
                log.symlink_to(theirs)
            results = run_script(box, CALLS)
            assert "local_failure" == results[-1]["category"] and "audit log" in results[-1]["message"], results[-1]
            status = box.vaultsim("status", "--json")
            assert 2 == status.returncode, status
            assert "is no longer the file this daemon writes" in json.loads(status.stdout)["halted"]
            segments = [p for p in box.home.iterdir() if p.name.startswith("audit.0")]
            assert [] == segments  # the foreign file was not taken into the set
            assert (log.is_fifo() if kind == "fifo" else log.is_symlink())
            stopped = box.vaultsim("stop", "--timeout", "20")
            assert 0 == stopped.returncode, stopped
            assert "Traceback" not in (box.root / "daemon.stderr").read_text()
        finally:
            box.close()
            shutil.rmtree(box.root, ignore_errors=True)


class TestALogThatIsAFifoWithNoReader:
    def test_a_background_start_refuses_it_at_once(self, tmp_path: Path) -> None:
        """A same-user process (an agent without the jail) puts a FIFO where the home's daemon.log
        goes: `vaultsim daemon` (background) opened it to hand to the daemon and waited forever
        for a reader; no daemon started and nothing said why. Now exit 2 at once naming the file,
        which is left as found, and no daemon is started."""
        home = tmp_path / "h"
        home.mkdir(mode=0o700)
        os.mkfifo(home / "daemon.log", 0o600)
        out = subprocess.run([sys.executable, "-m", "vault.cli.main", "daemon", "--home", str(home), "--unlocked"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)
        assert 2 == out.returncode, out
        assert f"cannot start: {home / 'daemon.log'}" in out.stderr and "Traceback" not in out.stderr
        assert (home / "daemon.log").is_fifo() and not (home / "agent.sock").exists()

    def test_approve_log_is_refused_at_once(self, tmp_path: Path) -> None:
        """`vaultsim approve --log F` where F is a FIFO nobody reads waited forever in the open,
        before it even looked for a daemon. Now exit 2 at once naming the option and why (a FIFO
        that a process reads still works as the log)."""
        fifo = tmp_path / "decisions"
        os.mkfifo(fifo, 0o600)
        out = subprocess.run([sys.executable, "-m", "vault.cli.main", "approve", "--home", str(tmp_path / "h"),
                              "--script", str(ROOT / "scenarios" / "approvers" / "deny-all.yaml"), "--log", str(fifo)],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)
        assert 2 == out.returncode, out
        assert f"--log: cannot open {fifo}: a FIFO that no process reads" in out.stderr

    def test_remote_events_is_refused_at_once(self, tmp_path: Path) -> None:
        """`vaultsim remote --events F` where F is a FIFO nobody reads waited forever before
        serving (hostile12 fixed the FIFO as an input file; this one is the output). Now exit 2."""
        fifo = tmp_path / "events"
        os.mkfifo(fifo, 0o600)
        out = subprocess.run([sys.executable, "-m", "vault.cli.main", "remote", "--events", str(fifo)],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)
        assert 2 == out.returncode, out
        assert f"--events: cannot open {fifo}: a FIFO that no process reads" in out.stderr
