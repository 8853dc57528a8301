"""vaultsim's embedded keyring: a small file store so the vault works headless.

Registered with keyring through the `keyring.backends` entry point; loading
this module defines `FileKeyring`, which keyring's backend registry picks up.
Its priority (1) ranks it below every native store (Secret Service 5, KWallet
4.9, libsecret 4.8, macOS/Windows 5) and above keyring's `fail` backend (0), so
a desktop keeps using its keyring while a CI box or server still has one.

Storage: one JSON file `keyring.json` (0600, written all or nothing by
vault.atomic) in a 0700 directory that is ours (an existing one open to
others, someone else's or a symlink is refused, never chmod'ed),
`$VAULTSIM_KEYRING_DIR` or platformdirs' user data dir "vaultsim-keyring" —
deliberately outside any vault home, so a copied home carries no key. Writers
hold an flock on a separate lock file (the data file is replaced by rename, so
locking it would lock a stale inode); readers need no lock because every write
is a whole-file atomic rename. Values are never put in an exception message.

Force it with `PYTHON_KEYRING_BACKEND=vault.store.keyring_backend.FileKeyring`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import platformdirs
from keyring.backend import KeyringBackend
from keyring.compat import properties
from keyring.credentials import SimpleCredential
from keyring.errors import KeyringError, PasswordDeleteError, PasswordSetError

from vault import regular
from vault.atomic import UnsafeDirectory, check_private_dir, failure, private_dir, write_private
from vault.home import exclusive_lock

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

ENV_DIR = "VAULTSIM_KEYRING_DIR"
FILE_NAME = "keyring.json"
LOCK_NAME = "keyring.lock"
FORMAT = "vaultsim-keyring/1"


def default_dir() -> Path:
    """Where the embedded keyring lives, resolved at each call (tests move it)."""
    env = os.environ.get(ENV_DIR)
    return Path(env or platformdirs.user_data_dir("vaultsim-keyring")).expanduser().absolute()


class FileKeyring(KeyringBackend):
    """vaultsim file keyring (embedded)"""

    name = "vaultsim file keyring (embedded)"

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # keyring leaves KeyringBackend.__init__ unannotated
        self._directory = Path(directory).absolute() if directory is not None else None

    @properties.classproperty
    def priority(cls) -> float:
        if fcntl is None:
            raise RuntimeError("the vaultsim file keyring needs POSIX file locks")
        return 1

    @property
    def directory(self) -> Path:
        return self._directory or default_dir()

    @property
    def path(self) -> Path:
        return self.directory / FILE_NAME

    # --- keyring API -------------------------------------------------------

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(service, {}).get(username)

    def set_password(self, service: str, username: str, password: str) -> None:
        if not isinstance(password, str):
            raise PasswordSetError("password must be a string")
        with self._locked():
            data = self._load()
            data.setdefault(service, {})[username] = password
            self._save(data)

    def delete_password(self, service: str, username: str) -> None:
        with self._locked():
            data = self._load()
            users = data.get(service, {})
            if username not in users:
                raise PasswordDeleteError("no such password in the vaultsim file keyring")
            del users[username]
            if not users:
                del data[service]
            self._save(data)

    def get_credential(self, service: str, username: str | None) -> SimpleCredential | None:
        users = self._load().get(service, {})
        if username is not None:
            password = users.get(username)
            return None if password is None else SimpleCredential(username, password)
        for user, password in users.items():  # keyring's contract: any one of them
            return SimpleCredential(user, password)
        return None

    # --- storage -----------------------------------------------------------

    def _ensure_dir(self) -> Path:
        directory = self.directory
        try:
            private_dir(directory, "keyring directory")
        except UnsafeDirectory as exc:
            raise KeyringError(str(exc)) from None
        except OSError as exc:
            raise KeyringError(f"cannot create keyring directory {directory}: {exc.strerror}") from None
        return directory

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(self._ensure_dir() / LOCK_NAME)

    def _load(self) -> dict[str, dict[str, str]]:
        # a key read from a directory others can write could be one they planted
        try:
            check_private_dir(self.directory, "keyring directory")
        except FileNotFoundError:
            return {}
        except UnsafeDirectory as exc:
            raise KeyringError(str(exc)) from None
        except OSError as exc:
            raise KeyringError(f"cannot read keyring directory {self.directory}: {exc.strerror}") from None
        try:
            raw = _read_regular(self.path)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise KeyringError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            doc: Any = json.loads(raw)
            entries = doc["entries"] if doc.get("format") == FORMAT else None
        except (ValueError, AttributeError, KeyError):
            entries = None
        if not isinstance(entries, dict) or not all(
            isinstance(u, dict) and all(isinstance(p, str) for p in u.values())
            for u in entries.values()
        ):
            # name the file, never echo its content
            raise KeyringError(f"{self.path} is not a valid vaultsim keyring file")
        return entries

    def _save(self, entries: dict[str, dict[str, str]]) -> None:
        data = json.dumps({"format": FORMAT, "entries": entries}).encode()
        try:
            # all or nothing, directory fsync'd: the data key must survive a crash and a full disk
            write_private(self.path, data)
        except OSError as exc:
            raise PasswordSetError(failure(self.path, exc)) from None


def _read_regular(path: Path) -> bytes:
    """A regular file's bytes, opened without blocking: a FIFO put in the keyring file's place
    held `secret list`, `secret set`, `audit show` and `diag show` forever, waiting for a writer."""
    return regular.read_bytes(path)
