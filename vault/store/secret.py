"""The only wrapper a secret value travels in inside the daemon.

`repr`, `str`, format and JSON are masked; the value comes out only through
`reveal()`, called at the one place an executor needs it on the wire.
"""

from __future__ import annotations

from typing import Any

MASK = "**********"


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str | bytes) -> None:
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: Any) -> bool:
        import hmac

        return isinstance(other, Secret) and hmac.compare_digest(
            self._value.encode(), other._value.encode()
        )

    def __hash__(self) -> int:
        return hash(("Secret", len(self._value)))

    def __reduce__(self) -> Any:
        raise TypeError("Secret values cannot be pickled")

    def __json__(self) -> str:  # for json encoders that honour it
        return MASK

    def __len__(self) -> int:
        return len(self._value)
