"""Offline verification of an audit log: no data key, only the public key.

`verify` walks the log once, in file order, segment after segment (oldest
first, the active ``NAME.log`` last), and reports the first problem:

* ``tampered``  a record whose hash does not match its bytes; a line that is
  neither a record nor a head; a seq that is not the next one (a deleted or
  reordered record: first_bad_seq is where the order breaks); a prev that is
  not the previous hash; a record repeated verbatim; a head that is malformed,
  does not name the record just before it, or whose signature fails (then
  first_bad_seq is the first record that head was to anchor: after a rewrite
  with recomputed hashes we know the span, not the record); a head file whose
  head is damaged, unsigned, or names a hash the log does not have at that
  seq; a segment that does not start with the previous segment's head, or
  whose name does not match its first seq.
* ``forked``    a self-consistent record whose prev is the hash of an earlier
  record that already has a successor: two records with the same prev, i.e.
  two writers continued the same chain (the lock makes this impossible for
  honest writers on one host); or a segment that continues the chain from an
  earlier point than where the previous segment ends. first_bad_seq is the
  seq of the second branch.
* ``truncated`` the log is a clean prefix of a longer one: its last line is
  torn (no newline; first_bad_seq is that line's seq), ``NAME.head`` names a
  signed head the log does not reach (first_bad_seq is the first missing seq,
  or the head's seq when only the head line itself is gone), or a segment in
  the middle of the set is missing (first_bad_seq is its first seq).
* ``unverifiable`` the chain is consistent but nothing can vouch for it: no
  public key (``NAME.pub`` missing or unreadable), or no signed head at all.
* ``unanchored`` everything checks, but the newest records come after the last
  signed head, so no signature covers them yet: a running daemon signs them
  within ``head_every_seconds`` (5 s) and at stop; a daemon that was killed
  signs them when it next starts, after checking that each one decrypts with
  the vault key (the writer's rule for the same tail, see `writer`). Until
  then nothing offline shows that they were not appended by someone else.
* ``intact``    everything checks and the last record is signed. A cut at a
  line boundary after the last head is undetectable without ``NAME.head``,
  which is why the writer signs at close and keeps it; without the head file
  the message says that such a cut cannot be ruled out.

Segments removed at the start of the set (retention) are reported as such,
not as a problem: the first kept segment starts with a signed head naming the
record before it, so what remains is anchored (``first_seq`` > 0).

What offline verification cannot catch: an attacker who replaces ``NAME.pub``
and re-signs everything (pin the key with ``public_key_path``), who rolls
back the log *and* the head file together (needs an external witness), or who
removes the oldest segments (indistinguishable from retention; the report
says which seqs are not there).

Memory stays flat however long the set: lines are read a few MiB at a time
and no per-record state is kept (a fork's earlier branch is found by reading
the files again, on that error path only).

A big set is checked on every core (`verify_worker`): rotated segments go to
worker processes, this process walks the active segment and stitches the
boundaries; a segment a worker found anything wrong with is walked again
here, so what is reported, and where, is the same either way.

Speed: the per-record path is one ``rpartition``, one SHA-256, one split and an
``int``; the hash covers every byte of the record text, so no strict parse is
needed there. Heads (rare) get the strict regex and an Ed25519 check.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path


from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict

from vault.errors import BadInput
from vault.audit import files as F
from vault.audit import records as R
from vault.audit.chain import LineReader, Problem, Status, Walk, _hashes_at, signature_ok, walk_lines
from vault.audit.keys import load_public_key



class VerifyReport(BaseModel):
    """What `verify` found. `records` counts records checked before any problem;
    `first_seq` is the first seq present (above 0 when older segments were removed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Status
    first_bad_seq: int | None = None
    records: int = 0
    last_signed_seq: int | None = None
    unanchored: int = 0
    segments: int = 1
    first_seq: int = 0
    message: str

    @property
    def intact(self) -> bool:
        return self.status == "intact"


def verify(path: str | os.PathLike[str], public_key_path: str | os.PathLike[str] | None = None, *,
           head_path: str | os.PathLike[str] | None = None, segment_only: bool = False,
           jobs: int | None = None) -> VerifyReport:
    """Check the log set of `path` offline (or one segment: a rotated segment's path, or
    `segment_only`). BadInput if it is missing, not a regular file, or not an audit log.
    `jobs`: worker processes for rotated segments (default: the usable cores, for a set
    of at least `PARALLEL_MIN_BYTES`; 1: none)."""
    path = Path(path)
    one = segment_only or F.SEGMENT_RE.fullmatch(path.name) is not None
    base = F.base_of(path)
    if one:
        segments: list[tuple[int | None, Path]] = [(_name_seq(path), path)]
    else:
        segments = [(first, p) for first, p in F.rotated(base)]
        if os.path.lexists(base) or not segments:
            segments.append((None, base))
    public, key_problem = _public_key(base, public_key_path)
    hp = Path(head_path) if head_path is not None else R.head_path(base)
    check_head_file = not (one and path != base)  # the head file belongs to the newest segment
    side: bytes | None = None
    anchor_note = ""
    member_problem = ""  # a file of the set (not the LOG named) that is no log file: tampered, exit 1
    if check_head_file:
        try:
            side = F.read_small(hp, "head file", limit=4096)
        except FileNotFoundError:
            anchor_note = f"; no head file {hp.name}: a cut after the last signed head cannot be ruled out"
        except BadInput as exc:
            if head_path is not None:
                raise
            member_problem = f"head file: {exc.message}"
    side_head = R.parse_head(side[:-1]) if side is not None and side.endswith(b"\n") else None
    w = Walk(side_head.seq if side_head is not None else -1, [p for _, p in segments])
    torn = b""
    from vault.audit.verify_worker import Workers  # (it imports this module)

    with Workers(segments, public, w.target, jobs) as workers:
        for i, (name_seq, seg) in enumerate(segments):
            clean = workers.result(i)
            if clean is not None:  # a worker walked it: check where it starts, take where it ends
                _start_segment(w, iter((clean.first_line,)), seg, name_seq, public, i == 0, one)
                if w.problem is not None:
                    break
                clean.apply(w)
                continue
            if not _walk_file(w, segments, i, public, one, path):
                break
            torn = w.torn
    n, last = w.records, w.last_signed
    expected = w.expected or 0

    def report(status: Status, bad: int | None, message: str) -> VerifyReport:
        unanchored = max(0, expected - 1 - last) if status in ("intact", "unanchored") else 0
        return VerifyReport(status=status, first_bad_seq=bad, records=n,
                            last_signed_seq=last if last >= 0 else None, unanchored=unanchored,
                            segments=len(segments), first_seq=w.first_seq, message=message)

    if w.problem is not None:
        return report(*w.problem)
    if member_problem:
        return report("tampered", None, member_problem)
    if torn:
        seq = expected - 1 if torn.startswith(R.HEAD_START[:3]) and n else expected
        return report("truncated", seq, f"the last line (seq {seq}) is torn: the log was cut "
                      "or its writer died mid-write")
    if side is not None:
        problem = _check_head_file(hp, side, side_head, public, w)
        if problem is not None:
            return report(*problem)
    if public is None:
        return report("unverifiable", None, f"{key_problem}: the chain of {n} records is consistent "
                      "but its signatures cannot be checked")
    if n and last < 0:
        return report("unverifiable", None, f"no signed head in {n} records: nothing anchors the chain")
    message = f"{n} records" + (f", last signed head at seq {last}" if last >= 0 else "")
    if len(segments) > 1 or one:
        message += f", {len(segments)} segment{'s' if len(segments) != 1 else ''}"
    if w.first_seq > 0:
        message += (f"; records 0-{w.first_seq - 1} are not here (older segments removed by retention, "
                    f"or deleted), what remains is anchored by the signed head at seq {w.first_seq - 1}")
    if expected - 1 > last:
        k = expected - 1 - last
        message += (f"; {k} record{'s' if k != 1 else ''} after it {'are' if k != 1 else 'is'} not yet "
                    "anchored by a signed head (a running daemon signs within 5 s and at stop; one that "
                    "was killed, or whose log could not be written (a full disk), signs them at its next "
                    "start, after checking them with the vault key)")
        return report("unanchored", last + 1, message + anchor_note)
    return report("intact", None, message + anchor_note)


def _walk_file(w: Walk, segments: list[tuple[int | None, Path]], i: int,
               public: Ed25519PublicKey | None, one: bool, named: Path) -> bool:
    """Walk segment `i` here; False once a problem is found. The LOG named that is no log is
    bad input (BadInput); another file of its set that is none (a FIFO, a directory, not a
    log) is a set that does not verify: `tampered`, naming it (README: exit 1)."""
    name_seq, seg = segments[i]
    try:
        reader = LineReader(seg)
    except BadInput as exc:
        if seg == named:
            raise
        w.problem = ("tampered", w.expected, f"segment {seg.name}: {exc.message}")
        return False
    try:
        lines = itertools.chain.from_iterable(reader)
        _start_segment(w, lines, seg, name_seq, public, i == 0, one)
        if w.problem is None:
            walk_lines(w, lines, public)
    finally:
        reader.close()
    if w.problem is None and reader.rest and i < len(segments) - 1:
        w.problem = ("tampered", w.expected, f"segment {seg.name} ends with a torn line, "
                     "though a later segment follows it")
    w.torn = reader.rest
    return w.problem is None


def _name_seq(path: Path) -> int | None:
    m = F.SEGMENT_RE.fullmatch(path.name)
    return int(m["first"]) if m else None


def _start_segment(w: Walk, lines: Iterator[bytes], seg: Path, name_seq: int | None,
                   public: Ed25519PublicKey | None, first: bool, one_segment: bool) -> None:
    """Check the line a segment starts with against where the chain stands."""
    line = next(lines, None)
    if line is None:
        if w.expected is None:
            w.expected = 0
        elif name_seq is not None:
            w.problem = ("tampered", w.expected, f"segment {seg.name} is empty")
        return
    if not line.startswith(R.HEAD_START):
        if w.expected is None:  # the very first segment, from seq 0
            w.expected = 0
        elif not first:
            w.problem = ("tampered", w.expected, f"segment {seg.name} does not start with the signed head "
                         "that ended the segment before it")
            return
        if name_seq is not None and name_seq != w.expected:
            w.problem = ("tampered", w.expected, f"segment {seg.name} is named for seq {name_seq} "
                         f"but starts at seq {w.expected}")
            return
        walk_lines(w, iter((line,)), public)
        return
    head = R.parse_head(line)
    bad = w.expected if w.expected is not None else 0
    if head is None:
        w.problem = ("tampered", bad, f"the signed head segment {seg.name} starts with is damaged")
        return
    if name_seq is not None and name_seq != head.seq + 1:
        w.problem = ("tampered", head.seq + 1, f"segment {seg.name} is named for seq {name_seq} "
                     f"but starts at seq {head.seq + 1}")
        return
    signed = public is None or line == w.last_head or signature_ok(public, head)
    if w.expected is None and name_seq is None and not one_segment:
        # the active segment first: no rotated segment is here, so the log must start at seq 0
        w.problem = ("tampered", 0, f"{seg.name} starts at seq {head.seq + 1} and no older segment "
                     "is here: records from seq 0 on are missing")
        return
    if w.expected is None:  # the first segment present: older ones were removed by retention
        if not signed:
            w.problem = ("tampered", head.seq + 1, f"the head segment {seg.name} starts with is not signed "
                         "by this log's key")
            return
        w.expected = w.first_seq = head.seq + 1
        w.prev = head.hash
    elif (head.seq, head.hash) != (w.expected - 1, w.prev):
        if not signed:
            w.problem = ("tampered", w.expected, f"the head segment {seg.name} starts with is not signed "
                         "by this log's key")
        elif head.seq > w.expected - 1:
            w.problem = ("truncated", w.expected, f"records {w.expected}-{head.seq} are missing: a segment "
                         f"before {seg.name} is gone")
        else:
            w.problem = ("forked", head.seq + 1, f"segment {seg.name} continues the chain from seq {head.seq}, "
                         f"but the segment before it goes on to seq {w.expected - 1}: two writers")
        return
    elif not signed:
        w.problem = ("tampered", w.expected, f"the head segment {seg.name} starts with is not signed "
                     "by this log's key")
        return
    w.last_signed, w.last_head = head.seq, line
    if head.seq == w.target:
        w.target_hash, w.target_line = head.hash, line


def _check_head_file(hp: Path, side: bytes, head: R.Head | None, public: Ed25519PublicKey | None,
                     w: Walk) -> Problem | None:
    end = w.expected or 0
    if head is None:
        return ("tampered", None, f"the head file {hp.name} is damaged")
    if side[:-1] == w.target_line:  # the same line, already checked in the log
        return None
    if public is not None and not signature_ok(public, head):
        return ("tampered", None, f"the signature in head file {hp.name} is invalid")
    if head.seq >= end:
        return ("truncated", end, f"the log ends before seq {head.seq}, which {hp.name} says was signed: "
                f"records from seq {end} on are missing")
    if head.seq < w.first_seq:
        return None  # in a segment no longer here: nothing left to compare it with
    if w.target_hash is None:  # not signed inline where it should be: read that record's hash
        w.target_hash = _hashes_at(w, {head.seq}).get(head.seq)
    if w.target_hash != head.hash:
        return ("tampered", head.seq, f"record {head.seq} is not the one {hp.name} says was signed "
                "(log rolled back and rewritten?)")
    if head.seq == end - 1:
        return ("truncated", head.seq, f"the signed head for seq {head.seq} ({hp.name}) was cut "
                "from the end of the log")
    return ("tampered", head.seq, f"the signed head for seq {head.seq} ({hp.name}) was removed from the log")


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
