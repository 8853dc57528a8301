"""Offline verification of an audit log: no data key, only the public key.

`verify` walks the log once, in file order, and reports the first problem:

* ``tampered``  a record whose hash does not match its bytes; a line that is
  neither a record nor a head; a seq that is not the next one (a deleted or
  reordered record: first_bad_seq is where the order breaks); a prev that is
  not the previous hash; a record repeated verbatim; a head that is malformed,
  does not name the record just before it, or whose signature fails (then
  first_bad_seq is the first record that head was to anchor: after a rewrite
  with recomputed hashes we know the span, not the record); a head file whose
  head is damaged, unsigned, or names a hash the log does not have at that seq.
* ``forked``    a self-consistent record whose prev is the hash of an earlier
  record that already has a successor: two records with the same prev, i.e.
  two writers continued the same chain (the lock makes this impossible for
  honest writers on one host). first_bad_seq is the seq of the second branch.
* ``truncated`` the log is a clean prefix of a longer one: its last line is
  torn (no newline; first_bad_seq is that line's seq), or ``NAME.head`` names
  a signed head the log does not reach (first_bad_seq is the first missing
  seq, or the head's seq when only the head line itself is gone).
* ``unverifiable`` the chain is consistent but nothing can vouch for it: no
  public key (``NAME.pub`` missing or unreadable), or no signed head at all.
* ``intact``    everything checks. Records after the last signed head are
  reported as ``unanchored`` (a live or crashed writer has not signed them
  yet); a cut at a line boundary after the last head is undetectable, which is
  why the writer signs at close and keeps ``NAME.head``. Without the head file
  the message says that a cut after the last inline head cannot be ruled out.

What offline verification cannot catch: an attacker who replaces ``NAME.pub``
and re-signs everything (pin the key with ``public_key_path``), or who rolls
back the log *and* the head file together (needs an external witness).

Speed: the per-record path is one ``rpartition``, one SHA-256, one split and an
``int``; the hash covers every byte of the record text, so no strict parse is
needed there. Heads (rare) get the strict regex and an Ed25519 check.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict

from ..errors import BadInput
from . import records as R
from .keys import load_public_key

Status = Literal["intact", "tampered", "truncated", "forked", "unverifiable"]


class VerifyReport(BaseModel):
    """What `verify` found. `records` counts records checked before any problem."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Status
    first_bad_seq: int | None = None
    records: int = 0
    last_signed_seq: int | None = None
    unanchored: int = 0
    message: str

    @property
    def intact(self) -> bool:
        return self.status == "intact"


class _Walk:
    """The result of one pass over the complete lines."""

    __slots__ = ("records", "hashes", "last_signed", "signed_lines", "problem")

    def __init__(self) -> None:
        self.records = 0
        self.hashes: list[bytes] = []
        self.last_signed = -1
        self.signed_lines: set[bytes] = set()
        self.problem: tuple[Status, int | None, str] | None = None


def verify(path: str | os.PathLike[str], public_key_path: str | os.PathLike[str] | None = None, *,
           head_path: str | os.PathLike[str] | None = None) -> VerifyReport:
    """Check `path` offline. BadInput if it is missing or not an audit log at all."""
    path = Path(path)
    public, key_problem = _public_key(path, public_key_path)
    reader = _LineReader(path)
    walk = _walk(itertools.chain.from_iterable(reader), public)
    torn = reader.rest
    n, last = walk.records, walk.last_signed

    def report(status: Status, bad: int | None, message: str) -> VerifyReport:
        return VerifyReport(status=status, first_bad_seq=bad, records=n,
                            last_signed_seq=last if last >= 0 else None,
                            unanchored=max(0, n - 1 - last) if status == "intact" else 0,
                            message=message)

    if walk.problem is not None:
        return report(*walk.problem)
    if torn:
        seq = n - 1 if torn.startswith(R.HEAD_START[:3]) and n else n
        return report("truncated", seq, f"the last line (seq {seq}) is torn: the log was cut "
                      "or its writer died mid-write")
    anchor_note = ""
    hp = Path(head_path) if head_path is not None else R.head_path(path)
    try:
        side = hp.read_bytes()
    except FileNotFoundError:
        side = None
        anchor_note = f"; no head file {hp.name}: a cut after the last signed head cannot be ruled out"
    except OSError as exc:
        raise BadInput(f"cannot read head file {hp}: {exc.strerror}") from None
    if side is not None:
        problem = _check_head_file(hp, side, public, walk)
        if problem is not None:
            return report(*problem)
    if public is None:
        return report("unverifiable", None, f"{key_problem}: the chain of {n} records is consistent "
                      "but its signatures cannot be checked")
    if n and last < 0:
        return report("unverifiable", None, f"no signed head in {n} records: nothing anchors the chain")
    message = f"{n} records" + (f", last signed head at seq {last}" if last >= 0 else "")
    if n - 1 > last:
        k = n - 1 - last
        message += f"; {k} record{'s' if k != 1 else ''} after it {'are' if k != 1 else 'is'} " \
                   "not yet anchored by a signed head"
    return report("intact", None, message + anchor_note)


def _walk(lines: Iterable[bytes], public: Ed25519PublicKey | None) -> _Walk:
    w = _Walk()
    sha256 = hashlib.sha256
    hash_sep, rec_start, head_start = R.HASH_SEP, R.RECORD_START, R.HEAD_START
    hashes = w.hashes
    keep = hashes.append
    expected, prev = 0, R.GENESIS
    for line in lines:
        if line.startswith(rec_start):
            body, _, tail = line.rpartition(hash_sep)
            digest = sha256(body).hexdigest().encode()
            if tail != digest + b'"}':
                w.problem = ("tampered", expected, f"record {expected} is damaged: its hash does not "
                             "match its bytes")
                break
            fields = body.split(b",", 3)
            try:
                seq, p = int(fields[0][7:]), fields[2][8:-1]
            except (ValueError, IndexError):
                seq, p = -1, b""
            if seq == expected and p == prev:
                keep(digest)
                prev = digest
                expected += 1
                continue
            w.problem = _chain_problem(seq, p, digest, expected, hashes)
            break
        if line.startswith(head_start):
            w.records = expected
            problem = _check_inline_head(line, expected, prev, public, w.last_signed)
            if problem is not None:
                w.problem = problem
                break
            w.last_signed = expected - 1
            w.signed_lines.add(line)
            continue
        if R.SIG_SEP in line:  # a head with a damaged start
            w.problem = ("tampered", max(0, min(w.last_signed + 1, expected - 1)),
                         f"the signed head after record {expected - 1} is damaged")
        else:
            w.problem = ("tampered", expected, f"the line after record {expected - 1} is not a record "
                         "or a head" if expected else "the first line is not a record or a head")
        break
    w.records = expected
    return w


def _chain_problem(seq: int, p: bytes, digest: bytes, expected: int,
                   hashes: list[bytes]) -> tuple[Status, int | None, str]:
    if 0 <= seq < expected and p == (hashes[seq - 1] if seq else R.GENESIS):
        if digest == hashes[seq]:
            return ("tampered", expected, f"record {seq} appears again where record {expected} belongs")
        return ("forked", seq, f"two different records {seq} continue the chain from the same prev: "
                "two writers appended to one log")
    if seq != expected:
        return ("tampered", expected, f"record {expected} is missing or out of order "
                f"(found seq {seq if seq >= 0 else '?'} there)")
    return ("tampered", expected, f"record {expected} does not chain to record {expected - 1} "
            "(prev is not its hash)")


def _check_inline_head(line: bytes, expected: int, prev: bytes, public: Ed25519PublicKey | None,
                       last_signed: int) -> tuple[Status, int | None, str] | None:
    # a bad head condemns what it was to anchor: the records since the previous good head
    bad = max(0, min(last_signed + 1, expected - 1))
    head = R.parse_head(line)
    if head is None:
        return ("tampered", bad, f"the signed head after record {expected - 1} is damaged")
    if head.seq != expected - 1 or head.hash != prev:
        return ("tampered", bad, f"the signed head for seq {head.seq} does not match the chain "
                "(records rewritten or moved)")
    if public is not None and not _signature_ok(public, head):
        return ("tampered", bad, f"the signature on the head for seq {head.seq} is invalid "
                "(rewritten, or signed by another key)")
    return None


def _check_head_file(hp: Path, side: bytes, public: Ed25519PublicKey | None,
                     walk: _Walk) -> tuple[Status, int | None, str] | None:
    n = walk.records
    head = R.parse_head(side[:-1]) if side.endswith(b"\n") else None
    if head is None:
        return ("tampered", None, f"the head file {hp.name} is damaged")
    if side[:-1] in walk.signed_lines:  # the same line, already checked in the log
        return None
    if public is not None and not _signature_ok(public, head):
        return ("tampered", None, f"the signature in head file {hp.name} is invalid")
    if head.seq >= n:
        return ("truncated", n, f"the log ends before seq {head.seq}, which {hp.name} says was signed: "
                f"records from seq {n} on are missing")
    if walk.hashes[head.seq] != head.hash:
        return ("tampered", head.seq, f"record {head.seq} is not the one {hp.name} says was signed "
                "(log rolled back and rewritten?)")
    if head.seq == n - 1:
        return ("truncated", head.seq, f"the signed head for seq {head.seq} ({hp.name}) was cut "
                "from the end of the log")
    return ("tampered", head.seq, f"the signed head for seq {head.seq} ({hp.name}) was removed from the log")


def _signature_ok(public: Ed25519PublicKey, head: R.Head) -> bool:
    try:
        public.verify(head.sig, head.message)
    except InvalidSignature:
        return False
    return True


class _LineReader:
    """The log's complete lines, a few MiB at a time (memory stays flat on big logs).

    Iterating yields lists of complete lines; afterwards `rest` is what followed
    the last newline (a torn line, or b""). Missing, unreadable or plainly
    not-an-audit-log files are BadInput, raised before the first line.
    """

    CHUNK = 4 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rest = b""
        try:
            self._file = open(path, "rb")  # noqa: SIM115 - closed when iteration ends
            first = self._file.read(self.CHUNK)
        except FileNotFoundError:
            raise BadInput(f"no audit log at {path}") from None
        except IsADirectoryError:
            raise BadInput(f"{path} is a directory, not an audit log") from None
        except OSError as exc:
            raise BadInput(f"cannot read audit log {path}: {exc.strerror}") from None
        if (first and R.RECORD_START not in first and R.HEAD_START not in first
                and not R.RECORD_START.startswith(first[:7])):  # a log cut inside its first line is a log
            self._file.close()
            raise BadInput(f"{path} is not a vaultsim audit log")
        self._first = first

    def __iter__(self) -> Iterator[list[bytes]]:
        with self._file:
            chunk, rest = self._first, b""
            while chunk:
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                yield lines
                try:
                    chunk = self._file.read(self.CHUNK)
                except OSError as exc:
                    raise BadInput(f"cannot read audit log {self.path}: {exc.strerror}") from None
            self.rest = rest


def _public_key(log: Path, explicit: str | os.PathLike[str] | None) -> tuple[Ed25519PublicKey | None, str]:
    p = Path(explicit) if explicit is not None else R.pub_path(log)
    try:
        return load_public_key(p), ""
    except FileNotFoundError:
        if explicit is not None:
            raise BadInput(f"no public key at {p}") from None
        return None, f"no public key {p.name} beside the log"
    except ValueError:
        return None, f"{p} is not an Ed25519 public key"
    except OSError as exc:
        if explicit is not None:
            raise BadInput(f"cannot read public key {p}: {exc.strerror}") from None
        return None, f"cannot read public key {p}: {exc.strerror}"
