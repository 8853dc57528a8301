"""Walking an audit log's hash chain: the per-record check both `verify` and its workers run.

Kept apart from `verify` (which orders segments, reads the head file and writes
the report) so that `verify_worker`, a child process walking one rotated
segment, imports only this and never its caller: no import circle.
"""

from __future__ import annotations

import hashlib
import os
from binascii import b2a_hex
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from vault.errors import BadInput
from vault.audit import files as F
from vault.audit import records as R

Status = Literal["intact", "unanchored", "tampered", "truncated", "forked", "unverifiable"]
Problem = tuple[Status, "int | None", str]


class Walk:
    """The state of one pass over the set."""

    __slots__ = ("expected", "prev", "first_seq", "last_signed", "last_head", "problem", "target",
                 "target_hash", "target_line", "paths", "torn")

    def __init__(self, target: int, paths: list[Path]) -> None:
        self.paths = paths  # the segments, read again only to tell a fork from tampering
        self.expected: int | None = None  # the next seq; None before the first line
        self.prev = R.GENESIS
        self.first_seq = 0
        self.last_signed = -1
        self.last_head = b""  # the newest good head line
        self.problem: Problem | None = None
        self.target = target  # the head file's seq: its record's hash and head line are kept
        self.target_hash: bytes | None = None
        self.target_line: bytes | None = None
        self.torn = b""  # what followed the last newline of the segment walked last

    @property
    def records(self) -> int:
        return max(0, (self.expected or 0) - self.first_seq)


def walk_lines(w: Walk, lines: Iterator[bytes], public: Ed25519PublicKey | None) -> None:
    sha256, hexlify = hashlib.sha256, b2a_hex
    hash_sep, rec_start, head_start = R.HASH_SEP, R.RECORD_START, R.HEAD_START
    time_key, prev_key = b',"time":', b',"prev":"'
    expected, prev, target = w.expected or 0, w.prev, w.target
    for line in lines:
        if line.startswith(rec_start):
            body, _, tail = line.rpartition(hash_sep)
            digest = hexlify(sha256(body).digest())
            if tail != digest + b'"}':
                w.problem = ("tampered", expected, f"record {expected} is damaged: its hash does not "
                             "match its bytes")
                break
            # the hash covers the exact text, so only the chain needs checking: the seq's
            # digits as written, and the 64 hex digits after "prev"
            end = body.find(time_key, 7)
            at = body.find(prev_key, end)
            if body[7:end] == b"%d" % expected and body[at + 9:at + 73] == prev:
                prev = digest
                expected += 1
                continue
            fields = body.split(b",", 3)
            try:
                seq, p = int(fields[0][7:]), fields[2][8:-1]
            except (ValueError, IndexError):
                seq, p = -1, b""
            w.expected, w.prev = expected, prev
            w.problem = _chain_problem(w, seq, p, digest, expected)
            return
        if line.startswith(head_start):
            problem = _check_inline_head(line, expected, prev, public, w.last_signed)
            if problem is not None:
                w.problem = problem
                break
            w.last_signed, w.last_head = expected - 1, line
            if expected - 1 == target:
                w.target_line = line
            continue
        if R.SIG_SEP in line:  # a head with a damaged start
            w.problem = ("tampered", max(0, min(w.last_signed + 1, expected - 1)),
                         f"the signed head after record {expected - 1} is damaged")
        else:
            w.problem = ("tampered", expected, f"the line after record {expected - 1} is not a record "
                         "or a head" if expected else "the first line is not a record or a head")
        break
    w.expected, w.prev = expected, prev


def _chain_problem(w: Walk, seq: int, p: bytes, digest: bytes, expected: int) -> Problem:
    if w.first_seq <= seq < expected:
        earlier = _hashes_at(w, {seq - 1, seq})
        before = R.GENESIS if seq == 0 else earlier.get(seq - 1)
        if p == before:
            if digest == earlier.get(seq):
                return ("tampered", expected, f"record {seq} appears again where record {expected} belongs")
            return ("forked", seq, f"two different records {seq} continue the chain from the same prev: "
                    "two writers appended to one log")
    if seq != expected:
        return ("tampered", expected, f"record {expected} is missing or out of order "
                f"(found seq {seq if seq >= 0 else '?'} there)")
    return ("tampered", expected, f"record {expected} does not chain to record {expected - 1} "
            "(prev is not its hash)")


def _hashes_at(w: Walk, seqs: set[int]) -> dict[int, bytes]:
    """The hashes of the first records with these seqs, read again from the files (error path)."""
    found: dict[int, bytes] = {}
    for path in w.paths:
        reader = LineReader(path)
        try:
            for chunk in reader:
                for line in chunk:
                    if not line.startswith(R.RECORD_START):
                        continue
                    body, _, _ = line.rpartition(R.HASH_SEP)
                    try:
                        seq = int(body.split(b",", 1)[0][7:])
                    except ValueError:
                        continue
                    if seq in seqs and seq not in found:
                        found[seq] = b2a_hex(hashlib.sha256(body).digest())
                        if len(found) == len(seqs):
                            return found
        finally:
            reader.close()
    return found


def _check_inline_head(line: bytes, expected: int, prev: bytes, public: Ed25519PublicKey | None,
                       last_signed: int) -> Problem | None:
    # a bad head condemns what it was to anchor: the records since the previous good head
    bad = max(0, min(last_signed + 1, expected - 1))
    head = R.parse_head(line)
    if head is None:
        return ("tampered", bad, f"the signed head after record {expected - 1} is damaged")
    if head.seq != expected - 1 or head.hash != prev:
        return ("tampered", bad, f"the signed head for seq {head.seq} does not match the chain "
                "(records rewritten or moved)")
    if public is not None and not signature_ok(public, head):
        return ("tampered", bad, f"the signature on the head for seq {head.seq} is invalid "
                "(rewritten, or signed by another key)")
    return None


def signature_ok(public: Ed25519PublicKey, head: R.Head) -> bool:
    try:
        public.verify(head.sig, head.message)
    except InvalidSignature:
        return False
    return True


# A record holds at most a 256 KiB event (writer.MAX_EVENT_BYTES), under 400 KiB as base64
# ciphertext; a head is a few hundred bytes. A longer line can only be junk.
MAX_LINE_BYTES = 1 << 20
OVERSIZED = b"(a line longer than 1 MiB)"


class LineReader:
    """A segment's complete lines, a few MiB at a time (memory stays flat on big logs).

    Iterating yields lists of complete lines; afterwards `rest` is what followed
    the last newline (a torn line, or b""). Missing, unreadable, not regular
    (a FIFO or device: refused, never waited on) or plainly not-an-audit-log
    files are BadInput, raised at construction. A line past MAX_LINE_BYTES ends the
    reading as the line OVERSIZED, so a hostile file costs neither memory nor time.
    """

    CHUNK = 4 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rest = b""
        self._fd = F.open_regular(path)
        try:
            first = self._read()
        except BaseException:
            self.close()
            raise
        if (first and R.RECORD_START not in first and R.HEAD_START not in first
                and not R.RECORD_START.startswith(first[:7])):  # a log cut inside its first line is a log
            self.close()
            raise BadInput(f"{path} is not a vaultsim audit log")
        self._first = first

    def _read(self) -> bytes:
        try:
            return os.read(self._fd, self.CHUNK)
        except OSError as exc:
            raise BadInput(f"cannot read audit log {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __iter__(self) -> Iterator[list[bytes]]:
        chunk, rest, self._first = self._first, b"", b""
        while chunk:
            lines = (rest + chunk).split(b"\n")
            del chunk
            rest = lines.pop()
            if len(rest) > MAX_LINE_BYTES:
                # no record is this long: a junk line was held whole and copied once per chunk
                # (a 1 GB line took GBs of memory and minutes); it is a line that is not a record
                lines.append(OVERSIZED)
                rest = b""
                yield lines
                self.close()
                return
            yield lines
            del lines  # before the next chunk is read: one chunk's lines in memory at a time
            chunk = self._read()
        self.rest = rest
        self.close()
