"""The audit log's on-disk format: one place that writes and parses its lines.

The log is a file of ASCII lines, each a JSON object with a fixed key order and
no whitespace, ended by ``\\n``. Two kinds of line:

Record (one audited event)::

    {"seq":7,"time":1700000000.123456,"prev":"<64 hex>","nonce":"<b64>","ct":"<b64>","hash":"<64 hex>"}

* ``seq``   0, 1, 2, ... with no gap; decimal, no leading zero.
* ``time``  commit time, seconds since the epoch, always printed ``%.6f``.
* ``prev``  ``hash`` of record ``seq - 1``; for seq 0 the genesis value, 64 zeros.
* ``nonce`` 12 random bytes, standard base64.
* ``ct``    AES-256-GCM(key, nonce, event JSON, aad), standard base64, where
            aad = ``b"vaultsim.audit.v1\\0" + seq + b"\\0" + time + b"\\0" + prev``
            (the ASCII texts as they appear in the line).
* ``hash``  lowercase hex SHA-256 of the record's *canonical encoding*: the
            line's own bytes up to (not including) ``,"hash":"``, i.e.
            ``{"seq":7,"time":...,"prev":"...","nonce":"...","ct":"..."``.

  Hashing the exact text (rather than re-serialised values) means that no byte
  of a record can change without changing its hash: not a key name, not a base64
  padding bit, not the digits of ``time`` (``time`` is covered too, beyond the
  seq/prev/nonce/ct of DESIGN.md, so the timestamps are tamper-evident offline).
  The chain is over ciphertext, so checking it needs no key.

Signed head (anchors the chain up to the record just before it)::

    {"head":{"seq":7,"hash":"<hash of record 7>","time":1700000000.123456},"sig":"<128 hex>"}

* ``sig`` is Ed25519 over the line's bytes up to (not including) ``,"sig":"``,
  i.e. ``{"head":{"seq":7,"hash":"...","time":...}``; hex, so it has exactly one
  spelling. The writer puts a head right after the record it names, never twice
  for the same record.

Beside ``NAME.log`` live ``NAME.pub`` (the Ed25519 public key, PEM) and
``NAME.head`` (a copy of the newest head line, replaced atomically after that
line is durable in the log). The head file is the anchor that makes a log cut at
a line boundary detectable: its head must still be found in the log.

Segments (see `files`): the log rotates into segments ``NAME.<first seq>.log``.
Every segment but the first begins with a copy of the signed head that ended
the previous one (it names that segment's last record), then a
``segment_started`` record that chains to it (prev = that head's hash, seq
one past it). So each segment can be checked on its own, anchored at its start
by a signature, and the set is one unbroken chain.
"""

from __future__ import annotations

import base64
import hashlib
import re
from binascii import b2a_base64, b2a_hex
from dataclasses import dataclass
from pathlib import Path

from vault.audit.files import base_of

GENESIS = b"0" * 64
AAD_TAG = b"vaultsim.audit.v1\x00"
HASH_SEP = b',"hash":"'
SIG_SEP = b',"sig":"'
RECORD_START = b'{"seq":'
HEAD_START = b'{"head":'
NONCE_BYTES = 12

# strict shapes, used where a line is read one at a time (open, show, heads);
# verify's hot loop relies on the hash covering the exact text instead
RECORD_RE = re.compile(
    rb'\{"seq":(0|[1-9][0-9]*),"time":(-?[0-9]+\.[0-9]{6}),"prev":"([0-9a-f]{64})",'
    rb'"nonce":"([A-Za-z0-9+/]{16})","ct":"([A-Za-z0-9+/]+={0,2})","hash":"([0-9a-f]{64})"\}'
)
HEAD_RE = re.compile(
    rb'\{"head":\{"seq":(0|[1-9][0-9]*),"hash":"([0-9a-f]{64})","time":(-?[0-9]+\.[0-9]{6})\},'
    rb'"sig":"([0-9a-f]{128})"\}'
)


def pub_path(log: Path) -> Path:
    """Where the public key of `log` lives (``audit.log`` -> ``audit.pub``; a rotated
    segment ``audit.000000001000.log`` shares its set's)."""
    return _base(log).with_suffix(".pub")


def head_path(log: Path) -> Path:
    """Where the newest signed head of `log`'s set is kept (``audit.head``)."""
    return _base(log).with_suffix(".head")


def _base(log: Path) -> Path:
    return base_of(Path(log))


def time_text(t: float) -> bytes:
    return b"%.6f" % t


def aad(seq: bytes, time_b: bytes, prev: bytes) -> bytes:
    return AAD_TAG + seq + b"\x00" + time_b + b"\x00" + prev


def record_line(seq: int, time_b: bytes, prev: bytes, nonce: bytes, ct: bytes) -> tuple[bytes, bytes]:
    """Encode one record; returns (line with newline, its hash as hex bytes)."""
    body = b'{"seq":%d,"time":%s,"prev":"%s","nonce":"%s","ct":"%s"' % (
        seq, time_b, prev, b2a_base64(nonce, newline=False), b2a_base64(ct, newline=False))
    digest = b2a_hex(hashlib.sha256(body).digest())
    return body + HASH_SEP + digest + b'"}\n', digest


def head_message(seq: int, digest: bytes, time_b: bytes) -> bytes:
    return b'{"head":{"seq":%d,"hash":"%s","time":%s}' % (seq, digest, time_b)


def head_line(message: bytes, sig: bytes) -> bytes:
    return message + SIG_SEP + sig.hex().encode() + b'"}\n'


@dataclass(frozen=True)
class Record:
    seq: int
    time: float
    time_b: bytes
    prev: bytes
    nonce: bytes
    ct: bytes
    hash: bytes

    @property
    def aad(self) -> bytes:
        return aad(b"%d" % self.seq, self.time_b, self.prev)


@dataclass(frozen=True)
class Head:
    seq: int
    hash: bytes
    time: float
    message: bytes  # the signed bytes
    sig: bytes


def parse_record(line: bytes) -> Record | None:
    """A strictly well-formed record whose hash matches its text, else None."""
    m = RECORD_RE.fullmatch(line)
    if m is None:
        return None
    body = line[: m.start(6) - len(HASH_SEP)]
    if b2a_hex(hashlib.sha256(body).digest()) != m.group(6):
        return None
    seq, time_b, prev, nonce, ct, digest = m.groups()
    return Record(int(seq), float(time_b), time_b, prev, base64.b64decode(nonce),
                  base64.b64decode(ct), digest)


def parse_head(line: bytes) -> Head | None:
    """A strictly well-formed head line (signature not checked here), else None."""
    m = HEAD_RE.fullmatch(line)
    if m is None:
        return None
    message = line[: m.start(4) - len(SIG_SEP)]
    return Head(int(m.group(1)), m.group(2), float(m.group(3)), message, bytes.fromhex(m.group(4).decode()))
