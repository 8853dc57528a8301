"""The fault catalogue of the fake remote: one named, parameterised fault a run.

The failure matrix (C01-C07) and the malformed-data and timeout cases need a
remote that misbehaves in exactly one documented way, so a test can check the
category the vault reports against what the remote really did (the ledger).
A fault is written `NAME[:k=v,...]`, e.g. `late_response_after_commit:delay=2`;
`op=NAME` targets one route (the remote's route names mirror the catalog's
operation names) or, starting with `/`, a path prefix. Without `op` a fault
hits every `/v1` route except the status endpoint `operation_status`, so a
lookup can still reconcile. `times=N` limits it to the first N matching
requests (default: all).

| fault | params | where / what the remote does | remote effect | category (mutating op / read op) |
| --- | --- | --- | --- | --- |
| `dns_failure` | - | client side: service URL host `*.invalid` (RFC 6761) never resolves | none, no request | local_failure |
| `connection_refused` | - | client side: URL of a bound port nobody listens on (RST) | none, no request | local_failure |
| `timeout_before_send` | - | client side: URL of a listener whose accept queue is full; SYNs are dropped, connect times out | none, no request byte leaves | local_failure |
| `expired_token` | `after=1`, `token=NAME` | the token works `after` times, then is expired for good: 401, `WWW-Authenticate: Bearer error="invalid_token"`, `{"error":"token_expired"}` | none for the rejected call | authentication_failed |
| `permission_denied` | - | 403 `{"error":"insufficient_scope"}` | none | authorization_denied |
| `rate_limited` | `retry_after=2` | 429 with `Retry-After` | none | rate_limited |
| `build_status_7` | - | build JSON carries `"status": 7` | none (read) | malformed_response |
| `late_response_after_commit` | `delay=inf` | commits, then holds the response `delay` s (or until the client leaves / stop) | 1 effect | outcome_unknown / local_failure (success if `delay` < client deadline) |
| `timeout_after_headers` | `delay=inf` | reads the request head, never consumes the body | attempt arrived, no effect | outcome_unknown / local_failure |
| `timeout_after_accept` | `delay=inf`, `commit=0` | reads the whole request, stalls before answering; `commit=1` commits first | 0 (or 1) effect | outcome_unknown / local_failure |
| `timeout_during_body` | `delay=inf` | commits, sends the status line, headers and half the body, then stalls | 1 effect | outcome_unknown / local_failure |
| `id_null` `id_number` `id_object` `id_missing` | - | commits, answers with `id` null / 12345 / `{}` / absent | 1 effect on a mutation | malformed_response |
| `success_with_error_body` | `commit=1` | 200 with an error envelope | 1 effect (`commit=0`: none) | malformed_response |
| `error_status_html` | `status=502` | an HTML error page, like a proxy's | none | malformed_response |
| `truncated_json` | `status=0` | JSON cut in half, HTTP framing intact (Content-Length of what is sent); `status` 0 keeps the normal status, 4xx/5xx cuts an error envelope instead | 1 effect unless status >= 400 | malformed_response |
| `duplicated_item` | - | list answer with its first item twice | none (read) | malformed_response |
| `reordered_items` | - | list answer in reverse of its documented order | none (read) | malformed_response |

A read-only operation has no remote effect, so a timeout after sending it is
reported `local_failure` (bounded retry is safe) rather than `outcome_unknown`;
see vault/executors/http.py. Every stall ends when the client disconnects, at
`POST /_sim/release`, or at stop, so tests never wait for a fixed time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vault.errors import BadInput

# faults whose effect is the URL the vault is given: the remote never sees a byte
CLIENT_SIDE = frozenset({"dns_failure", "connection_refused", "timeout_before_send"})

_INF = math.inf

# name -> {param: default}; the default's type is the param's type
FAULTS: dict[str, dict[str, Any]] = {
    "dns_failure": {},
    "connection_refused": {},
    "timeout_before_send": {},
    "expired_token": {"after": 1, "token": ""},
    "permission_denied": {},
    "rate_limited": {"retry_after": 2},
    "build_status_7": {},
    "late_response_after_commit": {"delay": _INF},
    "timeout_after_headers": {"delay": _INF},
    "timeout_after_accept": {"delay": _INF, "commit": False},
    "timeout_during_body": {"delay": _INF},
    "id_null": {},
    "id_number": {},
    "id_object": {},
    "id_missing": {},
    "success_with_error_body": {"commit": True},
    "error_status_html": {"status": 502},
    "truncated_json": {"status": 0},
    "duplicated_item": {},
    "reordered_items": {},
}

# params every fault accepts
_COMMON: dict[str, Any] = {"times": 0}

# the id value each fault puts in place of a resource's real id
ID_FAULTS: dict[str, object] = {"id_null": None, "id_number": 12345, "id_object": {}}


@dataclass(frozen=True)
class FaultSpec:
    """One fault: its name, typed params (defaults filled in) and optional target."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    operation: str | None = None

    def __post_init__(self) -> None:
        if self.name not in FAULTS:
            raise BadInput(f"unknown fault {self.name!r}; known: {', '.join(sorted(FAULTS))}")
        allowed = {**_COMMON, **FAULTS[self.name]}
        typed: dict[str, Any] = {}
        for key, value in self.params.items():
            if key not in allowed:
                raise BadInput(f"fault {self.name}: unknown parameter {key!r}")
            typed[key] = _coerce(self.name, key, value, allowed[key])
        object.__setattr__(self, "params", {**allowed, **typed})

    @classmethod
    def parse(cls, text: str) -> "FaultSpec":
        """`NAME[:k=v,...]`; `op=X` becomes the target operation."""
        name, _, rest = text.strip().partition(":")
        params: dict[str, Any] = {}
        operation = None
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise BadInput(f"fault {name}: parameter {key!r} needs a value (k=v)")
            if key.strip() == "op":
                operation = value.strip() or None
            else:
                params[key.strip()] = value.strip()
        return cls(name, params, operation)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FaultSpec":
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise BadInput("a fault needs a string 'name'")
        params = data.get("params") or {}
        if not isinstance(params, dict):
            raise BadInput("fault params must be an object")
        op = data.get("operation")
        # to_dict() writes an unbounded delay as null: null means "the default"
        params = {k: v for k, v in params.items() if v is not None}
        return cls(data["name"], params, op if isinstance(op, str) and op else None)

    @property
    def client_side(self) -> bool:
        return self.name in CLIENT_SIDE

    def to_dict(self) -> dict[str, Any]:
        params = {k: (None if v == _INF else v) for k, v in self.params.items()}
        return {"name": self.name, "params": params, "operation": self.operation}

    def __str__(self) -> str:
        shown = [f"{k}={v}" for k, v in self.params.items()
                 if v != {**_COMMON, **FAULTS[self.name]}[k]]
        if self.operation:
            shown.append(f"op={self.operation}")
        return self.name + (":" + ",".join(shown) if shown else "")


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    out: int | float
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text not in {"0", "1", "true", "false", "yes", "no"}:
                raise ValueError
            return text in {"1", "true", "yes"}
        if isinstance(default, int):
            out = int(value)
        elif isinstance(default, float):
            out = float(value)
        else:
            return str(value)
    except (TypeError, ValueError):
        raise BadInput(f"fault {name}: parameter {key!r} must be {type(default).__name__}") from None
    if out < 0 or (isinstance(out, float) and math.isnan(out)):
        raise BadInput(f"fault {name}: parameter {key!r} must not be negative")
    if key == "after" and out < 1:
        raise BadInput(f"fault {name}: parameter 'after' must be at least 1 (the token must work first)")
    if key == "status" and not (200 <= out <= 599 or (out == 0 and name == "truncated_json")):
        raise BadInput(f"fault {name}: parameter 'status' must be a final HTTP status (200-599)")
    return out


class ActiveFault:
    """The run's fault and how many matching requests it has hit (for `times`)."""

    def __init__(self, spec: FaultSpec | None) -> None:
        self.spec = spec
        self.hits = 0

    def take(self, route: str, path: str) -> FaultSpec | None:
        """The fault for this request, counting it; None when it does not apply."""
        spec = self.spec
        if spec is None or spec.client_side or spec.name == "expired_token":
            return None
        if not matches(spec, route, path):
            return None
        times = spec.params["times"]
        if times and self.hits >= times:
            return None
        self.hits += 1
        return spec


def matches(spec: FaultSpec, route: str, path: str) -> bool:
    if spec.operation is None:
        return route != "operation_status"
    if spec.operation.startswith("/"):
        return path.startswith(spec.operation)
    return route == spec.operation
