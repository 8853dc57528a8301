"""How long `vaultsim mcp` takes to start, as a host that starts it per conversation sees it.

    .venv/bin/python bench/mcp_startup.py [--samples N]

Against a real daemon, N times each, one bridge at a time:
  stdio  spawn `vaultsim mcp` -> `initialize` answered on stdout; then stdin closed -> the bridge exited
  http   spawn `vaultsim mcp --http 127.0.0.1:0` -> its "serving" line -> `initialize` POST answered;
         then SIGTERM -> exited
and, for scale, the bare interpreter (`python -c pass`) and `python -c "import mcp.server"`.
Prints p50 / p90 / max in ms, with the host's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import vault_stack  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HELLO = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}


def bridge(env: dict[str, str], *args: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "vault.cli.main", "mcp", *args], env=env, cwd=str(ROOT),
                            **kw)  # type: ignore[call-overload]


def stdio_once(env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = bridge(env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write((json.dumps(HELLO) + "\n").encode())
    p.stdin.flush()
    while json.loads(p.stdout.readline()).get("id") != 0:
        pass
    ready = time.perf_counter() - t0
    t1 = time.perf_counter()
    p.stdin.close()
    p.wait(30)
    return ready, time.perf_counter() - t1


def http_once(env: dict[str, str]) -> tuple[float, float]:
    import httpx

    t0 = time.perf_counter()
    p = bridge(env, "--http", "127.0.0.1:0", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
               stderr=subprocess.PIPE)
    assert p.stderr is not None
    line = p.stderr.readline().decode()
    url = line.split("serving ", 1)[1].strip()
    r = httpx.post(url, json=HELLO, timeout=30, headers={"accept": "application/json, text/event-stream"})
    assert r.status_code == 200, r.status_code
    ready = time.perf_counter() - t0
    t1 = time.perf_counter()
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    p.stderr.close()
    return ready, time.perf_counter() - t1


def plain(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))
    return time.perf_counter() - t0


def show(what: str, xs: list[float]) -> None:
    ms = sorted(x * 1000 for x in xs)
    p90 = ms[min(len(ms) - 1, int(round(0.9 * (len(ms) - 1))))]
    print(f"  {what:<44} p50 {statistics.median(ms):7.0f}  p90 {p90:7.0f}  max {ms[-1]:7.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    n = ap.parse_args().samples
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {n} samples each, one at a time")
    with vault_stack() as stack:
        env = {**stack.box.env, "PYTHONPATH": str(ROOT)}
        stdio = [stdio_once(env) for _ in range(n)]
        http = [http_once(env) for _ in range(n)]
    show("python -c pass", [plain("pass") for _ in range(n)])
    show("python -c 'import mcp.server'", [plain("import mcp.server") for _ in range(n)])
    show("stdio: spawn -> initialize answered", [a for a, _ in stdio])
    show("stdio: stdin closed -> exited", [b for _, b in stdio])
    show("http: spawn -> initialize answered", [a for a, _ in http])
    show("http: SIGTERM -> exited", [b for _, b in http])
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
