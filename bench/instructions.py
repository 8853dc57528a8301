"""Instructions per in-process gated call, counted by valgrind: a figure a busy host cannot move.

    .venv/bin/python bench/instructions.py [--calls N] [--agents A]

Runs the in-process pipeline of bench/audit.py (a real `VaultDaemon`'s
`call`, gate, credential store and audit writer on tmpfs, a stub executor)
under ``valgrind --tool=callgrind`` twice, with no calls and with `--calls`
calls, and prints the difference per call: with the audit log on (default
durability) and off. Timings on a shared host move by ±30% within minutes;
instruction counts move by well under 1%, so this is the figure to compare
two versions of the pipeline with. (Valgrind runs the process about 50 times
slower; AES and SHA run without their CPU instructions there, so crypto
weighs more than on the metal.)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import asyncio, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import audit as B
calls, agents, audit_on = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"

async def run(d):
    daemon, writer, _ = B.gated_daemon(Path(d), B.CountingIO())
    if not audit_on:
        daemon.audit_sink = None
    op = daemon.catalog.get("read_issue")
    me = B.ProcessIdentity.of(os.getpid(), os.getuid())
    sessions = [daemon.sessions.open(f"b-{i}", "bench", me, f"c-{i}") for i in range(agents)]
    async def agent(s):
        for _ in range(calls // agents):
            await daemon.calls.call(s, op, {"issue_id": "ISS-1"}, None, None)
    await asyncio.gather(*(agent(s) for s in sessions))
    writer.close()

with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
    asyncio.run(run(d))
"""


def instructions(calls: int, agents: int, audit_on: bool) -> int:
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                          "-c", CHILD, str(HERE), str(calls), str(agents), "1" if audit_on else "0"],
                         capture_output=True, text=True, check=True)
    m = re.search(r"Collected : (\d+)", out.stderr)
    if m is None:
        raise SystemExit(f"valgrind printed no instruction count:\n{out.stderr[-2000:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=800)
    ap.add_argument("--agents", type=int, default=8)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    print(f"instructions per in-process gated call ({args.agents} agents, {args.calls} calls, tmpfs; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}):")
    # the three counts at once: an instruction count does not move with the host's load, and each
    # run is mostly valgrind starting Python (about 20 s), so the wall time is one run's, not three's.
    # One baseline serves both rows: with no calls made, the audit switch changes nothing counted
    with ThreadPoolExecutor(3) as pool:
        base, on, off = pool.map(lambda a: instructions(*a), [(0, args.agents, True), (args.calls, args.agents, True),
                                                            (args.calls, args.agents, False)])
    for label, count in (("on (default durability)", on), ("off", off)):
        print(f"  audit {label}: {(count - base) / args.calls / 1000:,.0f}k")


if __name__ == "__main__":
    main()
