"""The credential store: named secrets, encrypted at rest in the vault home.

One file, `credentials.enc` (0600): a JSON envelope `{format, nonce, ct}` where
`ct` is AES-GCM over the whole table (names, values, dates) with the key
`keystore.derive("credentials")`, a fresh 12-byte nonce per write and the
format tag as associated data. Nothing but the envelope is ever on disk.

Every read checks the file (a stat; it is decrypted again only when its
inode, size, mtime or ctime changed), so a `vaultsim secret set` while the
daemon runs takes effect at its next call. Writers serialise on an flock'd
`credentials.lock` and replace the file all or nothing (vault.atomic), so
readers never see half a file and a full disk loses nothing. Values leave
only as `vault.store.secret.Secret`, and no exception, repr or log line carries one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vault.errors import BadInput, CredentialError, MissingCredential
from vault.atomic import failure
from vault.home import VaultHome, exclusive_lock, write_private
from vault.store.keystore import KeyStore
from vault.store.secret import Secret

FORMAT = "vaultsim-credentials/1"
AAD = FORMAT.encode()
LOCK_NAME = "credentials.lock"
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAME_RULE = "1-64 characters from A-Z a-z 0-9 _ . -"


@dataclass(frozen=True)
class CredentialInfo:
    """What may be shown about a credential: never its value."""

    name: str
    created: datetime
    updated: datetime

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "created": self.created.isoformat(), "updated": self.updated.isoformat()}


def check_name(name: Any) -> str:
    # the rejected input is not echoed: it may be a value pasted by mistake
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadInput(f"invalid credential name: use {NAME_RULE}")
    return name


class CredentialStore:
    def __init__(
        self, home: VaultHome, keystore: KeyStore, clock: Callable[[], float] = time.time
    ) -> None:
        self.home = home
        self.keystore = keystore
        self.clock = clock
        # (file signature, decrypted table): saves a read + decrypt on every call
        self._cache: tuple[tuple[int, ...], dict[str, dict[str, Any]]] | None = None
        self._path_str = str(home.credentials_file)

    def __repr__(self) -> str:
        return f"CredentialStore(home={str(self.home.root)!r})"

    @property
    def path(self) -> Path:
        return self.home.credentials_file

    def set(self, name: str, value: str | Secret) -> None:
        check_name(name)
        if isinstance(value, Secret):
            value = value.reveal()
        if not isinstance(value, str):
            raise BadInput("credential value must be text")
        if not value:
            raise BadInput("credential value must not be empty")
        now = self.clock()
        with self._locked():
            table = self._read()
            old = table.get(name)
            table[name] = {"value": value, "created": old["created"] if old else now, "updated": now}
            self._write(table)

    def get(self, name: str) -> Secret:
        check_name(name)
        entry = self._table().get(name)
        if entry is None:
            raise _missing(name)
        return Secret(entry["value"])

    def list(self) -> list[CredentialInfo]:
        return [
            CredentialInfo(name, _dt(entry["created"]), _dt(entry["updated"]))
            for name, entry in sorted(self._read().items())
        ]

    def remove(self, name: str) -> None:
        check_name(name)
        with self._locked():
            table = self._read()
            if name not in table:
                raise _missing(name)
            del table[name]
            self._write(table)

    # --- file format -------------------------------------------------------

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        self.home.ensure()
        return exclusive_lock(self.home.root / LOCK_NAME)

    def _read(self) -> dict[str, dict[str, Any]]:
        """The table (a copy: callers may change it before writing)."""
        return dict(self._table())

    def _table(self) -> dict[str, dict[str, Any]]:
        """The table as on disk now (cached: not to be changed). Runs on every call, so
        it stats a path string: a Path would cost more than the stat itself."""
        try:
            st = os.stat(self._path_str)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CredentialError(f"cannot read {self.path}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO put in its place was read, and waited on, forever
            raise CredentialError(f"{self.path} is not a regular file; restore the credentials file")
        signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if self._cache is None or self._cache[0] != signature:
            self._cache = (signature, self._decrypt_file())
        return self._cache[1]

    def _decrypt_file(self) -> dict[str, dict[str, Any]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CredentialError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            envelope = json.loads(raw)
            if envelope.get("format") != FORMAT:
                raise ValueError
            nonce = base64.b64decode(envelope["nonce"], validate=True)
            ct = base64.b64decode(envelope["ct"], validate=True)
        except (ValueError, AttributeError, KeyError, TypeError, binascii.Error):
            raise CredentialError(
                f"{self.path} is corrupt (not a vaultsim credentials file); "
                "restore it from a backup or remove it and set the credentials again"
            ) from None
        # an existing file needs the existing key: never mint a new one here
        key = self.keystore.derive("credentials", create=False)
        try:
            plain = AESGCM(key).decrypt(nonce, ct, AAD)
        except (InvalidTag, ValueError):
            raise CredentialError(
                f"cannot decrypt {self.path}: the file is damaged or this home's data key in "
                f"{self.keystore.backend_name()} is not the one it was written with"
            ) from None
        try:
            # not a dict of dicts: .values() or entry["value"] below raises, reported as malformed
            table: dict[str, dict[str, Any]] = json.loads(plain)["credentials"]
            for entry in table.values():
                if not isinstance(entry["value"], str):
                    raise TypeError
                float(entry["created"]), float(entry["updated"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CredentialError(f"{self.path} decrypts but its content is malformed") from None
        return table

    def _write(self, table: dict[str, dict[str, Any]]) -> None:
        key = self.keystore.derive("credentials")
        nonce = secrets.token_bytes(12)
        plain = json.dumps({"credentials": table}).encode()
        ct = AESGCM(key).encrypt(nonce, plain, AAD)
        envelope = {
            "format": FORMAT,
            "nonce": base64.b64encode(nonce).decode(),
            "ct": base64.b64encode(ct).decode(),
        }
        try:
            write_private(self.path, json.dumps(envelope).encode())
        except OSError as exc:  # a full disk included: the old file, and every credential, stays
            raise CredentialError(failure(self.path, exc)) from None


def _missing(name: str) -> MissingCredential:
    return MissingCredential(
        f"credential '{name}' is not set; set it with: vaultsim secret set {name}"
    )


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(float(ts), tz=timezone.utc)
