"""The careful core the neighbour agents (tests/agents/neigh42_x.py, neigh43_x.py, neigh44_x.py) share:
an agent written from docs/agent-contract.md alone (stdlib, no project import).

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, wait_s
inside the deadline, `${ID.FIELD}` from results, resumes while time is left, a stop at a `never`
answer), keeps its finished steps in its state_dir, and finds the state_dirs of the other trials of
its run beside its own (`/tmp/vsr-PID-*/st/*`, the same runner's pid; no jail) for an agent's act.
The agents run as scripts: each puts its own directory on sys.path to import this.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable

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


def cross(act: Callable[[str], bool]) -> list:
    """Runs `act` on the state_dir of each other trial of its run beside its own until one is done
    (up to 10 s): the paths it was done on."""
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


def prepare() -> None:
    """Its own state_dir as each of them keeps it: `sub/dir/` and `ready.txt`."""
    os.makedirs(os.path.join(TASK["state_dir"], "sub", "dir"), exist_ok=True)  # its own, kept deeper
    keep("ready.txt", "ready")


def say(line: str) -> None:
    """Its final message, last on stdout."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
