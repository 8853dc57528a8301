"""The vault home: one private directory per vault, and the names inside it.

Resolution order: explicit `--home`, `$VAULTSIM_HOME`, platformdirs. The
directory is 0700; everything secret inside it is 0600 and written all or
nothing (vault.atomic). An existing directory is used only if it is a real
directory, ours and closed to others: the vault never chmods a directory it
did not create.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from vault import atomic
from vault.atomic import UnsafeDirectory, check_private_dir, private_dir
from vault.errors import BadInput, HomeError

# bytes of a Unix socket path, without the final NUL: sun_path is 108 on Linux, 104 elsewhere
MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103


@dataclass(frozen=True)
class VaultHome:
    root: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> "VaultHome":
        if home is not None and not os.fspath(home).strip():
            # Path("") is the current directory: never make that a vault home by accident
            raise BadInput("--home is empty: give the vault home directory")
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
        """Create the home 0700, or check an existing one is private and ours.

        An existing directory is never chmod'ed: one that is a symlink, someone
        else's or open to others is refused, with the reason and the fix."""
        try:
            private_dir(self.root, "vault home")
        except UnsafeDirectory as exc:
            raise UnusableHome(str(exc)) from None
        except OSError as exc:
            raise UnusableHome(f"cannot create vault home {self.root}: {exc.strerror}") from None
        return self

    def check(self) -> "VaultHome":
        """For commands that only read: a home that exists must pass ensure()'s checks."""
        try:
            check_private_dir(self.root, "vault home")
        except FileNotFoundError:
            pass
        except UnsafeDirectory as exc:
            raise UnusableHome(str(exc)) from None
        except OSError as exc:
            raise UnusableHome(f"cannot use vault home {self.root}: {exc.strerror}") from None
        return self

    def check_socket_paths(self) -> None:
        """The daemon's sockets must fit in sun_path, or bind fails deep inside asyncio."""
        for path in (self.agent_sock, self.approver_sock):
            size = len(os.fsencode(path))
            if size > MAX_SOCKET_PATH:
                raise UnusableHome(
                    f"vault home {self.root} is too deep for its sockets: {path} is {size} bytes and "
                    f"this platform allows {MAX_SOCKET_PATH}; use a shorter --home")


class UnusableHome(HomeError, BadInput):
    """A vault home that cannot be used as given: bad input (exit 2), not a failure."""


# the one writer of private files (temp file, fsync, rename, directory fsync); kept
# importable from here, where the audit log and the daemon have always found it
write_private = atomic.write_private


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on a 0600 lock file (writers of a replaced-by-rename file
    serialise on a separate lock file, since the data file's inode changes). A lock file
    that cannot be opened (a read-only or full file system) is a HomeError naming it: the
    command says why in one line, never in a traceback."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise HomeError(f"cannot open the lock file {path}: {exc.strerror or type(exc).__name__}; "
                        "nothing was changed") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock
