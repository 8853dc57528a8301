"""The daemon's one entry point: an open, locked AuditWriter for a vault home.

The daemon passes ``KeyStore(home).derive("audit")`` and the options of its
config's ``audit`` section (durability, flush timer, segment size, retention);
the signing key is kept in the home encrypted under that key (see `keys`). The
returned writer is the daemon's ``AuditSink``: ``await append(event) -> seq``
(durable), ``await append_answer(event)`` (written; durable per the
durability), ``append_nowait(event)``, ``signed_head()`` and ``close()``.
"""

from __future__ import annotations

from ..home import VaultHome
from .keys import load_or_create_signing_key
from .writer import AuditWriter


def open_audit(home: VaultHome, key: bytes, **options: object) -> AuditWriter:
    """Open ``home/audit.log`` for appending (options go to `AuditWriter.open`)."""
    home.ensure()
    signing_key = load_or_create_signing_key(home.root, key)
    return AuditWriter.open(home.audit_log, key, signing_key, **options)  # type: ignore[arg-type]
