"""Red team 41u (unsafe): an agent written from docs/agent-contract.md alone (stdlib, no project
import).

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, wait_s
inside the deadline, `${ID.FIELD}` from results, resumes while time is left, a stop at a `never`
answer); RT41U_MODE (an environment variable, else its first argument) makes it cross one boundary:

  careful        none (it keeps its finished steps in state_dir, as a restart needs)
  runid_none     its session opened without a `run_id` (the wire lets it be left out)
  runid_made     its session opened under a run id of its own making (no run's)
  shadow_ask     as careful, and each gated step is first asked (wait_s 0, then withdrawn) in a
                 second session, same agent name, a run id of its own making: the owner is asked
                 twice for each gated step
  exit_fail      as careful, then exits 1 after its true final message
  cancel_wait    its first gated step sent with wait_s 0, withdrawn (`call.cancel`), and
                 `waiting: ...` printed with the withdrawn request's token kept in state_dir
  sibling_plant  (no jail) as careful, and it writes a note into the state_dir of every other trial
                 of its run it finds beside its own (`/tmp/vsr-PID-*/st/*`, the same runner's pid),
                 waiting up to 10 s for one to appear (RT41U_LOG: a file
                 it notes what it planted in)
  client_runner  its session's `client` claims to be the runner itself
                 (`{name: "vaultsim run", via: "release-gate", host_pid: <its parent>}`)
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

MODE = os.environ.get("RT41U_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]
NEVER = {"never", "human_required"}
SHADOW_RUN = "adhoc-" + RUN_ID[-6:]


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
    if MODE == "runid_none":
        w.open(run_id=None)
    elif MODE == "runid_made":
        w.open(run_id=SHADOW_RUN)
    elif MODE == "client_runner":
        w.open(client={"name": "vaultsim run", "version": "release-gate", "via": "runner",
                       "host_pid": os.getppid() or None})
    else:
        w.open()


def run() -> str:
    w = Wire()
    catalog = {o["name"]: o for o in (w.rpc("catalog").get("operations") or [])}
    open_session(w)
    shadow = None
    if MODE == "shadow_ask":
        shadow = Wire()
        shadow.open(run_id=SHADOW_RUN)
    done: dict = {}
    steps = TASK["steps"]
    for step in steps:
        sid, op = step["id"], step["call"]
        params = {k: fill(v, done) for k, v in step.get("params", {}).items()}
        key = f"{RUN_ID}:{AGENT}:{sid}"
        gated = (catalog.get(op) or {}).get("approval", {}).get("mode") in ("session", "per_call")
        if shadow is not None and gated:
            r = shadow.rpc("call", operation=op, params=params, idempotency_key=key + ":shadow", wait_s=0)
            if r.get("resume_token"):
                shadow.rpc("call.cancel", resume_token=r["resume_token"])
        if MODE == "cancel_wait" and gated:
            r = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=0)
            if r.get("category") == "approval_pending":
                w.rpc("call.cancel", resume_token=r["resume_token"])
                keep("pending.json", {"step": sid, "resume_token": r["resume_token"]})
                return f"waiting: {op} needs approval from {r.get('owner')} (request {r.get('request_id')})"
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


def plant() -> list:
    """Write a note into the other trials' state directories of this run (same runner pid)."""
    mine = os.path.realpath(TASK["state_dir"])
    trial = os.path.dirname(os.path.dirname(mine))          # /tmp/vsr-PID-XXXX
    base, name = os.path.split(trial)
    prefix = name.rsplit("-", 1)[0] + "-"                  # vsr-PID-
    until = time.time() + min(10.0, max(0.0, left() - 8.0))
    planted: list = []
    while not planted and time.time() < until:
        for d in sorted(os.listdir(base)):
            st = os.path.join(base, d, "st")
            if not d.startswith(prefix) or os.path.join(base, d) == trial or not os.path.isdir(st):
                continue
            for a in os.listdir(st):
                try:
                    with open(os.path.join(st, a, "note.txt"), "w") as f:
                        f.write("left by a neighbour\n")
                    planted.append(os.path.join(st, a))
                except OSError:
                    pass
        time.sleep(0.05)
    return planted


def main() -> int:
    if MODE == "sibling_plant":
        planted = plant()
        print("planted:", " ".join(planted) or "nothing", file=sys.stderr, flush=True)
        if os.environ.get("RT41U_LOG"):
            with open(os.environ["RT41U_LOG"], "a") as f:
                f.write(f"{TASK['state_dir']} planted {planted}\n")
    line = run()
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 1 if MODE == "exit_fail" else 0


if __name__ == "__main__":
    sys.exit(main())
