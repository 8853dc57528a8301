"""Protected diagnostics: the raw evidence an operator needs, kept from the agent.

A Result is deliberately small; the raw status, headers, body, failing
contract field and timings of a call go here instead, referenced from the
Result by `diagnostic_id`. Each diagnostic is one AES-GCM-encrypted file
(0600, written all or nothing, in a 0700 directory, the id bound as
associated data so files cannot be swapped). Before anything is written,
Authorization / Cookie headers and every occurrence of a known secret are
redacted: a remote that echoes a token back in an error body must not turn
the diagnostic store into a copy of it.

In the daemon a diagnostic is written with `record_off_loop`, in the store's own
thread: a write is two fsyncs (file and directory), and in the event loop a
slow or stalled disk held every client with it, an agent looping on failing
calls making the whole vault as slow as the disk. One thread of its own, not
the loop's shared pool, so a stalled disk holds it alone.

The store keeps the newest `keep` diagnostics (ids sort by time) and removes
older ones as new ones arrive: an agent that fails in a loop must not fill the
disk, since a full disk would stop the audit log and with it every call.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import os
import re
import secrets as _random
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vault import regular
from vault.atomic import UnsafeDirectory, private_dir, write_private
from vault.errors import BadInput, VaultError
from vault.ids import new_id
from vault.store.secret import Secret

REDACTED = "[redacted]"
SENSITIVE_KEYS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_ID = re.compile(r"d-[0-9a-f]{27}")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_VERSION = b"\x01"
# about 640 MiB at most: each diagnostic keeps at most 64 KiB of body
MAX_KEPT = 10_000


# far above any diagnostic the vault writes (a body is cut to 64 KiB): a larger file is not one
MAX_FILE_BYTES = 16 << 20


def read_regular(path: Path) -> bytes:
    """A diagnostic's bytes. Its file is the vault's, but its directory is the user's: a FIFO
    planted in its place held `vaultsim diag show` forever (waiting for a writer), and a
    symbolic link to /dev/zero was read until memory ran out. Only a regular file is read,
    without following a link, and no more than any diagnostic can be."""
    try:
        return regular.read_bytes(path, MAX_FILE_BYTES, follow=False)
    except regular.NotRegular:
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, device, socket or directory), "
                                    "not a file the vault wrote") from None
    except regular.TooLarge:
        raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES >> 20} MiB, not a file the vault wrote") from None


class Diagnostics:
    def __init__(self, directory: Path, key: bytes, secrets: Iterable[str | Secret] = (), *,
                 keep: int = MAX_KEPT) -> None:
        if len(key) not in (16, 24, 32):
            raise ValueError("diagnostics key must be 16, 24 or 32 bytes")
        if keep < 1:
            raise ValueError("diagnostics must keep at least one record")
        self.directory = Path(directory)
        self.keep = keep
        self._aead = AESGCM(key)
        self._secrets: set[str] = set()
        self._kept: deque[str] | None = None  # ids on disk, oldest first; listed on first record
        self._thread: ThreadPoolExecutor | None = None  # record_off_loop's writer
        self.add_secrets(secrets)

    def __repr__(self) -> str:
        return f"Diagnostics({str(self.directory)!r})"

    def add_secrets(self, values: Iterable[str | Secret]) -> None:
        """Values to scrub from every later record (e.g. each credential in use)."""
        for value in values:
            text = value.reveal() if isinstance(value, Secret) else value
            if text:
                self._secrets.add(text)

    async def record_off_loop(self, data: dict[str, Any], *, secrets: Iterable[str | Secret] = ()) -> str:
        """`record`, in this store's own thread (see the module doc)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="diagnostics")
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, functools.partial(self.record, data, secrets=list(secrets)))

    def record(self, data: dict[str, Any], *, secrets: Iterable[str | Secret] = ()) -> str:
        scrub = set(self._secrets)
        for value in secrets:
            text = value.reveal() if isinstance(value, Secret) else value
            if text:
                scrub.add(text)
        clean = redact(data, scrub)
        diagnostic_id = new_id("d")
        plain = json.dumps(clean, sort_keys=True, default=str).encode()
        nonce = _random.token_bytes(12)
        blob = _VERSION + nonce + self._aead.encrypt(nonce, plain, diagnostic_id.encode())
        _private_dir(self.directory)
        if self._kept is None:
            self._kept = deque(self._on_disk())
        write_private(self._path(diagnostic_id), blob)
        self._kept.append(diagnostic_id)
        while len(self._kept) > self.keep:
            self._path(self._kept.popleft()).unlink(missing_ok=True)
        return diagnostic_id

    def load(self, diagnostic_id: str) -> dict[str, Any]:
        if not isinstance(diagnostic_id, str) or not _ID.fullmatch(diagnostic_id):
            raise BadInput("not a diagnostic id (expected d- followed by 27 hex digits)")
        try:
            blob = read_regular(self._path(diagnostic_id))
        except FileNotFoundError:
            raise BadInput(f"no diagnostic {diagnostic_id} (the vault keeps the newest {self.keep:,}; "
                           "older ones are removed)") from None
        except OSError as exc:
            why = "a symbolic link, not a file the vault wrote" if exc.errno == errno.ELOOP else exc.strerror
            raise VaultError(f"cannot read diagnostic {diagnostic_id}: {why}") from None
        try:
            if blob[:1] != _VERSION:
                raise InvalidTag
            plain = self._aead.decrypt(blob[1:13], blob[13:], diagnostic_id.encode())
            doc: dict[str, Any] = json.loads(plain)  # save() wrote a JSON object under this key
            return doc
        except (InvalidTag, ValueError):
            raise VaultError(f"diagnostic {diagnostic_id} cannot be decrypted with this vault's key") from None

    def _on_disk(self) -> list[str]:
        """Ids of the diagnostics already stored, oldest first (ids alone tie within a ms)."""
        found = []
        for path in self.directory.glob("d-*.diag"):
            try:
                if _ID.fullmatch(path.stem):
                    found.append((path.stat().st_mtime_ns, path.stem))
            except FileNotFoundError:
                continue
        return [did for _, did in sorted(found)]

    def _path(self, diagnostic_id: str) -> Path:
        # the id is validated against _ID first: no separators, no traversal
        return self.directory / f"{diagnostic_id}.diag"


def redact(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy with sensitive headers and every known secret replaced."""
    known = sorted({s for s in secrets if s}, key=len, reverse=True)

    def text(s: str) -> str:
        for secret in known:
            s = s.replace(secret, REDACTED)
        return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", s)

    def walk(v: Any) -> Any:
        if isinstance(v, Secret):
            return REDACTED
        if isinstance(v, str):
            return text(v)
        if isinstance(v, bytes):
            return text(v.decode("utf-8", "replace"))
        if isinstance(v, dict):
            return {text(str(k)): REDACTED if str(k).lower() in SENSITIVE_KEYS else walk(x)
                    for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            # a header list: [["Authorization", "Bearer ..."], ...]
            if len(v) == 2 and isinstance(v[0], str) and v[0].lower() in SENSITIVE_KEYS:
                return [v[0], REDACTED]
            return [walk(x) for x in v]
        return v

    return walk(value)


def _private_dir(path: Path) -> None:
    try:
        private_dir(path, "diagnostics directory")
    except UnsafeDirectory as exc:  # never chmod'ed: someone changed it, and should know
        raise VaultError(str(exc)) from None
