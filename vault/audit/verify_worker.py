"""Verify on every core: rotated segments walked by worker processes.

Why a module of its own: SHA-256 over records of a few hundred bytes holds the
GIL, so one process verifies at one core's speed. For a big set, `verify`
starts one worker per core (``python -m vault.audit.verify_worker``, which
re-imports nothing of its caller, unlike multiprocessing's spawn) and deals
the rotated segments out round-robin; each worker walks its segments from the
signed head each starts with (`walk_alone`), while the parent walks the active
segment, then takes the results in order and stitches the boundaries. A
segment a worker found anything wrong with comes back as ``null`` and is
walked again by the parent, so what is reported, and where, is the same
either way.

Worker protocol, on stdin: the public key as hex PEM (or ``-``), the head
file's seq (or -1), then one segment path a line; on stdout: one JSON line per
segment, in that order: where a clean walk of it ended (`Clean`), or ``null``.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from vault.errors import BadInput
from vault.audit import records as R
from vault.audit.keys import public_pem
from vault.audit.chain import LineReader, Walk, signature_ok, walk_lines

# rotated segments smaller than this in all are walked here: a worker takes about 0.4 s
# to start, about what one core needs for 64 MiB
PARALLEL_MIN_BYTES = 128 << 20


@dataclass(frozen=True)
class Clean:
    """A rotated segment a worker walked without finding anything wrong."""

    first_line: bytes
    expected: int
    prev: bytes
    last_signed: int
    last_head: bytes
    target_hash: bytes | None
    target_line: bytes | None

    def to_wire(self) -> str:
        """One JSON line (lines are bytes: carried as latin-1 text, which maps every byte)."""
        def text(b: bytes | None) -> str | None:
            return None if b is None else b.decode("latin-1")
        return json.dumps({"first_line": text(self.first_line), "expected": self.expected,
                           "prev": text(self.prev), "last_signed": self.last_signed,
                           "last_head": text(self.last_head), "target_hash": text(self.target_hash),
                           "target_line": text(self.target_line)})

    @classmethod
    def from_wire(cls, line: bytes) -> "Clean | None":
        doc = json.loads(line)
        if doc is None:
            return None

        def raw(key: str) -> bytes | None:
            v = doc[key]
            return None if v is None else v.encode("latin-1")
        return cls(raw("first_line") or b"", int(doc["expected"]), raw("prev") or b"", int(doc["last_signed"]),
                   raw("last_head") or b"", raw("target_hash"), raw("target_line"))

    def apply(self, w: Walk) -> None:
        w.expected, w.prev, w.last_signed, w.last_head = self.expected, self.prev, self.last_signed, self.last_head
        w.target_hash = self.target_hash if self.target_hash is not None else w.target_hash
        w.target_line = self.target_line if self.target_line is not None else w.target_line
        w.torn = b""


def walk_alone(path: str, pem: bytes | None, target: int) -> Clean | None:
    """In a worker: walk one rotated segment from the line it starts with. None if anything
    is off (the parent walks it again, to report it exactly)."""
    public = load_pem_public_key(pem) if pem is not None else None
    assert public is None or isinstance(public, Ed25519PublicKey)
    w = Walk(target, [])
    reader = LineReader(Path(path))
    try:
        lines = itertools.chain.from_iterable(reader)
        first = next(lines, None)
        if first is None:
            return None
        if first.startswith(R.HEAD_START):
            head = R.parse_head(first)
            if head is None or (public is not None and not signature_ok(public, head)):
                return None
            w.expected, w.prev, w.last_signed, w.last_head = head.seq + 1, head.hash, head.seq, first
            if head.seq == target:
                w.target_hash, w.target_line = head.hash, first
        else:
            w.expected = 0
            walk_lines(w, iter((first,)), public)
        if w.problem is None:
            walk_lines(w, lines, public)
    except BadInput:
        return None
    finally:
        reader.close()
    if w.problem is not None or reader.rest or w.expected is None:
        return None
    return Clean(first, w.expected, w.prev, w.last_signed, w.last_head, w.target_hash, w.target_line)


class Workers:
    """Rotated segments walked by worker processes (``python -m vault.audit.verify_worker``,
    one per core, segments dealt round-robin), while this process goes through the set in
    order and takes each result when it gets there."""

    def __init__(self, segments: list[tuple[int | None, Path]], public: Ed25519PublicKey | None,
                 target: int, jobs: int | None) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._worker_of: dict[int, int] = {}
        self._here: dict[int, Clean | None] = {}  # walked in this process while the workers run
        rotated = [i for i, (name_seq, _) in enumerate(segments) if name_seq is not None]
        if jobs is None:
            jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            if sum(_size(segments[i][1]) for i in rotated) < PARALLEL_MIN_BYTES:
                jobs = 1
        jobs = min(jobs, len(rotated))
        if jobs < 2:
            return
        pem = public_pem(public).hex() if public is not None else "-"
        # the package this module came from, importable in the worker whatever the caller's path
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        for k in range(jobs):
            mine = rotated[k::jobs]
            for i in mine:
                self._worker_of[i] = k
            proc = subprocess.Popen([sys.executable, "-m", "vault.audit.verify_worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            self._procs.append(proc)
            job = "\n".join([pem, str(target), *(str(segments[i][1]) for i in mine)]) + "\n"
            assert proc.stdin is not None
            try:
                proc.stdin.write(job.encode())
                proc.stdin.close()
            except OSError:  # it died at once: its segments are walked here
                pass
        # meanwhile this process walks the active segment (the only one not dealt out)
        for i, (name_seq, path) in enumerate(segments):
            if name_seq is None:
                self._here[i] = walk_alone(str(path), None if pem == "-" else bytes.fromhex(pem), target)

    def result(self, i: int) -> Clean | None:
        if i in self._here:
            return self._here.pop(i)
        k = self._worker_of.get(i)
        if k is None:
            return None
        out = self._procs[k].stdout
        assert out is not None
        try:
            return Clean.from_wire(out.readline())
        except (OSError, ValueError, KeyError, TypeError):  # a worker that died: walk it here
            return None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def main() -> None:
    lines = sys.stdin.read().splitlines()
    pem = None if lines[0] == "-" else bytes.fromhex(lines[0])
    target = int(lines[1])
    for path in lines[2:]:
        try:
            clean = walk_alone(path, pem, target)
        except Exception:  # anything unexpected: the parent walks this one itself
            clean = None
        sys.stdout.write(("null" if clean is None else clean.to_wire()) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
