"""Fourteenth hostile pass: a daemon cut off from its sockets that the runner's fork server started,
one still starting, one SIGSTOPped under `status` and `stop`; a FIFO inside an audit log set; the
writer's abandon off the event loop.

Real processes and files only; no fixed sleeps (events, or polls with a deadline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit_fixtures import FakeClock, FlakyIO, LogFiles  # noqa: F401
from vault.audit import files as F

SEGMENT = 4096


def _write_set(tmp_path: Path, n: int) -> LogFiles:
    from test_audit_rotation import write_set
    return write_set(tmp_path, n)


def _verify_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "vault.cli.main", "audit", "verify", *args],
                          capture_output=True, text=True, timeout=60, env=env)


class TestAFifoInsideALogSet:
    """README: verify exits 1 for anything but intact, 2 for bad input (the LOG named). A member
    of the set that is not a regular file is a set that does not verify: 1, naming the file,
    never opened or waited on; the named LOG itself as a FIFO stays bad input (2)."""

    def test_a_fifo_rotated_segment_is_tampered_exit_1(self, tmp_path: Path) -> None:
        files = _write_set(tmp_path, 120)
        segs = [p for _, p in F.rotated(files.log)]
        assert len(segs) >= 3
        victim = segs[1]
        victim.unlink()
        os.mkfifo(victim, 0o600)
        out = _verify_cli(str(files.log), "--json")
        assert out.returncode == 1, out.stderr
        doc = json.loads(out.stdout)
        assert doc["status"] == "tampered"
        assert victim.name in doc["message"] and "not a regular file" in doc["message"]

    def test_a_directory_rotated_segment_is_tampered_exit_1(self, tmp_path: Path) -> None:
        files = _write_set(tmp_path, 120)
        victim = [p for _, p in F.rotated(files.log)][0]
        victim.unlink()
        victim.mkdir()
        out = _verify_cli(str(files.log))
        assert out.returncode == 1, out.stderr
        assert out.stdout.startswith("tampered") and victim.name in out.stdout

    def test_a_fifo_head_file_is_tampered_exit_1(self, tmp_path: Path) -> None:
        files = _write_set(tmp_path, 120)
        files.head.unlink()
        os.mkfifo(files.head, 0o600)
        out = _verify_cli(str(files.log))
        assert out.returncode == 1, out.stderr
        assert out.stdout.startswith("tampered") and files.head.name in out.stdout

    def test_the_named_log_as_a_fifo_stays_bad_input(self, tmp_path: Path) -> None:
        fifo = tmp_path / "audit.log"
        os.mkfifo(fifo)
        out = _verify_cli(str(fifo))
        assert out.returncode == 2 and "not a regular file" in out.stderr
