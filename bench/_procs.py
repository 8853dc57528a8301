"""Bench harness: the same real-process sandbox the tests use (tests/helpers.py), whose
processes the world starts (vault.runner.world_procs)."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import Sandbox, new_sandbox, wait_for  # noqa: E402,F401


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    ms = sorted(s * 1000 for s in samples_s)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return statistics.median(ms), q[98]


TOKEN = "bench-token"


@dataclass
class Stack:
    """A running vault: its sandbox, the fake remote's URL, and both processes."""

    box: Sandbox
    url: str
    daemon: subprocess.Popen[str]
    remote: subprocess.Popen[str]


@contextlib.contextmanager
def vault_stack(*daemon_args: str, parent: str = "/tmp") -> Iterator[Stack]:
    """A sandbox (under `parent`) with the fake remote, the tracker credential and an unlocked daemon."""
    box = new_sandbox(parent)
    try:
        remote, url = box.start_remote({"tracker_token": TOKEN})
        box.set_secret("tracker_token", TOKEN)
        daemon = box.start_daemon("--remote", url, *daemon_args)
        yield Stack(box, url, daemon, remote)
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


@contextlib.contextmanager
def vault_with_remote(*daemon_args: str, parent: str = "/tmp") -> Iterator[tuple[Sandbox, str]]:
    """`vault_stack` as (sandbox, remote URL)."""
    with vault_stack(*daemon_args, parent=parent) as stack:
        yield stack.box, stack.url
