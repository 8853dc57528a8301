"""The daemon's one entry point: an open, locked AuditWriter for a vault home.

The daemon passes ``KeyStore(home).derive("audit")`` and the options of its
config's ``audit`` section (durability, flush timer, segment size, retention);
the signing key is kept in the home encrypted under that key (see `keys`). The
returned writer is the daemon's ``AuditSink``: ``await append(event) -> seq``
(durable), ``await append_answer(event)`` (written; durable per the
durability), ``append_nowait(event)``, ``signed_head()``, ``durable_tip()`` and ``close()``.
An event is a model of `vault.audit_events` (what the daemon's producers build:
checked by mypy and when built) or a dict (tools, tests, an escaped event); a
dict is checked against its model (``check="fields"``: type and field names,
cheap enough for every record; ``VAULTSIM_AUDIT_CHECK=full`` in the
environment: values too, for tests and debugging), so a typo is an
AuditEventError, never a record the readers silently misread.
"""

from __future__ import annotations

import os
from typing import Any

from vault.home import VaultHome
from vault.audit.keys import load_or_create_signing_key
from vault.audit.writer import AuditWriter

CHECK_ENV = "VAULTSIM_AUDIT_CHECK"


def open_audit(home: VaultHome, key: bytes, **options: Any) -> AuditWriter:
    """Open ``home/audit.log`` for appending (options go to `AuditWriter.open`)."""
    home.ensure()
    signing_key = load_or_create_signing_key(home.root, key)
    options.setdefault("check", "full" if os.environ.get(CHECK_ENV) == "full" else "fields")
    # the options are the config's audit section, checked by AuditWriter.open itself
    return AuditWriter.open(home.audit_log, key, signing_key, **options)
