"""The audit log's Ed25519 signing key: kept encrypted in the home, public half beside the log.

Signed heads are what make a rewritten log (with every hash recomputed) or a cut
log detectable, so the private key must not sit in the home in clear: it is
stored in ``audit.key`` (0600) as AES-256-GCM under the audit data key::

    {"v":1,"alg":"ed25519","nonce":"<b64>","ct":"<b64 of the 32-byte raw private key + tag>"}

with AAD ``vaultsim.audit.signing-key.v1``. ``audit.pub`` holds the public key
as PEM (SubjectPublicKeyInfo); verify reads it, or any key the operator pins.
One signing key per home, no rotation: a home gets a new key only when it has
none. The daemon's home lock keeps two processes from creating one at once.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vault.errors import AuditError, BadInput
from vault.audit.files import atomic_write, read_small

KEY_FILE = "audit.key"
PUB_FILE = "audit.pub"
_AAD = b"vaultsim.audit.signing-key.v1"


def check_data_key(key: bytes) -> None:
    if not isinstance(key, bytes | bytearray) or len(key) != 32:
        raise BadInput("the audit key must be 32 bytes")


def load_or_create_signing_key(home_dir: Path, key: bytes) -> Ed25519PrivateKey:
    """The home's audit signing key, created (and ``audit.pub`` written) on first use."""
    check_data_key(key)
    home_dir = Path(home_dir)
    key_file = home_dir / KEY_FILE
    try:
        blob = read_small(key_file, "audit signing key", limit=64 * 1024)
    except BadInput as exc:  # a FIFO or device where the key should be
        raise AuditError(exc.message) from None
    except FileNotFoundError:
        signing = Ed25519PrivateKey.generate()
        raw = signing.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        nonce = os.urandom(12)
        ct = AESGCM(bytes(key)).encrypt(nonce, raw, _AAD)
        doc = {"v": 1, "alg": "ed25519", "nonce": base64.b64encode(nonce).decode(),
               "ct": base64.b64encode(ct).decode()}
        try:
            atomic_write(key_file, json.dumps(doc, separators=(",", ":")).encode())
        except OSError as exc:
            # chained: a starting daemon tells no room (exit 2, README) from a damaged key by its errno
            raise AuditError(f"cannot write audit signing key {key_file}: {exc.strerror}") from exc
    except OSError as exc:
        raise AuditError(f"cannot read audit signing key {key_file}: {exc.strerror}") from None
    else:
        signing = _decrypt(key_file, blob, key)
    ensure_public_key(home_dir / PUB_FILE, signing.public_key())
    return signing


def _decrypt(key_file: Path, blob: bytes, key: bytes) -> Ed25519PrivateKey:
    try:
        doc = json.loads(blob)
        nonce = base64.b64decode(doc["nonce"], validate=True)
        ct = base64.b64decode(doc["ct"], validate=True)
        raw = AESGCM(bytes(key)).decrypt(nonce, ct, _AAD)
        return Ed25519PrivateKey.from_private_bytes(raw)
    except (InvalidTag, ValueError, KeyError, TypeError):
        raise AuditError(f"cannot decrypt audit signing key {key_file}: wrong vault key or damaged file") from None


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def ensure_public_key(path: Path, public: Ed25519PublicKey) -> None:
    """Write `path` if missing; refuse if it names a different key (a mixed-up home)."""
    try:
        existing = load_public_key(path)
    except FileNotFoundError:
        try:
            atomic_write(path, public_pem(public))
        except OSError as exc:
            raise AuditError(f"cannot write audit public key {path}: {exc.strerror}") from exc
        return
    except BadInput as exc:
        raise AuditError(exc.message) from None
    except ValueError:
        raise AuditError(f"audit public key {path} is unreadable; move it aside to re-create it") from None
    except OSError as exc:
        raise AuditError(f"cannot read audit public key {path}: {exc.strerror}") from None
    if _raw(existing) != _raw(public):
        raise AuditError(f"audit public key {path} does not match the signing key")


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Read a PEM (or base64 raw 32-byte) Ed25519 public key. ValueError if it is not one;
    FileNotFoundError if there is none; BadInput if it is a FIFO, a device or huge."""
    data = read_small(Path(path), "public key", limit=64 * 1024)
    try:
        if b"-----BEGIN" in data:
            key = serialization.load_pem_public_key(data)
        else:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(data.strip(), validate=True))
    except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
        raise ValueError(str(exc)) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key
