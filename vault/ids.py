"""Identifiers: random, time-ordered, never derived from a secret."""

from __future__ import annotations

import secrets
import time


def _stamp() -> str:
    # millisecond time prefix keeps ids sortable in logs; the rest is random
    return f"{int(time.time() * 1000):011x}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{_stamp()}{secrets.token_hex(8)}"


def correlation_id() -> str:
    return new_id("c")


def token(nbytes: int = 32) -> str:
    return secrets.token_urlsafe(nbytes)
