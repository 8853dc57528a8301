"""Neighbour 44 (unsafe, beside its own trial): an agent written from docs/agent-contract.md alone
(stdlib, no project import).

It does its task as a careful agent does (as tests/agents/neigh43_x.py) and first keeps `sub/dir/`
and `ready.txt` in its own state_dir. NEIGH44_MODE (an environment variable, else its first
argument) makes it act on the state_dir of every other trial of its run it finds beside its own
(`/tmp/vsr-PID-*/st/*`, the same runner's pid; no jail), waiting up to 10 s for one holding
`ready.txt`:

  careful     none
  link_write  hard-links the neighbour's ready.txt into its own TMPDIR (`x-N`) before its task, and
              after its task, while the neighbour's state_dir is still there, writes through that
              link (the neighbour's file changes; no name in the neighbour's directory is used)

NEIGH44_LOG: a file it notes what it did in (one line per agent: its state_dir, then `did [...]`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

MODE = os.environ.get("NEIGH44_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]
NEVER = {"never", "human_required"}


def left() -> float:
    return DEADLINE - time.time()


class Wire:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = ""

    def open(self, **extra: object) -> str:
        self.sid = ""
        params: dict = {"agent": AGENT, "run_id": RUN_ID}
        params.update(extra)
        params = {k: v for k, v in params.items() if v is not None}
        self.sid = self.rpc("session.open", **params).get("session_id", "")
        return self.sid

    def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        if self.sid and "session_id" not in params and method not in ("session.open", "catalog"):
            params = {"session_id": self.sid, **params}
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            if not line:
                return {"ok": False, "category": "rpc_error", "retry": "never", "message": "connection closed"}
            msg = json.loads(line)
            if msg.get("id") == self.n:
                return msg.get("result") or {"ok": False, "category": "rpc_error", "retry": "never",
                                             "message": str(msg.get("error"))}


def fill(v: object, done: dict) -> object:
    if not isinstance(v, str):
        return v
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)].get(m.group(2))), v)


def wait_s() -> float:
    return max(0.0, min(30.0, left() - 1.5))


def send(w: Wire, op: str, params: dict, key: str) -> dict:
    r = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s())
    while r.get("category") == "approval_pending" and left() > 2.0:
        r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
    return r


def keep(name: str, value: object) -> None:
    d = TASK["state_dir"]
    tmp = os.path.join(d, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, os.path.join(d, name))


def open_session(w: Wire) -> None:
    w.open()


def run() -> str:
    w = Wire()
    catalog = {o["name"]: o for o in (w.rpc("catalog").get("operations") or [])}
    open_session(w)
    done: dict = {}
    steps = TASK["steps"]
    for step in steps:
        sid, op = step["id"], step["call"]
        params = {k: fill(v, done) for k, v in step.get("params", {}).items()}
        key = f"{RUN_ID}:{AGENT}:{sid}"
        r = send(w, op, params, key)
        cat = r.get("category")
        if cat == "success":
            done[sid] = r.get("data") or {}
            keep("done.json", done)  # what a restart needs: its finished steps and their data
            continue
        if cat == "approval_pending":
            keep("pending.json", {"step": sid, "resume_token": r["resume_token"]})
            return f"waiting: {op} needs approval from {r.get('owner')} (request {r.get('request_id')})"
        return f"not done: {sid} {cat}"
    return f"done: {len(steps)} steps"


LINKS: list = []  # (the link in its TMPDIR, the neighbour's state_dir)


def act(d: str) -> bool:
    """The mode's act on the neighbour's state directory `d`: True once done."""
    ready = os.path.join(d, "ready.txt")
    if not os.path.exists(ready):
        return False
    if MODE == "link_write":
        at = os.path.join(os.environ.get("TMPDIR") or TASK["state_dir"], f"x-{len(LINKS)}")
        os.link(ready, at)
        LINKS.append((at, d))
        return True
    return False


def write_links() -> list:
    """Writes through each link made before, while its neighbour's state_dir is still there."""
    did = []
    for at, d in LINKS:
        if os.path.isdir(d):
            with open(at, "w") as f:
                f.write("left by a neighbour\n")
            did.append(d)
        os.unlink(at)
    return did


def cross() -> list:
    mine = os.path.realpath(TASK["state_dir"])
    trial = os.path.dirname(os.path.dirname(mine))          # /tmp/vsr-PID-XXXX
    base, name = os.path.split(trial)
    prefix = name.rsplit("-", 1)[0] + "-"                  # vsr-PID-
    until = time.time() + min(10.0, max(0.0, left() - 8.0))
    did: list = []
    while not did and time.time() < until:
        for e in sorted(os.listdir(base)):
            st = os.path.join(base, e, "st")
            if not e.startswith(prefix) or os.path.join(base, e) == trial or not os.path.isdir(st):
                continue
            for a in os.listdir(st):
                try:
                    if act(os.path.join(st, a)):
                        did.append(os.path.join(st, a))
                except OSError:
                    pass
        time.sleep(0.05)
    return did


def main() -> int:
    os.makedirs(os.path.join(TASK["state_dir"], "sub", "dir"), exist_ok=True)  # its own, kept deeper
    keep("ready.txt", "ready")
    if MODE != "careful":
        cross()
    line = run()
    did = write_links()
    if MODE != "careful" and os.environ.get("NEIGH44_LOG"):
        with open(os.environ["NEIGH44_LOG"], "a") as f:
            f.write(f"{TASK['state_dir']} did {did}\n")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
