"""The audit log: hash-chained, encrypted, signed, single-writer, fail closed.

Why a package of its own: the daemon needs one thing from it (append an event,
durably, or refuse), and operators need two (verify offline, show with the
key); everything else is format and protocol, written down where it lives:

* `records`  the line format, the hash and the signature inputs.
* `files`    a set's segment files; safe reads; all-or-nothing writes.
* `keys`     the Ed25519 signing key, encrypted in the home; ``audit.pub``.
* `writer`   `AuditWriter`: lock, group commit, durability, rotation, signed heads.
* `recovery` what a writer finds at open: torn tail, unsigned records, the head file.
* `verify`   `verify` -> `VerifyReport`, offline, no data key (`verify_worker`:
             its worker processes for big sets).
* `show`     `decrypt_events` and the sessions / activity / correlation views.
* `adapter`  `open_audit(home, key, **options)`: what the daemon calls.
* `cli`      ``vaultsim audit verify|show``.

What an event says is typed outside this package, in `vault.audit_events`
(one model per ``type``; re-exported by `vault.wire`): the daemon's
producers build those models, the writer stores them (and checks a dict
against them, `open_audit`), and `show` and the runner read the decrypted
events through them.
"""

from vault.audit.keys import load_or_create_signing_key
from vault.audit.show import activity, correlation, decrypt_events, sessions
from vault.audit.verify import VerifyReport, verify
from vault.audit.writer import AuditWriter

__all__ = ["AuditWriter", "VerifyReport", "activity", "correlation", "decrypt_events",
           "load_or_create_signing_key", "sessions", "verify"]
