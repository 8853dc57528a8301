"""What a writer finds when it opens a log: where the chain continues, and whether to.

Why a module of its own: recovery is the one place that reads a log with the
key to decide whether to continue it, and it holds the rule `verify` reports
as ``unanchored``. At open (`recover`):

* a torn last line (no newline: a crash inside write(2)) is cut away; it was
  never acknowledged, since a record is acknowledged only once written whole;
* the lines from the newest signed head on are checked: the head signed by
  our key and naming the record before it, every record well formed and
  chained, and every record no head covers yet decrypting with the key (only
  the key's holder can have written it), as must the last record (the key is
  the right one). Anything else: AuditError, the writer refuses the log;
* ``NAME.head`` must not name a head the log no longer reaches (cut or rolled
  back: refused, so a new head cannot paper over the cut);
* an active segment that is missing or empty while rotated segments exist
  (a crash between the two renames of a rotation) continues from the newest
  rotated segment, whose closing head the new segment must start with;
* ``.NAME.log.next`` (a segment whose start a crash interrupted) is removed
  (`remove_stale_next`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vault.errors import AuditError, BadInput
from vault.audit import files as F
from vault.audit import records as R
from vault.audit.chain import MAX_LINE_BYTES


@dataclass(frozen=True)
class HeadRef:
    """A signed head line and what it names."""

    seq: int
    hash: bytes
    line: bytes  # with its newline


@dataclass
class Tail:
    """Where an existing log leaves off, as recovery found it."""

    next_seq: int = 0
    prev: bytes = R.GENESIS
    head: HeadRef | None = None  # the newest signed head
    first_seq: int = 0  # seq of the active segment's first record
    size: int = 0  # bytes of the active segment
    unanchored: int = 0  # records after the newest head (checked with the key)
    torn: int = 0  # bytes of a torn last line, cut away
    carry: HeadRef | None = None  # a new, empty active segment must start with this head



def remove_stale_next(path: Path) -> None:
    """A segment whose start a crash interrupted was never the log: remove it (we hold the lock)."""
    nxt = F.next_path(path)
    try:
        nxt.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AuditError(f"cannot remove the unfinished segment {nxt}: {exc.strerror}") from None
    F.fsync_dir(path.parent)


def recover(path: Path, fd: int, key: bytes, signing_key: Ed25519PrivateKey) -> Tail:
    """Drop a torn tail; check what no head vouches for yet; say where the chain continues."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise AuditError(f"audit log {path} is not a regular file")
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    try:
        end, lines, from_start = _read_back(fd, st.st_size)
        if end < st.st_size:
            os.ftruncate(fd, end)
            os.fsync(fd)
    except OSError as exc:
        raise AuditError(f"cannot recover the tail of audit log {path}: {exc.strerror}") from None
    torn = st.st_size - end
    aes, public = AESGCM(bytes(key)), signing_key.public_key()
    if not lines:
        segments = F.rotated(path)
        if not segments:  # a new log (or one whose only line was torn)
            _check_head_file(path, public, None)
            return Tail(torn=torn)
        # a crash between the two renames of a rotation: start the next segment afresh
        last = segments[-1][1]
        try:
            sfd = F.open_regular(last, "audit log segment")
        except BadInput as exc:  # missing meanwhile, unreadable, or a FIFO or device by that name
            raise AuditError(exc.message) from None
        try:
            send, slines, sfrom_start = _read_back(sfd, os.fstat(sfd).st_size)
        finally:
            os.close(sfd)
        if not slines or send == 0:
            raise AuditError(f"audit log segment {last} is empty or damaged; run `vaultsim audit verify {path}`")
        tail = _check_tail(last, slines, sfrom_start, aes, public)
        if tail.head is None or tail.head.seq != tail.next_seq - 1:
            raise AuditError(f"audit log segment {last} does not end with a signed head; "
                             f"run `vaultsim audit verify {path}`")
        _check_head_file(path, public, tail)
        return Tail(next_seq=tail.next_seq, prev=tail.prev, head=tail.head, first_seq=tail.next_seq,
                     size=0, torn=torn, carry=tail.head)
    tail = _check_tail(path, lines, from_start, aes, public)
    tail.size, tail.torn = end, torn
    tail.first_seq = _first_seq(fd, end, tail.next_seq)
    _check_head_file(path, public, tail)
    return tail


def _check_tail(path: Path, lines: list[bytes], from_start: bool, aes: AESGCM,
                public: Ed25519PublicKey) -> Tail:
    """Validate the lines from the newest head on: every head signed by us and naming
    the record before it, every record chained, and every record no head covers
    yet decrypting with the key (as must the last record: the key is the right one)."""
    damaged = (f"audit log {path} ends with a damaged line; run `vaultsim audit verify {path}` "
               "and move the log aside")
    seq, digest = (-1, R.GENESIS) if from_start else (None, None)
    head: HeadRef | None = None
    unsigned: list[R.Record] = []
    last: R.Record | None = None
    for line in lines:
        if line.startswith(R.HEAD_START):
            h = R.parse_head(line)
            if h is None:
                raise AuditError(damaged)
            try:
                public.verify(h.sig, h.message)
            except InvalidSignature:
                raise AuditError(f"a head of audit log {path} was signed by another key") from None
            if seq is not None and seq >= 0 and (h.seq != seq or h.hash != digest):
                raise AuditError(damaged)
            seq, digest = h.seq, h.hash  # at a segment's start: the previous segment's end
            head, unsigned = HeadRef(h.seq, h.hash, line + b"\n"), []
            continue
        rec = R.parse_record(line)
        if rec is None:
            raise AuditError(damaged)
        if seq is not None and (rec.seq != seq + 1 or rec.prev != digest):
            raise AuditError(damaged)
        seq, digest, last = rec.seq, rec.hash, rec
        unsigned.append(rec)
    for rec in unsigned or ([last] if last is not None else []):
        try:
            aes.decrypt(rec.nonce, rec.ct, rec.aad)
        except InvalidTag:
            if unsigned:  # the rule `verify` reports as unanchored: only the key can vouch
                raise AuditError(f"the audit key does not decrypt record {rec.seq} of {path}, which no "
                                 "signed head covers yet: wrong key, or records appended by someone "
                                 f"else; run `vaultsim audit verify {path}`") from None
            raise AuditError(f"the audit key does not decrypt the last record of {path}: "
                             "wrong key or damaged log") from None
    assert seq is not None and digest is not None
    return Tail(next_seq=seq + 1, prev=digest, head=head, unanchored=len(unsigned))


def _check_head_file(path: Path, public: Ed25519PublicKey, tail: Tail | None) -> None:
    """Refuse to continue a log that was cut back behind its newest signed head.

    Continuing would sign a new head over the cut and erase the evidence; the
    operator has to look at it first (`vaultsim audit verify`).
    """
    hp = R.head_path(path)
    try:
        side = F.read_small(hp, "head file", limit=4096)
    except FileNotFoundError:
        return
    except Exception as exc:  # BadInput: a FIFO or device where the head file should be
        raise AuditError(f"cannot read head file {hp}: {getattr(exc, 'message', exc)}") from None
    head = R.parse_head(side[:-1]) if side.endswith(b"\n") else None
    try:
        if head is None:
            raise InvalidSignature
        public.verify(head.sig, head.message)
    except InvalidSignature:
        raise AuditError(f"head file {hp} is damaged or signed by another key; "
                         f"run `vaultsim audit verify {path}`") from None
    last_seq = tail.next_seq - 1 if tail is not None else -1
    if head.seq > last_seq or (head.seq == last_seq and tail is not None and head.hash != tail.prev):
        raise AuditError(f"audit log {path} ends at seq {last_seq} but {hp.name} says seq {head.seq} "
                         f"was signed: the log was cut or rolled back; run `vaultsim audit verify {path}`")


def _read_back(fd: int, size: int) -> tuple[int, list[bytes], bool]:
    """(offset just past the last complete line, the complete lines from the record
    before the newest head on, whether they start at the file's start)."""
    window = 64 * 1024
    while True:
        start = max(0, size - window)
        buf = os.pread(fd, size - start, start)
        cut = buf.rfind(b"\n") + 1
        if cut or start == 0:
            lines = buf[:cut].split(b"\n")[:-1]
            if start > 0:
                lines = lines[1:]  # may begin mid-line
            for i in range(len(lines) - 1, -1, -1):
                if lines[i].startswith(R.HEAD_START):
                    if i > 0:
                        return start + cut, lines[i - 1:], False
                    if start == 0:
                        return cut, lines, True
                    break
            else:
                if start == 0:
                    return cut, lines, True
        window *= 4


def _first_seq(fd: int, size: int, default: int) -> int:
    """The seq of the first record of a segment (one past its carried head)."""
    # one bounded read: a first line longer than any record is junk (gathered 64 KiB at a
    # time, a 1 GB one took the daemon's start hours of copying)
    buf = os.pread(fd, min(size, MAX_LINE_BYTES + 1), 0)
    line = buf.split(b"\n", 1)[0]
    if line.startswith(R.HEAD_START):
        head = R.parse_head(line)
        return head.seq + 1 if head is not None else default
    rec = R.parse_record(line)
    return rec.seq if rec is not None else default
