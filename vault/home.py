"""The vault home: one private directory per vault, and the names inside it.

Resolution order: explicit `--home`, `$VAULTSIM_HOME`, platformdirs. The
directory is 0700; everything secret inside it is 0600.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .errors import HomeError


@dataclass(frozen=True)
class VaultHome:
    root: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> "VaultHome":
        if home is None:
            home = os.environ.get("VAULTSIM_HOME") or platformdirs.user_data_dir("vaultsim")
        return cls(Path(home).expanduser().absolute())

    # file names (stable: tests and tools read them)
    @property
    def agent_sock(self) -> Path:
        return self.root / "agent.sock"

    @property
    def approver_sock(self) -> Path:
        return self.root / "approver.sock"

    @property
    def lock_file(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def pid_file(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def approver_token_file(self) -> Path:
        return self.root / "approver.token"

    @property
    def credentials_file(self) -> Path:
        return self.root / "credentials.enc"

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.log"

    @property
    def diagnostics_dir(self) -> Path:
        return self.root / "diagnostics"

    @property
    def config_file(self) -> Path:
        return self.root / "config.yaml"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    def ensure(self) -> "VaultHome":
        """Create the home 0700, or check an existing one is private and ours."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.root.stat()
        except OSError as exc:
            raise HomeError(f"cannot create vault home {self.root}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise HomeError(f"vault home {self.root} is not a directory")
        if st.st_uid != os.getuid():
            raise HomeError(f"vault home {self.root} belongs to another user")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(self.root, 0o700)
        return self


def write_private(path: Path, data: bytes) -> None:
    """Atomically write a 0600 file (temp file + rename, fsync'd)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on a 0600 lock file (writers of a replaced-by-rename file
    serialise on a separate lock file, since the data file's inode changes)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock
