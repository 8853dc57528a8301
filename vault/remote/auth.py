"""Which bearer tokens the fake remote accepts, and when one expires.

Tokens come from a 0600 file (never argv, which `ps` shows) or, in-process,
a dict; so does the token of the control API (`/_sim/`, `load_sim_token`). A request is matched to a token *name* with constant-time compares;
only the name is ever kept or logged. The `expired_token` fault expires a
token after it was accepted, so the vault sees a real expiry of a credential
that worked, not a string the remote never knew.
"""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path

import yaml

from vault import regular
from vault.errors import BadInput

# angle brackets: no token name from a credentials file can collide with these
MISSING = "<missing>"
UNKNOWN = "<unknown>"
EXPIRED = "<expired>"


def load_sim_token(path: str | os.PathLike[str]) -> str:
    """The control API's token: the first line of a private file; errors never quote it."""
    text = _read_private(Path(path), "the control API token").strip()
    if not text or not all(0x21 <= ord(c) <= 0x7E for c in text):
        raise BadInput(f"{path}: the control API token must be one line of printable ASCII")
    return text


# far more than any token file: one past it (a link to /dev/zero) is not read without end
MAX_FILE_BYTES = 1 << 20


def _read_private(path: Path, what: str) -> str:
    """A private regular file's text. A FIFO given as one (`<(...)`) was waited on forever: the
    remote never started and never said why; it is refused, as is /dev/zero."""
    try:
        # opened without blocking: a FIFO opens at once without a writer, then is refused
        with regular.open_file(path) as f:
            st = os.fstat(f.fileno())
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise BadInput(f"{path}: {what} file larger than {MAX_FILE_BYTES >> 20} MiB; not read")
        text = raw.decode("utf-8")
    except regular.NotRegular:
        raise BadInput(f"{path}: not a regular file (a FIFO, device, socket or directory); "
                       f"give a regular file holding {what}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read {what}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: {what} file is not UTF-8 text") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise BadInput(f"{path}: {what} file must not be readable by others (chmod 600)")
    if st.st_uid != os.getuid():
        raise BadInput(f"{path}: {what} file belongs to another user")
    return text


def load_credentials(path: str | os.PathLike[str]) -> dict[str, str]:
    """token-name -> value from a private YAML/JSON file; errors never quote it."""
    path = Path(path)
    text = _read_private(path, "credentials")
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        raise BadInput(f"{path}: credentials file is not valid YAML/JSON") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
    ):
        raise BadInput(f"{path}: credentials must be a mapping of token name to non-empty string")
    return dict(data)


class Authenticator:
    def __init__(self, credentials: dict[str, str]) -> None:
        self._tokens = {name: value.encode() for name, value in credentials.items()}
        self._accepted: dict[str, int] = {}
        self.expired: set[str] = set()

    def identify(self, authorization: bytes | None) -> str:
        """The token name, or MISSING / UNKNOWN / EXPIRED. Never returns the value."""
        if not authorization:
            return MISSING
        scheme, _, presented = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not presented:
            return UNKNOWN
        found = UNKNOWN
        # compare against every token so timing does not say which one matched
        for name, value in self._tokens.items():
            if hmac.compare_digest(presented.strip(), value):
                found = name
        if found in self.expired:
            return EXPIRED
        return found

    def accepted(self, name: str, *, expire_after: int | None, only: str = "") -> None:
        """Count a successful use; with `expire_after`, expire the token at that count."""
        count = self._accepted[name] = self._accepted.get(name, 0) + 1
        if expire_after is not None and (not only or only == name) and count >= expire_after:
            self.expired.add(name)
