"""Helpers for the audit tests: logs built with a fake clock, I/O that fails on cue.

Kept out of conftest.py (owned by others) and imported explicitly.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from vault import audit_events as E
from vault.audit import AuditWriter
from vault.audit_events import AuditEvent
from vault.audit import records as R

CANARY = "CANARY-6f1d2c9a-do-not-leak"


class FakeClock:
    """A clock that moves only when told (plus a tiny step per read, so times differ)."""

    def __init__(self, start: float = 1_700_000_000.0, step: float = 0.001) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FlakyIO:
    """os.write / os.fdatasync that count calls and fail on cue with an errno."""

    def __init__(self, *, fail_write: int | None = None, fail_fdatasync: int | None = None,
                 sync: bool = True) -> None:
        self.fail_write = fail_write
        self.fail_fdatasync = fail_fdatasync
        self.sync = sync
        self.writes = 0
        self.fdatasyncs = 0
        self.sync_threads: list[str] = []  # the thread each fdatasync ran in

    def synced_in_loop_thread(self) -> list[bool]:
        """For each fdatasync: did it run in the main (event loop) thread?"""
        return [name == threading.main_thread().name for name in self.sync_threads]

    def write(self, fd: int, data: Any) -> int:
        self.writes += 1
        if self.fail_write is not None:
            raise OSError(self.fail_write, os.strerror(self.fail_write))
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        self.sync_threads.append(threading.current_thread().name)
        if self.fail_fdatasync is not None:
            raise OSError(self.fail_fdatasync, os.strerror(self.fail_fdatasync))
        if self.sync:
            os.fdatasync(fd)


EIO, ENOSPC = errno.EIO, errno.ENOSPC


@dataclass
class LogFiles:
    """One log and the files beside it, with the keys that made it."""

    log: Path
    key: bytes
    signing_key: Ed25519PrivateKey

    @property
    def pub(self) -> Path:
        return R.pub_path(self.log)

    @property
    def head(self) -> Path:
        return R.head_path(self.log)

    def lines(self) -> list[bytes]:
        return self.log.read_bytes().split(b"\n")[:-1]

    def write_lines(self, lines: list[bytes]) -> None:
        self.log.write_bytes(b"".join(line + b"\n" for line in lines))

    def copy_to(self, directory: Path) -> "LogFiles":
        directory.mkdir(parents=True, exist_ok=True)
        for src in (self.log, self.pub, self.head):
            if src.exists():
                shutil.copyfile(src, directory / src.name)
        return LogFiles(directory / self.log.name, self.key, self.signing_key)

    def writer(self, **options: Any) -> AuditWriter:
        return AuditWriter.open(self.log, self.key, self.signing_key, **options)


def sample_events(n: int) -> list[dict[str, Any]]:
    """A daemon conversation as the daemon writes it (built through its models, so a shape
    change there shows here), repeated to `n` events: a prompted create, then a lookup of it."""
    scope = "create_issue on tracker"
    base: list[AuditEvent] = [
        E.SessionOpened(session_id="s-1", agent="stub", pid=4242, sid=4242, pgid=4242, run_id="r-1"),
        E.CallRequested(correlation_id="c-1", session_id="s-1", operation="create_issue", risk="create",
                        target=scope),
        E.PromptShown(request_id="q-1", correlation_id="c-1", operation="create_issue", risk="create",
                      session_id="s-1", mode="per_call", scope=scope, repeat=False),
        E.Decision(request_id="q-1", correlation_id="c-1", decision="allow_once", approver="alice",
                   asked=1.0, shown=1.2, detail=None, decided=2.0, detail_viewed=False),
        E.Intent(correlation_id="c-1", operation="create_issue", target=scope, idempotency_key=False),
        E.Classification(correlation_id="c-1", session_id="s-1", operation="create_issue",
                         category="success", retry="none", diagnostic_id=None, resumed=False,
                         remote_touched=True),
        E.Reconciliation(correlation_id="c-2", category="success", remote_touched=True, diagnostic_id=None,
                         reconciled="found", lookup_of="c-1"),
        E.Classification(correlation_id="c-2", session_id="s-1", operation="create_issue",
                         category="success", retry="none", diagnostic_id=None, resumed=False),
        E.SessionClosed(session_id="s-1", reason="client closed"),
    ]
    # `n`: the event's index, which tests of the log format look for; not a daemon field (the
    # plain writer stores any JSON object, the daemon's sink would refuse it)
    return [dict(base[i % len(base)].to_event(), n=i) for i in range(n)]


def make_log(directory: Path, events: list[dict[str, Any]] | int, *, head_every_records: int = 3,
             close: bool = True, name: str = "audit.log", **options: Any) -> LogFiles:
    """Write `events` (or that many sample events) with a fresh key pair; closed by default."""
    directory.mkdir(parents=True, exist_ok=True)
    files = LogFiles(directory / name, os.urandom(32), Ed25519PrivateKey.generate())
    if isinstance(events, int):
        events = sample_events(events)
    options.setdefault("clock", FakeClock())
    w = files.writer(head_every_records=head_every_records, **options)
    for ev in events:
        w.append_sync(ev)
    if close:
        w.close()
    return files


def rechain(lines: list[bytes], *, start: int = 0) -> list[bytes]:
    """Recompute prev and hash of every record from `start` on, as a forger would; heads untouched."""
    out, prev = [], R.GENESIS
    for line in lines:
        rec = R.RECORD_RE.fullmatch(line)
        if rec is None:
            out.append(line)
            continue
        seq = int(rec.group(1))
        if seq < start:
            out.append(line)
            prev = rec.group(6)
            continue
        body = b'{"seq":%s,"time":%s,"prev":"%s","nonce":"%s","ct":"%s"' % (
            rec.group(1), rec.group(2), prev, rec.group(4), rec.group(5))
        prev = hashlib.sha256(body).hexdigest().encode()
        out.append(body + R.HASH_SEP + prev + b'"}')
    return out


def corrupt_ct(line: bytes) -> bytes:
    """The same record with one ciphertext byte changed (hash left stale)."""
    rec = R.RECORD_RE.fullmatch(line)
    assert rec is not None
    ct = bytearray(base64.b64decode(rec.group(5)))
    ct[0] ^= 1
    return line.replace(rec.group(5), base64.b64encode(bytes(ct)))


def line_kinds(lines: list[bytes]) -> list[tuple[str, int]]:
    """('record', seq) or ('head', seq anchored) for each line of a well-formed log."""
    out = []
    for line in lines:
        doc = json.loads(line)
        out.append(("head", doc["head"]["seq"]) if "head" in doc else ("record", doc["seq"]))
    return out
