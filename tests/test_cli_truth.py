"""The documented commands say what happened: found by trying them, checked the same way.

Each test runs the real `vaultsim` command in a fresh process, as a user would,
and checks its exit code, its one-line reason and what it left on disk.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, Sandbox, wait_for

BAD_REGEX_CATALOG = """\
operations:
  read_thing:
    risk: read
    executor: http
    service: tracker
    method: GET
    path: /v1/things/{thing_id}
    credential: tracker_token
    params: {thing_id: {type: string, pattern: "[a-z"}}
"""


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert 1 == len(lines) and "Traceback" not in text, text
    return lines[0]


class TestSecondDaemon:
    def test_background_start_names_the_running_daemon(self, sandbox: Sandbox) -> None:
        """`vaultsim daemon` on a served home exits 1 naming the serving pid; it used to
        print "serving ... (pid N)" and exit 0 while that pid died with "already serves"."""
        first = sandbox.start_daemon()
        out = sandbox.vaultsim("daemon", timeout=60)
        assert 1 == out.returncode
        assert "serving" not in out.stdout
        assert f"pid {first.pid}" in one_line(out.stderr) and "already serves" in out.stderr
        assert first.pid == sandbox.status()["pid"]

    def test_background_then_background(self, sandbox: Sandbox) -> None:
        """Two detached starts in a row: the second names the first's pid, exit 1."""
        first = sandbox.vaultsim("daemon", timeout=60)
        assert 0 == first.returncode, first.stderr
        pid = sandbox.status()["pid"]
        assert f"(pid {pid})" in first.stdout
        second = sandbox.vaultsim("daemon", "--foreground", timeout=60)
        third = sandbox.vaultsim("daemon", timeout=60)
        for out in (second, third):
            assert 1 == out.returncode and f"pid {pid}" in one_line(out.stderr)
        assert pid == sandbox.status()["pid"]

    def test_racing_starts(self, sandbox: Sandbox) -> None:
        """Two detached starts at once: exactly one serves; the other exits 1 naming it."""
        argv = [PY, "-m", "vault.cli.main", "daemon"]
        procs = [subprocess.Popen(argv, env=sandbox.env, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [(p.wait(timeout=90), *p.communicate()) for p in procs]
        assert [0, 1] == sorted(rc for rc, _, _ in outs), outs
        pid = wait_for(sandbox.status, what="the winner to answer")["pid"]
        loser = next(err for rc, _, err in outs if rc == 1)
        assert f"pid {pid}" in one_line(loser)
        winner = next(out for rc, out, _ in outs if rc == 0)
        assert f"(pid {pid})" in winner


class TestHomeArgument:
    COMMANDS = [("daemon", "--foreground"), ("daemon",), ("secret", "list"), ("secret", "set", "A")]
    IDS = ["daemon-fg", "daemon-bg", "secret-list", "secret-set"]

    def run(self, sandbox: Sandbox, home: str, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "vault.cli.main", *command, "--home", home], input="value",
                              env=sandbox.env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    @pytest.mark.parametrize("command", COMMANDS, ids=IDS)
    def test_empty_home(self, sandbox: Sandbox, command: tuple[str, ...]) -> None:
        """`--home ""` is refused; it used to mean the current directory (and chmod it)."""
        before = stat.S_IMODE(ROOT.stat().st_mode)
        out = self.run(sandbox, "", *command)
        assert 2 == out.returncode and "--home is empty" in one_line(out.stderr)
        assert before == stat.S_IMODE(ROOT.stat().st_mode)
        assert not (ROOT / "credentials.enc").exists() and not (ROOT / "daemon.lock").exists()

    @pytest.mark.parametrize("command", COMMANDS, ids=IDS)
    def test_home_is_a_file(self, sandbox: Sandbox, command: tuple[str, ...]) -> None:
        target = sandbox.root / "a-file"
        target.write_text("precious")
        out = self.run(sandbox, str(target), *command)
        assert 2 == out.returncode and "is not a directory" in one_line(out.stderr)
        assert "precious" == target.read_text()

    @pytest.mark.parametrize("command", COMMANDS, ids=IDS)
    def test_home_is_a_symlink(self, sandbox: Sandbox, command: tuple[str, ...]) -> None:
        """A symlink could be repointed under the vault: refused, naming its target."""
        real = sandbox.root / "real"
        real.mkdir(mode=0o700)
        link = sandbox.root / "link"
        link.symlink_to(real)
        out = self.run(sandbox, str(link), *command)
        assert 2 == out.returncode and f"is a symlink (to {real})" in one_line(out.stderr)
        assert [] == list(real.iterdir())

    @pytest.mark.parametrize("command", COMMANDS, ids=IDS)
    def test_world_writable_home_of_someone_else(self, sandbox: Sandbox, command: tuple[str, ...]) -> None:
        """A 0777 directory owned by another user: refused, and its mode left alone."""
        if os.geteuid() != 0:
            pytest.skip("needs root to make a directory owned by another user")
        shared = sandbox.root / "shared"
        shared.mkdir()
        os.chown(shared, 65534, 65534)
        os.chmod(shared, 0o777)
        out = self.run(sandbox, str(shared), *command)
        assert 2 == out.returncode and "belongs to uid 65534" in one_line(out.stderr)
        assert 0o777 == stat.S_IMODE(shared.stat().st_mode) and [] == list(shared.iterdir())

    @pytest.mark.parametrize("command", COMMANDS, ids=IDS)
    def test_open_home_of_ours_is_not_chmodded(self, sandbox: Sandbox, command: tuple[str, ...]) -> None:
        """Our own 0755 directory is refused with the chmod to run, never chmod'ed for us."""
        mine = sandbox.root / "mine"
        mine.mkdir()
        os.chmod(mine, 0o755)
        out = self.run(sandbox, str(mine), *command)
        assert 2 == out.returncode and f"chmod 700 {mine}" in one_line(out.stderr)
        assert 0o755 == stat.S_IMODE(mine.stat().st_mode) and [] == list(mine.iterdir())

    def test_shared_tmp_is_not_advised_to_be_chmodded(self, sandbox: Sandbox) -> None:
        """For a sticky world-writable directory the advice is a new directory, not chmod."""
        out = self.run(sandbox, "/tmp", "secret", "list")
        assert 2 == out.returncode
        assert "chmod" not in one_line(out.stderr) and "/tmp/vaultsim" in out.stderr
        assert 0o1777 == stat.S_IMODE(Path("/tmp").stat().st_mode)

    @pytest.mark.parametrize("system_dir", ["/", "/usr", str(Path.home())])
    def test_system_or_home_dir_is_not_advised_to_be_chmodded(self, sandbox: Sandbox, system_dir: str) -> None:
        """`--home /` (or /usr, or ~): closing it to others would break the machine; the advice is a new
        directory inside it."""
        if stat.S_IMODE(Path(system_dir).stat().st_mode) & 0o077 == 0 or Path(system_dir).stat().st_uid != os.getuid():
            pytest.skip(f"{system_dir} is not ours, or is closed to others, here")
        before = stat.S_IMODE(Path(system_dir).stat().st_mode)
        out = self.run(sandbox, system_dir, "secret", "list")
        assert 2 == out.returncode
        assert "chmod" not in one_line(out.stderr) and str(Path(system_dir) / "vaultsim") in out.stderr
        assert before == stat.S_IMODE(Path(system_dir).stat().st_mode)

    def test_home_the_vault_creates_works(self, sandbox: Sandbox) -> None:
        """The checks refuse nothing the vault made itself: a new home, then reuse of it."""
        sandbox.set_secret("A", "alpha")
        out = sandbox.vaultsim("secret", "list")
        assert 0 == out.returncode and "A" in out.stdout
        assert 0o700 == stat.S_IMODE(sandbox.home.stat().st_mode)


class TestDaemonStartErrors:
    @pytest.mark.parametrize("mode", [["--foreground"], []], ids=["foreground", "background"])
    def test_socket_path_too_long(self, sandbox: Sandbox, mode: list[str]) -> None:
        """A home too deep for AF_UNIX: one line with the limit, exit 2, nothing created."""
        deep = sandbox.root / ("d" * 100)
        out = sandbox.vaultsim("daemon", *mode, "--home", str(deep), timeout=60)
        assert 2 == out.returncode
        line = one_line(out.stderr)
        assert "approver.sock" in line or "agent.sock" in line
        assert "allows 107" in line and "shorter --home" in line
        assert not deep.exists()

    @pytest.mark.parametrize("mode", [["--foreground"], []], ids=["foreground", "background"])
    def test_invalid_regex_in_catalog(self, sandbox: Sandbox, mode: list[str]) -> None:
        """A catalog pattern that does not compile stops the start, naming the operation
        and the parameter (it used to fail only at the first call)."""
        catalog = sandbox.write("bad-catalog.yaml", BAD_REGEX_CATALOG)
        out = sandbox.vaultsim("daemon", *mode, "--catalog", str(catalog), timeout=60)
        assert 2 == out.returncode
        line = one_line(out.stderr)
        assert "operations.read_thing.params.thing_id.pattern" in line
        assert "invalid regular expression" in line
        assert sandbox.status() is None
