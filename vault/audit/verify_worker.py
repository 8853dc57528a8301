"""A worker process of `verify`: walks whole rotated segments on another core.

Why a process and a module of its own: SHA-256 over records of a few hundred
bytes holds the GIL, so one process verifies at one core's speed; `verify`
starts one of these per core (``python -m vault.audit.verify_worker``), which
re-imports nothing of its caller. Protocol, on stdin: the public key as hex
PEM (or ``-``), the head file's seq (or -1), then one segment path a line;
on stdout: one JSON line per segment, in the same order: where a clean walk
of it ended, or ``null`` if anything was off (`verify` then walks it itself).
"""

from __future__ import annotations

import sys

from .verify import walk_alone


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
