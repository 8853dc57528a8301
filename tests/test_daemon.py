"""The daemon process: one per home, private sockets, peer identity, stop/status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, Sandbox, stop_process, wait_for


class TestStartup:
    def test_home_and_sockets_are_private(self, sandbox: Sandbox) -> None:
        """The home is 0700 and both sockets 0600."""
        sandbox.start_daemon()
        assert stat.S_IMODE(sandbox.home.stat().st_mode) == 0o700
        for name in ("agent.sock", "approver.sock", "approver.token"):
            mode = stat.S_IMODE((sandbox.home / name).stat().st_mode)
            assert mode == 0o600, name

    def test_second_daemon_on_same_home_is_refused(self, sandbox: Sandbox) -> None:
        """A second daemon fails with a message naming the running one."""
        first = sandbox.start_daemon()
        out = sandbox.vaultsim("daemon", "--foreground", timeout=30)
        assert out.returncode == 1
        assert f"already serves {sandbox.home}" in out.stderr
        assert f"pid {first.pid}" in out.stderr
        assert sandbox.status()["pid"] == first.pid

    def test_failed_background_start_shows_only_its_own_error(self, sandbox: Sandbox) -> None:
        """A bad file: exit 2 with this attempt's reason, not an older one from the same log."""
        first = sandbox.vaultsim("daemon", "--policy", str(sandbox.root / "missing-policy.yaml"), timeout=60)
        assert 2 == first.returncode and "missing-policy.yaml" in first.stderr
        broken = sandbox.root / "broken.yaml"
        broken.write_text("rules: [\n")
        second = sandbox.vaultsim("daemon", "--catalog", str(broken), timeout=60)
        assert 2 == second.returncode
        assert "broken.yaml" in second.stderr and "missing-policy.yaml" not in second.stderr
        assert sandbox.status() is None

    def test_remote_that_is_not_a_url_is_refused(self, sandbox: Sandbox) -> None:
        out = sandbox.vaultsim("daemon", "--remote", "127.0.0.1:8080", timeout=30)
        assert 2 == out.returncode and "not an http:// or https:// URL" in out.stderr
        config = sandbox.root / "config.yaml"
        config.write_text('services:\n  tracker: {url: "tracker.local"}\n')
        out = sandbox.vaultsim("daemon", "--config", str(config), timeout=60)
        assert 2 == out.returncode
        assert "services.tracker.url" in out.stderr and "not an http:// or https:// URL" in out.stderr
        assert sandbox.status() is None

    def test_stale_socket_from_killed_daemon_is_recovered(self, sandbox: Sandbox) -> None:
        """After SIGKILL the sockets remain; the next daemon removes them and serves."""
        first = sandbox.start_daemon()
        stop_process(first, signal.SIGKILL)
        assert sandbox.agent_sock.exists()
        second = sandbox.start_daemon()
        assert sandbox.status()["pid"] == second.pid

    def test_non_socket_at_socket_path_is_not_removed(self, sandbox: Sandbox) -> None:
        """A regular file where a socket should be is left alone and reported: an unusable home,
        exit 2 (README), as for every file of the home of the wrong kind."""
        sandbox.home.mkdir(mode=0o700)
        sandbox.agent_sock.write_text("precious")
        out = sandbox.vaultsim("daemon", "--foreground", "--unlocked", timeout=30)
        assert out.returncode == 2
        assert "is not a socket" in out.stderr
        assert sandbox.agent_sock.read_text() == "precious"

    @pytest.mark.parametrize("name", ["audit.log", "audit.key", "audit.pub", "audit.head", "audit.000000001000.log",
                                      "daemon.pid", "approver.token", "credentials.enc", "approver.sock"])
    @pytest.mark.parametrize("kind", ["directory", "FIFO"])
    def test_a_home_file_of_the_wrong_kind_is_an_unusable_home(self, sandbox: Sandbox, name: str,
                                                               kind: str) -> None:
        """A directory or FIFO where the daemon keeps one of its files: it cannot start, exit 2
        with one line naming the file (foreground and background alike), nothing written, the
        file left as found. Before, the audit files, the token and the sockets said 1, the pid
        file 2, and a FIFO pid file was replaced."""
        sandbox.home.mkdir(mode=0o700)
        path = sandbox.home / name
        path.mkdir() if kind == "directory" else os.mkfifo(path)
        for args in (("--foreground",), ()):
            out = sandbox.vaultsim("daemon", *args, "--unlocked", timeout=60)
            assert 2 == out.returncode, (args, out.stderr)
            assert str(path) in out.stderr and "Traceback" not in out.stderr, out.stderr
            assert (stat.S_ISDIR if kind == "directory" else stat.S_ISFIFO)(path.lstat().st_mode)
        assert not (sandbox.home / "daemon.pid").is_file() and not sandbox.agent_sock.exists()
        assert sandbox.status() is None


class TestStatusAndStop:
    def test_status_json_names_keyring_backend(self, sandbox: Sandbox) -> None:
        """`status --json` reports running, lock state and the keyring backend in use."""
        out = sandbox.vaultsim("status", "--json")
        assert out.returncode == 1
        assert json.loads(out.stdout)["running"] is False
        sandbox.vaultsim("daemon", check=True)  # background mode returns once serving
        out = sandbox.vaultsim("status", "--json")
        data = json.loads(out.stdout)
        assert out.returncode == 2  # running, but locked (`vault status` answers sealed the same way)
        assert data["running"] is True
        assert data["locked"] is True  # the daemon starts locked unless told otherwise
        assert "embedded" in data["keyring_backend"]
        stopped = sandbox.vaultsim("stop")
        assert stopped.returncode == 0, stopped.stderr
        assert not sandbox.agent_sock.exists()
        assert not (sandbox.home / "approver.sock").exists()
        assert sandbox.vaultsim("status").returncode == 1

    def test_status_shows_audit_size_and_free_space(self, sandbox: Sandbox) -> None:
        sandbox.start_daemon()
        data = json.loads(sandbox.vaultsim("status", "--json").stdout)
        assert data["audit_log_bytes"] == (sandbox.home / "audit.log").stat().st_size > 0
        assert data["disk_free_bytes"] > 0
        assert "free on its disk" in sandbox.vaultsim("status").stdout

    def test_status_warns_when_the_disk_is_nearly_full(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
        """A full disk stops the audit log and every call: status says so before it happens.
        (No real nearly-full disk here: the free-space reading stands in.)"""
        from types import SimpleNamespace

        from vault.cli.main import main
        monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(free=100 << 20, total=1 << 40))
        assert 1 == main(["status", "--home", str(tmp_path / "home")])
        out = capsys.readouterr().out
        assert "100.0 MiB free on its disk" in out and "WARNING: the disk is nearly full" in out

    def test_sigterm_removes_sockets(self, sandbox: Sandbox) -> None:
        """SIGTERM stops the daemon cleanly: exit 0, sockets gone."""
        proc = sandbox.start_daemon()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert not sandbox.agent_sock.exists()

    def test_sighup_stops_a_foreground_daemon_as_sigterm_does(self, sandbox: Sandbox) -> None:
        """The terminal of a foreground daemon closed (SIGHUP): it stops cleanly, exit 0, sockets
        gone, and its audit log ends signed (`intact`), not cut off for the next start to recover."""
        from vault.audit import verify
        proc = sandbox.start_daemon()
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=15) == 0
        assert not sandbox.agent_sock.exists()
        report = verify(sandbox.home / "audit.log")
        assert report.status == "intact", report


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a client as another uid")
class TestPeerIdentity:
    def test_client_with_another_uid_is_refused(self, sandbox: Sandbox) -> None:
        """A peer running as nobody (given the capability to reach the socket) is refused by uid."""
        sandbox.start_daemon()
        # the daemon answers a foreign uid at once, before reading: just listen
        client = (
            "import socket,sys;s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);"
            "print(s.recv(4096).decode())"
        )
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "--inh-caps=+dac_override,+dac_read_search", "--ambient-caps=+dac_override,+dac_read_search",
             PY, "-c", client, str(sandbox.agent_sock)],
            capture_output=True, text=True, timeout=30, cwd="/")
        assert out.returncode == 0, out.stderr
        reply = json.loads(out.stdout)
        assert reply["error"]["code"] == -32001
        assert "another user" in reply["error"]["message"]
        assert "result" not in reply


class TestGracefulStop:
    def test_in_flight_call_is_answered_on_sigterm(self, sandbox: Sandbox) -> None:
        """A call waiting on an approval when SIGTERM arrives gets a Result, not a dropped socket."""
        proc = sandbox.start_daemon()
        sandbox.start_approver([{"match": {}, "decide": "ignore"}])
        plan = sandbox.write("plan.yaml", {"agent": "stub", "steps": [
            {"call": "create_issue", "params": {"title": "in flight"}}]})
        env = {**sandbox.env, "VAULTSIM_SOCKET": str(sandbox.agent_sock)}
        agent = subprocess.Popen([PY, "-m", "agent_stub", "--plan", str(plan)], env=env, cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: (sandbox.status() or {}).get("pending") == 1, what="the call to wait on approval")
        proc.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=30)
        result = json.loads(out.splitlines()[0])
        assert result["category"] == "approval_denied"
        assert "stopped" in result["message"]
        assert proc.wait(timeout=15) == 0
        assert not sandbox.agent_sock.exists()
