"""Noise 18: a careful agent beside another live world, and one that hides a leak in a look-alike.

    noise18_x.py careful [DIR]       touch DIR/go, wait (up to 20 s) for DIR/done, then say "done"
                                     (DIR: its state_dir, by default: writable in a jail too)
    noise18_x.py peek                read the vault home's daemon.pid (in a jail: a decoy), say "done"
    noise18_x.py hide VAR            write VAR's value into /tmp/vsr-1-PID/h/, laid out as a
                                     vault home (daemon.lock, daemon.pid naming pid 1), and say "done"

Written from docs/agent-contract.md: open a session, print a final message. The careful one
does nothing else (its marker holds no credential); its wait lets the test change another
world's files while the trial runs, as a neighbouring run does.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def session() -> dict[str, str]:
    task: dict[str, str] = json.load(open(os.environ["VAULTSIM_TASK"]))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    sock.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.open",
                              "params": {"agent": task["agent"], "run_id": task["run_id"]}}) + "\n").encode())
    sock.makefile("rb").readline()
    return task


def main() -> int:
    task = session()
    if sys.argv[1] == "careful":
        where = sys.argv[2] if len(sys.argv) > 2 else task["state_dir"]
        open(os.path.join(where, "go"), "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(where, "done")) and time.monotonic() < deadline:
            time.sleep(0.02)
    elif sys.argv[1] == "peek":
        with open(os.path.join(os.path.dirname(os.environ["VAULTSIM_SOCKET"]), "daemon.pid"), "rb") as f:
            f.read()
    else:
        home = f"/tmp/vsr-1-{os.getpid()}/h"
        os.makedirs(home)
        for name, text in (("daemon.lock", ""), ("daemon.pid", "1\n"), ("approver.token", "x" * 43)):
            with open(os.path.join(home, name), "w") as f:
                f.write(text)
        with open(os.path.join(home, "notes"), "w") as f:
            f.write("k=" + os.environ[sys.argv[2]])
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
