"""Neighbour 45 (unsafe, beside other trials; no jail): an agent written from docs/agent-contract.md
alone (stdlib, no project import).

It does its task as a careful agent does (tests/agents/neigh_core.py) and first keeps `sub/dir/` and
`ready.txt` in its own state_dir. NEIGH45_MODE (an environment variable, else its first argument):

  careful  none
  swap     before its task, renames a file of its own (written in its TMPDIR) over the `config.yaml`
           of every other trial of its run it finds beside its own (`/tmp/vsr-PID-*`, the same
           runner's pid), waiting up to 10 s for one whose agent keeps `ready.txt`
  scan     no task: a "health check" of the services another run's vault talks to. It waits for
           the file NEIGH45_TARGET to name that run's runner pid, then, until the file
           NEIGH45_TARGET + ".stop" exists or its deadline nears, reads the ports in each
           `/tmp/vsr-PID-*/config.yaml` of that pid and probes each: connects, waits 0.3 s, sends
           `GET /v1/issues` and closes at once without reading the answer

NEIGH45_LOG: a file it notes what it did in (one line per agent: its state_dir, then `did [...]`, or
`probed N` when it scanned).
"""

from __future__ import annotations

import glob
import os
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its shared core beside it
from neigh_core import TASK, cross, left, prepare, run, say  # noqa: E402

MODE = os.environ.get("NEIGH45_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")


def swap(d: str) -> bool:
    """Neighbour state_dir `d` (TRIAL/st/ROLE) is ready: a file of its own renamed over TRIAL/config.yaml."""
    if not os.path.exists(os.path.join(d, "ready.txt")):
        return False
    trial = os.path.dirname(os.path.dirname(d))
    made = os.path.join(os.environ.get("TMPDIR") or TASK["state_dir"], "config.yaml")
    with open(made, "w") as f:
        f.write("services: {}\n")
    os.replace(made, os.path.join(trial, "config.yaml"))
    return True


def probe(port: int) -> bool:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
    except OSError:
        return False
    try:
        time.sleep(0.3)  # "let it settle"
        s.sendall(b"GET /v1/issues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    except OSError:
        return False
    finally:
        s.close()  # fire and forget: gone before anyone reads who asked
    return True


def scan() -> int:
    target = os.environ["NEIGH45_TARGET"]
    n, done, probes = 0, [], []
    while left() > 5.0 and not os.path.exists(target + ".stop"):
        try:
            with open(target) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        ports: set[int] = set()
        for config in glob.glob(f"/tmp/vsr-{pid}-*/config.yaml") if pid else []:
            try:
                with open(config) as f:
                    ports |= {int(p) for p in re.findall(r"url: http://127\.0\.0\.1:(\d+)", f.read())}
            except (OSError, ValueError):
                continue
        # a probe holds its connection 0.3 s: started every 0.25 s side by side, some land while the
        # trial's agent runs, however slow the host. The runner reads its remote's refusals once the
        # agents have exited: a request sent later (a 2 s hold, at CI's load) is read by no one
        for port in sorted(ports):
            probes.append(threading.Thread(target=lambda p=port: done.append(probe(p)), daemon=True))
            probes[-1].start()
        time.sleep(0.25)
    for t in probes:  # the probes in flight end
        t.join(timeout=max(0.1, left() - 1.0))
    return n + sum(done)


def main() -> int:
    if MODE == "scan":
        n = scan()
        line, note = f"not done: probed {n} time(s)", f"probed {n}"
    else:
        prepare()
        did = cross(swap) if MODE == "swap" else []
        line, note = run(), f"did {did}"
    if MODE != "careful" and os.environ.get("NEIGH45_LOG"):
        with open(os.environ["NEIGH45_LOG"], "a") as f:
            f.write(f"{TASK['state_dir']} {note}\n")
    say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
