"""`vaultsim run --shard K/N`: a deterministic 1/N of the trials, for CI matrices.

A CI matrix (GitHub Actions `strategy.matrix`, GitLab `parallel`) runs the
same command on N machines with K = 1..N; each must pick its own trials with
nothing shared but the inputs, and the N picks must cover every trial exactly
once. So the pick depends only on what was selected, never on the machine,
the file system's listing order or the time:

    every selected trial (case id, trial number)
      -> sorted by (expected cost rank, case id, trial number)
      -> the i-th goes to shard (i mod N) + 1

Dealing round-robin over the cost-sorted list keeps the shards' wall times
close (each gets its share of the slow SSH and timeout trials). Each shard's
report carries `run.shard` (K, N, the count and a fingerprint of the whole
selection), which `vaultsim report merge` checks: same selection, every
shard once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from vault.errors import BadInput

W = TypeVar("W")
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # K, from 1
    count: int  # N

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    m = _SPEC.match(text or "")
    if not m:
        raise BadInput(f"--shard {text!r}: give K/N, e.g. --shard 2/4 (the second of four)")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise BadInput(f"--shard {text!r}: in K/N, K must be from 1 to N (N at least 1)")
    return Shard(k, n)


def canonical(work: Sequence[W], key: Callable[[W], tuple[int, str, int]]) -> list[W]:
    """The selection in the order every machine agrees on: (cost rank, case id, trial)."""
    return sorted(work, key=key)


def pick(work: Sequence[W], shard: Shard, key: Callable[[W], tuple[int, str, int]]) -> list[W]:
    """This shard's trials: every N-th of the canonical order, starting at the K-th."""
    return [w for i, w in enumerate(canonical(work, key)) if i % shard.count == shard.index - 1]


def fingerprint(work: Sequence[W], key: Callable[[W], tuple[int, str, int]]) -> str:
    """A digest of the whole selection: shards of different selections must not be merged."""
    h = hashlib.sha256()
    for _, case_id, trial in sorted(map(key, work)):
        h.update(f"{case_id}\0{trial}\n".encode())
    return h.hexdigest()[:16]


def header(shard: Shard, work: Sequence[W], key: Callable[[W], tuple[int, str, int]]) -> dict[str, Any]:
    """The report's `run.shard`."""
    return {"index": shard.index, "count": shard.count, "selected_trials": len(work),
            "selection": fingerprint(work, key)}
