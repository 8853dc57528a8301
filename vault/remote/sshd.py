"""A real OpenSSH server on loopback, for tests and the scenario runner.

Why a real sshd: the SSH executor's interesting behaviour (host key checks,
publickey refusal, what happens to remote work when the client dies) lives in
OpenSSH itself; a fake server would only test our guesses about it.

`SshdServer(tmpdir).start()` generates a host key and a client key, writes a
config that needs no root privileges beyond what it already has (works as
root and as an ordinary user), starts `sshd -D` on a free 127.0.0.1 port,
waits until it answers with an SSH banner (deadline, no fixed sleep) and
returns an `SshdInfo`: where to connect, the known_hosts file, the client
private key text, and a small fake "host" whose `restart` program records
each restart in a state file. `stop()` kills sshd and every process started
through it, including work that detached itself with setsid/nohup (found by
an environment tag that sshd sets in every session).

Plain class, no pytest dependency, so the scenario runner can reuse it.

The `restart` program (on PATH in every session via sshd's `SetEnv`):

    restart NAME
        appends NAME to <state>/restarts.log and exits 0, unless
        <state>/fail-NAME exists: then exits with the code written in it;
        <state>/hold-NAME exists: first waits (polling, 60 s cap) until
        <state>/go-NAME appears, so a test can act while it is in flight.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SSHD = "/usr/sbin/sshd"  # sshd refuses to start unless run by absolute path
PRIVSEP_DIR = Path("/run/sshd")  # required when sshd runs as root

RESTART_SCRIPT = """#!/bin/sh
# Test stand-in for a service restart: records it, can fail or be held.
state={state}
name=${{1:-}}
case "$name" in ''|*/*) echo "restart: bad service name" >&2; exit 2;; esac
if [ -e "$state/hold-$name" ]; then
    : > "$state/holding-$name"
    n=0
    while [ ! -e "$state/go-$name" ]; do
        n=$((n + 1))
        if [ "$n" -gt 1200 ]; then echo "restart: hold timed out" >&2; exit 4; fi
        sleep 0.05
    done
fi
if [ -e "$state/fail-$name" ]; then
    code=$(cat "$state/fail-$name")
    echo "restart: $name failed" >&2
    exit "${{code:-1}}"
fi
printf '%s\\n' "$name" >> "$state/restarts.log"
echo "restarted $name"
"""


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen") is not None


def new_client_key() -> tuple[str, str]:
    """A fresh ed25519 key pair: (OpenSSH private key text, public key line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return private, public


@dataclass(frozen=True)
class SshdInfo:
    host: str
    port: int
    user: str
    known_hosts: str  # trusts exactly this server's host key
    private_key: str  # OpenSSH private key text authorised for `user`
    public_key: str
    state_dir: str  # the fake host's state: restarts.log, hold-/go-/fail- files
    markers_dir: str  # a markers dir inside the tmp tree, for the executor
    log_file: str  # sshd's own log (LogLevel VERBOSE)
    pid: int

    @property
    def restarts_log(self) -> str:
        return os.path.join(self.state_dir, "restarts.log")

    def service_options(self) -> dict[str, object]:
        return {"markers_dir": self.markers_dir}

    def service_fields(self) -> dict[str, object]:
        """Keyword arguments for vault's ServiceConfig (plus its `name`)."""
        return {"host": self.host, "port": self.port, "user": self.user,
                "known_hosts": self.known_hosts, "options": self.service_options()}

    # -- controlling the fake `restart` program --------------------------------

    def restarts(self) -> list[str]:
        try:
            return Path(self.restarts_log).read_text().splitlines()
        except FileNotFoundError:
            return []

    def hold(self, name: str) -> None:
        Path(self.state_dir, f"hold-{name}").touch()

    def release(self, name: str) -> None:
        Path(self.state_dir, f"go-{name}").touch()

    def fail(self, name: str, code: int = 1) -> None:
        Path(self.state_dir, f"fail-{name}").write_text(str(code))


class SshdError(RuntimeError):
    pass


class SshdServer:
    """Start/stop one sshd in `tmpdir`. Usable as a context manager."""

    def __init__(self, tmpdir: str | os.PathLike[str], *, start_timeout: float = 15.0) -> None:
        self.dir = Path(tmpdir).resolve()
        self.start_timeout = start_timeout
        self.tag = f"vaultsim-sshd-{os.getpid()}-{time.monotonic_ns()}"
        self.info: SshdInfo | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SshdInfo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SshdInfo:
        if not sshd_available():
            raise SshdError(f"{SSHD} or ssh-keygen not installed")
        if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.dir.mkdir(exist_ok=True)  # in a home that exists: one removed meanwhile is never made again
        host_key = self.dir / "ssh_host_ed25519_key"
        if not host_key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vaultsim-test-host",
                 "-f", str(host_key)],
                check=True, stdin=subprocess.DEVNULL, capture_output=True,
            )
        private, public = new_client_key()
        (self.dir / "authorized_keys").write_text(public + "\n")
        state = self.dir / "state"
        bindir = self.dir / "bin"
        markers = self.dir / "markers"
        for d in (state, bindir):
            d.mkdir(exist_ok=True)
        restart = bindir / "restart"
        restart.write_text(RESTART_SCRIPT.format(state=shlex.quote(str(state))))
        restart.chmod(0o755)
        user = psutil.Process().username()
        log = self.dir / "sshd.log"

        # a freshly picked free port can be taken before sshd binds it: retry
        last = ""
        for _ in range(5):
            port = _free_port()
            config = self.dir / "sshd_config"
            config.write_text(self._config(port, host_key, bindir))
            log.write_text("")
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-f", str(config), "-E", str(log)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._wait_ready(port):
                break
            last = log.read_text(errors="replace")[-2000:]
            self._kill_all()
        else:
            raise SshdError(f"sshd did not start: {last}")

        host_pub = (self.dir / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts = self.dir / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        self.info = SshdInfo(
            host="127.0.0.1", port=port, user=user, known_hosts=str(known_hosts),
            private_key=private, public_key=public, state_dir=str(state),
            markers_dir=str(markers), log_file=str(log), pid=self._proc.pid,
        )
        return self.info

    def _config(self, port: int, host_key: Path, bindir: Path) -> str:
        path = f"{bindir}:/usr/local/bin:/usr/bin:/bin"
        return "\n".join([
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {host_key}",
            f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "UseDNS no",
            "PrintMotd no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "LogLevel VERBOSE",
            "MaxStartups 64",
            # the fake host's programs on PATH, and a tag to find every process
            # started through this server at stop (detached work included)
            f"SetEnv PATH={path} VAULTSIM_SSHD_TAG={self.tag}",
            "",
        ])

    def _wait_ready(self, port: int) -> bool:
        """Poll until sshd sends its banner; False if it exited or the deadline passed."""
        deadline = time.monotonic() + self.start_timeout
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                    s.settimeout(max(0.1, deadline - time.monotonic()))
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return True
            except OSError:
                pass
            # sshd binds within milliseconds; this only paces the poll loop
            time.sleep(0.02)
        return False

    def session_processes(self) -> list[psutil.Process]:
        """Every live process started through this sshd, detached ones too."""
        found: dict[int, psutil.Process] = {}
        if self._proc is not None:
            try:
                for p in psutil.Process(self._proc.pid).children(recursive=True):
                    found[p.pid] = p
            except psutil.NoSuchProcess:
                pass
        needle = self.tag
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            try:
                if p.environ().get("VAULTSIM_SSHD_TAG") == needle:
                    found[p.pid] = p
            except (psutil.Error, OSError):
                continue
        return list(found.values())

    def stop(self) -> None:
        self._kill_all()
        self.info = None

    def _kill_all(self) -> None:
        procs = self.session_processes()
        if self._proc is not None:
            try:
                procs.append(psutil.Process(self._proc.pid))
            except psutil.NoSuchProcess:
                pass
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        _wait_dead(procs, timeout=5.0)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None


def _wait_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Wait until each process is gone or a zombie.

    A killed orphan is reaped by whatever init the machine has, sometimes
    seconds later (container inits poll); a zombie runs nothing, so it counts
    as dead here.
    """
    deadline = time.monotonic() + timeout
    for p in procs:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # an AF_INET address is (host, port)
        return port


def refused_port() -> int:
    """A loopback port with nothing listening (picked, then closed)."""
    return _free_port()


def is_private_file(path: str) -> bool:
    st = os.stat(path)
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
