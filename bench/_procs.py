"""Bench harness: the same real-process sandbox the tests use (tests/helpers.py)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import Sandbox, new_sandbox, wait_for  # noqa: E402,F401


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    ms = sorted(s * 1000 for s in samples_s)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return statistics.median(ms), q[98]
