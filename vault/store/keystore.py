"""The vault's data key: kept in the OS keyring, never in the vault home.

Each home has one random 32-byte data key, stored base64 in keyring under
service "vaultsim", username "data-key:<sha256(home path)[:16]>", so many homes
(one per test run) coexist in one keyring. Every other key is derived from it
with HKDF-SHA256 and a purpose label ("credentials", "audit", "diagnostics"),
so a leak of one derived key exposes nothing else.

Whichever keyring backend keyring selects is used: the Secret Service on a
desktop, vaultsim's embedded file keyring (vault.store.keyring_backend) on a headless
box. Only keyring's `fail` backend, or a backend that errors, makes the key
unavailable, reported as KeyUnavailable without any key material.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import secrets
import time

import keyring
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from keyring.backend import KeyringBackend
from keyring.backends import chainer, fail
from keyring.errors import PasswordDeleteError

from vault.store import keyring_backend
from vault.errors import KeyUnavailable
from vault.home import VaultHome, exclusive_lock

SERVICE = "vaultsim"
KEY_BYTES = 32
LOCK_NAME = "keystore.lock"
# seconds between tries of a failed keyring read; None: the last try
READ_RETRY_PAUSES = (0.05, 0.25, None)


class KeyStore:
    def __init__(self, home: VaultHome, backend: KeyringBackend | None = None) -> None:
        self.home = home
        # None: ask keyring at first use (PYTHON_KEYRING_BACKEND, config, priority)
        self._backend = backend
        self._key: bytes | None = None
        self._derived: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return f"KeyStore(home={str(self.home.root)!r})"

    @property
    def username(self) -> str:
        digest = hashlib.sha256(str(self.home.root).encode()).hexdigest()
        return "data-key:" + digest[:16]

    @property
    def backend(self) -> KeyringBackend:
        if self._backend is None:
            try:
                self._backend = keyring.get_keyring()
            except Exception as exc:  # e.g. PYTHON_KEYRING_BACKEND names no backend
                raise KeyUnavailable(
                    f"keyring could not load a backend ({type(exc).__name__}: {str(exc)[:200]})"
                ) from None
        return self._backend

    def backend_name(self) -> str:
        """The store that really holds the key, as `status` shows it."""
        try:
            backend = _effective(self.backend)
        except Exception as exc:  # a broken keyring config must not break `status`
            return f"unavailable ({type(exc).__name__})"
        if backend is None or isinstance(backend, fail.Keyring):
            return "none (keyring found no usable backend)"
        return str(backend.name)

    def data_key(self, create: bool = True) -> bytes:
        """The home's data key; created on first use unless `create` is False."""
        if self._key is None:
            key = self._read()
            if key is None:
                if not create:
                    raise KeyUnavailable(
                        f"no data key for vault home {self.home.root} in {self.backend_name()}; "
                        "the data encrypted for this home cannot be read"
                    )
                key = self._create()
            self._key = key
        return self._key

    def derive(self, purpose: str, create: bool = True) -> bytes:
        """A 32-byte key for one purpose, HKDF-SHA256(data key, info=purpose)."""
        if purpose not in self._derived:
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode())
            self._derived[purpose] = hkdf.derive(self.data_key(create=create))
        return self._derived[purpose]

    def destroy(self) -> None:
        """Forget the key (a temporary home is being removed); absent is fine."""
        self._key = None
        self._derived.clear()
        effective = _effective(self.backend)
        if effective is None or isinstance(effective, fail.Keyring):
            return  # no keyring, so no key to forget
        # keyring's chainer deletes from its first backend only; the key may
        # have been created in another one (e.g. before a Secret Service ran)
        backends = (
            self.backend.backends
            if isinstance(self.backend, chainer.ChainerBackend)
            else [self.backend]
        )
        for backend in backends:
            try:
                backend.delete_password(SERVICE, self.username)
            except PasswordDeleteError:
                pass
            except Exception as exc:
                raise self._unavailable("cannot delete the data key", exc) from None

    # --- internals ---------------------------------------------------------

    def _check_usable(self) -> None:
        backend = _effective(self.backend)
        if backend is None or isinstance(backend, fail.Keyring):
            raise KeyUnavailable(
                "no usable keyring backend for the vault data key: start a Secret Service "
                "(e.g. gnome-keyring) or select vaultsim's embedded one with "
                "PYTHON_KEYRING_BACKEND=vault.store.keyring_backend.FileKeyring"
            )

    def _read(self) -> bytes | None:
        self._check_usable()
        # A Secret Service is another process on D-Bus: while it rewrites its
        # collection for another client's new item, a lookup can fail once.
        # A read changes nothing, so it is tried again before giving up.
        for pause in READ_RETRY_PAUSES:
            try:
                encoded = self.backend.get_password(SERVICE, self.username)
                break
            except Exception as exc:
                if pause is None:
                    raise self._unavailable("cannot read the data key", exc) from None
                time.sleep(pause)
        if encoded is None:
            return None
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise KeyUnavailable(
                f"the data key for vault home {self.home.root} in {self.backend_name()} is malformed"
            )
        return key

    def _create(self) -> bytes:
        # Two first uses racing (e.g. parallel `secret set` on a new home) must
        # agree on one key: create under a lock, and re-read before writing.
        with self._creation_lock():
            existing = self._read()
            if existing is not None:
                return existing
            encoded = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
            try:
                self.backend.set_password(SERVICE, self.username, encoded)
            except Exception as exc:
                raise self._unavailable("cannot store the data key", exc, encoded) from None
            stored = self._read()
        if stored is None:  # e.g. keyring's null backend accepts and forgets
            raise KeyUnavailable(f"{self.backend_name()} did not keep the vault data key")
        return stored

    def _creation_lock(self) -> contextlib.AbstractContextManager[None]:
        self.home.ensure()
        return exclusive_lock(self.home.root / LOCK_NAME)

    def _unavailable(self, what: str, exc: Exception, secret: str = "") -> KeyUnavailable:
        detail = str(exc)[:300]
        if secret:
            detail = detail.replace(secret, "[redacted]")
        reason = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        return KeyUnavailable(f"{what} from keyring backend {self.backend_name()} ({reason})")


def _effective(backend: KeyringBackend) -> KeyringBackend | None:
    """The backend that will really be used: keyring's chainer writes to its first."""
    if isinstance(backend, chainer.ChainerBackend):
        chained = backend.backends
        return chained[0] if chained else None
    return backend
