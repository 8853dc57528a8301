"""The audit signing key: created once, encrypted at rest, public half beside the log."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from vault.audit import load_or_create_signing_key
from vault.audit.keys import load_public_key, public_pem
from vault.errors import AuditError, BadInput


def raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


class TestSigningKey:
    def test_created_once_then_reloaded(self, tmp_path: Path) -> None:
        """The first call creates the key; later calls with the same data key return it."""
        key = os.urandom(32)
        first = load_or_create_signing_key(tmp_path, key)
        again = load_or_create_signing_key(tmp_path, key)
        assert raw_private(first) == raw_private(again)

    def test_private_key_encrypted_and_0600(self, tmp_path: Path) -> None:
        """audit.key is 0600 and does not contain the raw private key."""
        sk = load_or_create_signing_key(tmp_path, os.urandom(32))
        blob = (tmp_path / "audit.key").read_bytes()
        assert 0o600 == stat.S_IMODE((tmp_path / "audit.key").stat().st_mode)
        assert raw_private(sk) not in blob and raw_private(sk).hex().encode() not in blob

    def test_public_key_beside_the_log(self, tmp_path: Path) -> None:
        """audit.pub holds the matching public key as PEM."""
        sk = load_or_create_signing_key(tmp_path, os.urandom(32))
        assert public_pem(sk.public_key()) == public_pem(load_public_key(tmp_path / "audit.pub"))

    def test_public_key_recreated_if_deleted(self, tmp_path: Path) -> None:
        """A deleted audit.pub is written again from the private key."""
        key = os.urandom(32)
        sk = load_or_create_signing_key(tmp_path, key)
        (tmp_path / "audit.pub").unlink()
        load_or_create_signing_key(tmp_path, key)
        assert public_pem(sk.public_key()) == (tmp_path / "audit.pub").read_bytes()

    def test_wrong_data_key(self, tmp_path: Path) -> None:
        """Another data key cannot unlock the signing key: AuditError, no key material."""
        load_or_create_signing_key(tmp_path, os.urandom(32))
        with pytest.raises(AuditError, match="wrong vault key"):
            load_or_create_signing_key(tmp_path, os.urandom(32))

    def test_mismatched_public_key(self, tmp_path: Path) -> None:
        """An audit.pub for another key is refused rather than silently overwritten."""
        key = os.urandom(32)
        load_or_create_signing_key(tmp_path, key)
        (tmp_path / "audit.pub").write_bytes(public_pem(Ed25519PrivateKey.generate().public_key()))
        with pytest.raises(AuditError, match="does not match"):
            load_or_create_signing_key(tmp_path, key)

    def test_bad_data_key_length(self, tmp_path: Path) -> None:
        """The data key must be 32 bytes."""
        with pytest.raises(BadInput):
            load_or_create_signing_key(tmp_path, b"x" * 16)
