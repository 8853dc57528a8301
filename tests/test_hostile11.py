"""Eleventh hostile pass: files of the vault home that are not what they should be, approvers
that reconnect in a storm, and the daemon beside them.

Real processes only: a daemon with its fake remote, raw lines on its real sockets.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from helpers import Sandbox, new_sandbox, stop_process, wait_for
from hostile_fixtures import run_script, setup

CALL = "client.open_session('a', 'run-1')\nout(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = new_sandbox()
    try:
        yield box
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


class TestAPidFileThatIsADirectory:
    @pytest.mark.parametrize("mode", [["--foreground"], []], ids=["foreground", "background"])
    def test_the_start_is_refused_in_one_line_exit_2(self, sandbox: Sandbox, mode: list[str]) -> None:
        """`daemon.pid` is a directory (a botched restore, a stray mkdir): the start said why, then
        its cleanup tried to unlink the directory and ended in a traceback, exit 3."""
        sandbox.set_secret("tracker_token", "a-value")
        (sandbox.home / "daemon.pid").mkdir()
        out = sandbox.vaultsim("daemon", *mode, "--unlocked")
        assert 2 == out.returncode, out.stderr
        assert "Traceback" not in out.stderr and 1 == len(out.stderr.strip().splitlines()), out.stderr
        assert "cannot start" in out.stderr and "daemon.pid: Is a directory" in out.stderr
        assert not sandbox.agent_sock.exists()
        assert (sandbox.home / "daemon.pid").is_dir()  # left as found

    def test_one_made_while_serving_does_not_spoil_the_stop(self, sandbox: Sandbox) -> None:
        """The pid file is replaced by a directory while the daemon serves: it stops cleanly at
        SIGTERM (exit 0, its log signed), with no traceback."""
        setup(sandbox)
        assert "success" == run_script(sandbox, CALL)[0]["category"]
        pid_file = sandbox.home / "daemon.pid"
        pid_file.unlink()
        pid_file.mkdir()
        daemon = next(p for p in sandbox.procs if "daemon" in p.args)
        stop_process(daemon)
        assert 0 == daemon.returncode
        assert "Traceback" not in (sandbox.root / "daemon.stderr").read_text()
        assert "intact" == sandbox.vaultsim("audit", "verify").stdout.split(":")[0]
