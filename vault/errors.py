"""One exception root for everything vaultsim raises on purpose.

    VaultError                    code "vault_error"
    ├── BadInput                  bad file, field or argument (CLI exit 2)
    ├── HomeError                 vault home unusable / already served
    │   └── AlreadyRunning        a daemon already serves this home
    ├── CredentialError           credential store problems
    │   ├── MissingCredential
    │   └── KeyUnavailable        data key not obtainable from keyring
    ├── Refused                   a request the vault's rules turn down (gate, approver side)
    │   ├── Conflict              it names a request that is settled, unknown or from before a lock
    │   └── NotAuthorized         this approver (or process) may not do that
    ├── RpcError                  a JSON-RPC error answer (carries the rpc code)
    └── AuditError                the audit log refused a write (fail closed)

`Refused` and its kinds are domain errors: the gate raises them knowing
nothing of JSON-RPC; the RPC layer (vault.daemon.rpc_server) alone maps each kind to
its wire code. Messages never contain a secret value or rejected raw input.
"""

from __future__ import annotations

from typing import Any


class VaultError(Exception):
    code = "vault_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VaultError":
        sub = _BY_CODE.get(data.get("code", ""), VaultError)
        return sub(str(data.get("message", "")))


class BadInput(VaultError):
    code = "bad_input"


class HomeError(VaultError):
    code = "home_error"


class AlreadyRunning(HomeError):
    code = "already_running"


class CredentialError(VaultError):
    code = "credential_error"


class MissingCredential(CredentialError):
    code = "missing_credential"


class KeyUnavailable(CredentialError):
    code = "key_unavailable"


class AuditError(VaultError):
    code = "audit_error"


class Refused(VaultError):
    code = "refused"


class Conflict(Refused):
    code = "conflict"


class NotAuthorized(Refused):
    code = "not_authorized"


class RpcError(VaultError):
    code = "rpc_error"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.data = data


_BY_CODE = {
    c.code: c
    for c in (VaultError, BadInput, HomeError, AlreadyRunning, CredentialError,
              MissingCredential, KeyUnavailable, AuditError, Refused, Conflict, NotAuthorized)
}
