#!/usr/bin/env python3
"""An agent whose first process gives up on its one step and whose restart looks it up.

Written from docs/agent-contract.md. The first process (no mark in state_dir) sends its step
under its key, waits TOLD41_GIVE_UP seconds (default 0.3) for the answer, then stops reading and
exits saying it did not finish, while the vault still performs the call. The restart (the mark
is there; after TOLD41_RESTART_SLOW seconds, default 0) looks the step up by its key until the lookup settles it (section 6: `unknown` while
the vault still performs it, so asked again), and finishes `done` when it was found.
"""

import json
import os
import socket
import sys
import time


def main() -> None:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    step = task["steps"][0]
    key = f"{task['run_id']}:{task['agent']}:{step['id']}"
    mark = os.path.join(task["state_dir"], "sent")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    reader = sock.makefile("rb")
    ids = iter(range(1, 1 << 30))

    def send(method: str, params: dict) -> int:
        n = next(ids)
        sock.sendall(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
        return n

    def answer(n: int) -> dict:
        while True:
            msg = json.loads(reader.readline())
            if msg.get("id") == n:
                return msg.get("result") or {}

    sid = answer(send("session.open", {"agent": task["agent"], "run_id": task["run_id"]}))["session_id"]
    if not os.path.exists(mark):
        tmp = mark + ".tmp"
        with open(tmp, "w") as f:
            f.write(key)
        os.replace(tmp, mark)
        send("call", {"session_id": sid, "operation": step["call"], "params": step["params"],
                      "idempotency_key": key})
        sock.settimeout(float(os.environ.get("TOLD41_GIVE_UP", "0.3")))
        try:
            reader.readline()
        except OSError:
            pass
        print("not done: gave up waiting for the answer; a restart must look it up", flush=True)
        os._exit(0)  # nothing more on the wire: the vault still performs the call
    # TOLD41_RESTART_SLOW: seconds the restart takes before its first lookup (a loaded host's
    # slow start), so a test can force the answer to come before it looks
    time.sleep(float(os.environ.get("TOLD41_RESTART_SLOW", "0")))
    delay = 0.1
    while time.time() + delay < task["deadline"] - 1.0:
        r = answer(send("lookup", {"session_id": sid, "idempotency_key": key, "operation": step["call"]}))
        if r.get("reconciled") == "found":
            print("done: the lookup found the step done", flush=True)
            return
        if r.get("reconciled") == "not_found" or r.get("retry") in ("never", "human_required"):
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    print("not done: the step could not be confirmed", file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
