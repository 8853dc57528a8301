"""Per-test cost of the pytest plugin's `vaultsim` fixture: set-up plus teardown.

The fixture's own code path (vault.pytest_plugin.world.VaultsimFactory on the
session's Engine): a fresh home and embedded keyring, fresh credentials in the
store, the fake remote started, a daemon forked from the session's fork server
and answering, the scripted approver subscribed; then everything stopped and
removed. The first world of a session also pays for the fork server's imports
(shown apart). Then the same through pytest: N tests that only take the fixture,
against N tests that take nothing. Target: under 300 ms per test on 2 cores.

    .venv/bin/python bench/fixture.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N = int(sys.argv[1]) if len(sys.argv) > 1 else 30


def direct() -> None:
    from vault.pytest_plugin.world import VaultsimFactory
    from vault.runner.live import Engine

    t0 = time.perf_counter()
    engine = Engine()
    parent = Path(tempfile.mkdtemp(prefix="vsb-", dir="/tmp"))
    try:
        setups, teardowns = [], []
        for i in range(N + 1):
            factory = VaultsimFactory(engine, parent, f"bench-{i}")
            a = time.perf_counter()
            factory()
            b = time.perf_counter()
            factory.close()
            c = time.perf_counter()
            if i == 0:
                print(f"first world of a session (engine + fork server imports): {(c - t0) * 1000:.0f} ms")
                continue
            setups.append(b - a)
            teardowns.append(c - b)
    finally:
        engine.close()
        os.rmdir(parent)
    total = [s + t for s, t in zip(setups, teardowns)]
    ms = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] * 1000  # noqa: E731
    print(f"per test, {N} worlds: set-up p50 {ms(setups, 50):.0f} ms, teardown p50 {ms(teardowns, 50):.0f} ms, "
          f"set-up + teardown p50 {ms(total, 50):.0f} ms, p90 {ms(total, 90):.0f} ms, max {max(total) * 1000:.0f} ms "
          "(target < 300 ms on 2 cores)")


def through_pytest() -> None:
    with tempfile.TemporaryDirectory(prefix="vsb-") as d:
        Path(d, "test_with.py").write_text("".join(f"def test_{i}(vaultsim):\n    pass\n" for i in range(N)))
        Path(d, "test_without.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(N)))
        walls = {}
        for name in ("test_without.py", "test_with.py"):
            a = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name], cwd=d,
                                 capture_output=True, text=True, timeout=600)
            walls[name] = time.perf_counter() - a
            assert out.returncode == 0, out.stdout[-2000:]
        extra = walls["test_with.py"] - walls["test_without.py"]
        print(f"through pytest, {N} tests: {walls['test_with.py']:.2f} s with the fixture, "
              f"{walls['test_without.py']:.2f} s without: {extra / N * 1000:.0f} ms a test "
              "(the first world's imports included)")


if __name__ == "__main__":
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    direct()
    through_pytest()
