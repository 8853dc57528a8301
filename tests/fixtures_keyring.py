"""Test fixtures for keyrings: a real, private Secret Service and isolated dirs.

`secret_service_session(root)` starts a private D-Bus session bus and an
unlocked gnome-keyring in it, with a throwaway HOME/XDG dirs, so tests use a
real Secret Service and never touch the user's keyring:

1. `dbus-daemon --nofork --print-address` with a minimal config written here:
   a session bus on a socket under `root`, with no service directories, so
   nothing is auto-activated behind our back (no second gnome-keyring, no GUI
   prompter: a prompt fails at once instead of hanging).
2. `gnome-keyring-daemon --foreground --unlock --components=secrets` with a
   single newline as the password on stdin. `--unlock` creates the "login"
   collection when it does not exist and makes it the default alias, so
   secretstorage never needs the (GUI) prompt that creating a collection asks
   for. An empty stdin would mean "no password" and create nothing.
3. Readiness is polled with a deadline: the default collection exists and is
   unlocked. Both processes are our direct children (`--nofork`,
   `--foreground`), terminated and reaped on exit.

Run any command inside one (what `.ci/run` can reuse):
    python tests/fixtures_keyring.py -- pytest -m secret_service
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GNOME_KEYRING = shutil.which("gnome-keyring-daemon")
DBUS_DAEMON = shutil.which("dbus-daemon")
SKIP_REASON = "gnome-keyring-daemon is not installed (apt-get install gnome-keyring dbus)"
ROOT = Path(__file__).resolve().parent.parent
skip_without_gnome_keyring = pytest.mark.skipif(GNOME_KEYRING is None, reason=SKIP_REASON)
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


@dataclass
class SecretServiceSession:
    root: Path
    address: str
    # what a child process needs to use this Secret Service (and only it)
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def keyring_files_dir(self) -> Path:
        return Path(self.env["XDG_DATA_HOME"]) / "keyrings"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _read_line(proc: subprocess.Popen[bytes], deadline: float) -> str:
    """First stdout line of `proc`, or RuntimeError at the deadline."""
    assert proc.stdout is not None
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise RuntimeError(f"dbus-daemon gave no address (exit {proc.poll()})")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.2))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                continue
            buf += chunk
    return buf.split(b"\n", 1)[0].decode().strip()


def _default_collection_ready(address: str) -> bool:
    from jeepney.io.blocking import open_dbus_connection
    from secretstorage import Collection, check_service_availability
    from secretstorage.exceptions import SecretStorageException

    try:
        with contextlib.closing(open_dbus_connection(bus=address)) as conn:
            if not check_service_availability(conn):
                return False
            return not Collection(conn).is_locked()  # default alias
    except (SecretStorageException, OSError, ConnectionError):
        return False


@contextlib.contextmanager
def secret_service_session(timeout: float = 20.0) -> Iterator[SecretServiceSession]:
    """A private D-Bus session with an unlocked gnome-keyring; all torn down after."""
    if GNOME_KEYRING is None:
        raise RuntimeError(SKIP_REASON)
    if DBUS_DAEMON is None:
        raise RuntimeError("dbus-daemon is not installed (apt-get install dbus)")
    # short path: AF_UNIX socket paths are limited to ~108 bytes
    root = Path(tempfile.mkdtemp(prefix="vs-ss-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        run = root / "run"
        for d in ("run", "home", "data", "config", "cache"):
            (root / d).mkdir(mode=0o700)
        conf = root / "bus.conf"
        conf.write_text(BUS_CONFIG.format(socket=run / "bus"))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root / "home"),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_CACHE_HOME": str(root / "cache"),
            "XDG_RUNTIME_DIR": str(run),
        }
        deadline = time.monotonic() + timeout
        bus = subprocess.Popen(
            [DBUS_DAEMON, f"--config-file={conf}", "--nofork", "--print-address"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
        )
        procs.append(bus)
        address = _read_line(bus, deadline)
        env["DBUS_SESSION_BUS_ADDRESS"] = address
        log = open(root / "gnome-keyring.log", "wb")
        with log:
            keyring_daemon = subprocess.Popen(
                [GNOME_KEYRING, "--foreground", "--unlock", "--components=secrets"],
                stdin=subprocess.PIPE, stdout=log, stderr=log, env=env, start_new_session=True,
            )
        procs.append(keyring_daemon)
        assert keyring_daemon.stdin is not None
        keyring_daemon.stdin.write(b"\n")  # the login password: a throwaway empty line
        keyring_daemon.stdin.close()
        while not _default_collection_ready(address):
            if keyring_daemon.poll() is not None or time.monotonic() > deadline:
                detail = (root / "gnome-keyring.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"gnome-keyring did not become ready: {detail}")
            time.sleep(0.05)  # poll interval, bounded by the deadline above
        yield SecretServiceSession(root=root, address=address, env=env, procs=procs)
    finally:
        for proc in reversed(procs):  # keyring first, then its bus
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


# --- pytest fixtures ---------------------------------------------------------


@pytest.fixture(scope="session")
def secret_service() -> Iterator[SecretServiceSession]:
    """One private gnome-keyring for the test session; skipped only if not installed."""
    if GNOME_KEYRING is None:
        pytest.skip(SKIP_REASON)
    with secret_service_session() as session:
        yield session


@pytest.fixture
def secret_service_env(
    secret_service: SecretServiceSession,
    isolated_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> SecretServiceSession:
    """Point this process's D-Bus clients (secretstorage) at the private session."""
    # after isolated_env, which clears any inherited D-Bus address
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", secret_service.address)
    return secret_service


@pytest.fixture
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Vault home and embedded keyring in tmp dirs; the env a child process gets.

    The child env has no D-Bus address and a throwaway HOME/XDG config, so
    keyring's own config file and the user's keyring are never read.
    """
    dirs = {name: tmp_path / name for name in ("home", "keyring", "user", "config")}
    monkeypatch.setenv("VAULTSIM_HOME", str(dirs["home"]))
    monkeypatch.setenv("VAULTSIM_KEYRING_DIR", str(dirs["keyring"]))
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(dirs["user"]),
        "XDG_CONFIG_HOME": str(dirs["config"]),
        "XDG_DATA_HOME": str(dirs["user"] / "data"),
        "VAULTSIM_HOME": str(dirs["home"]),
        "VAULTSIM_KEYRING_DIR": str(dirs["keyring"]),
        "PYTHONPATH": str(ROOT),
        "PYTHON_KEYRING_BACKEND": "vault.store.keyring_backend.FileKeyring",
    }


def main(argv: list[str]) -> int:
    """`python tests/fixtures_keyring.py -- CMD...`: run CMD inside a private Secret Service."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(main.__doc__, file=sys.stderr)
        return 2
    with secret_service_session() as session:
        env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": session.address}
        return subprocess.call(argv, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
