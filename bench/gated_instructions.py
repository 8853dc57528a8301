"""Instructions the daemon spends per end-to-end gated call, counted by valgrind.

    .venv/bin/python bench/gated_instructions.py [CALLS_PER_AGENT] [--agents N]

The stack of bench/gated_calls.py (fake remote, unlocked daemon, N agent
processes calling `read_issue` over the agent socket), with the daemon run
under ``valgrind --tool=callgrind --instr-atstart=no``: counting starts after
a warm-up (`callgrind_control -i on`) and the count is dumped after the
measured calls, so it holds only the calls (socket, gate, store, audit log,
aiohttp, answer), in every thread of the daemon. A busy host moves CPU times
by ±5-10% between runs; this count moves by 1-3% (how many calls share a group
commit still depends on timing), so compare two versions with it, run
alternately. (Under valgrind the daemon runs about 50 times slower, so its
group commits hold fewer calls than at full speed, and AES/SHA run without
their CPU instructions.)
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import tempfile

import psutil

from _procs import TOKEN, new_sandbox
from gated_calls import measure, vault_agent
from vault.runner import world_procs


def _callgrind_control(*options: str, pid: int) -> None:
    """Tell the daemon's callgrind to start counting or to dump (valgrind's tool; no vault part)."""
    subprocess.run(["callgrind_control", *options, str(pid)], check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calls", nargs="?", type=int, default=150, help="calls per agent (default 150)")
    ap.add_argument("--agents", type=int, default=8)
    args = ap.parse_args()
    out_dir = tempfile.mkdtemp(prefix="gated-instructions-")
    out = os.path.join(out_dir, "callgrind.out")
    box = new_sandbox("/tmp")
    try:
        _remote, url = box.start_remote({"tracker_token": TOKEN})
        box.set_secret("tracker_token", TOKEN)
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                *world_procs.daemon_argv("--remote", url)]
        daemon = box.world.start_daemon(argv, ready=lambda: box.status() is not None, timeout=600)
        watched = [psutil.Process(daemon.pid)]
        sock = str(box.agent_sock)
        measure(vault_agent, sock, args.agents, 20, watched)  # warm-up: imports, pools, first records
        _callgrind_control("-i", "on", pid=daemon.pid)
        rate, ok, _ = measure(vault_agent, sock, args.agents, args.calls, watched)
        _callgrind_control("-d", pid=daemon.pid)
        total = 0
        for path in glob.glob(out + "*"):
            with open(path) as f:
                for line in f:
                    if line.startswith(("summary:", "totals:")):
                        total = max(total, int(line.split()[1]))
        print(f"{ok} read_issue calls ({args.agents} agents, {rate:.0f}/s under valgrind): "
              f"{total / ok:,.0f} daemon instructions per call")
    finally:
        box.close()
        for path in glob.glob(out + "*"):
            os.unlink(path)
        os.rmdir(out_dir)


if __name__ == "__main__":
    main()
