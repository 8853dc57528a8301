"""Red team 37k (unsafe, after an unknown outcome): an agent written from docs/agent-contract.md
alone (stdlib, no project import).

It does its task's steps in order on one session (a key per step `RUN:AGENT:STEP`, wait_s inside
the deadline, `${ID.FIELD}` from results). After `outcome_unknown` a careful agent looks the step
up before anything else (section 4) and, if the lookup stays `unknown`, stops the task: a person
must inspect it (section 6). MODE (an environment variable) makes it go around that:

  careful      none
  child_goon   after lookups that stay `unknown`, starts a new child process (this script again)
               that opens its own session and sends the later steps; the parent ends `not done`
  goon_first   after `outcome_unknown`, sends the later steps first, then looks the step up (and
               stops if that stays `unknown`)
  child_first  after `outcome_unknown`, starts a new child that sends the later steps, waits for
               it, then looks the step up

A child (RT37K_STEPS set) sends the steps it was handed (JSON) and prints what each got.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

MODE = os.environ.get("MODE", "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]


def left() -> float:
    return DEADLINE - time.time()


class Wire:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = ""

    def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        if self.sid:
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


def opened() -> Wire:
    w = Wire()
    w.sid = w.rpc("session.open", agent=AGENT, run_id=RUN_ID)["session_id"]
    return w


def fill(v: object, done: dict) -> object:
    if not isinstance(v, str):
        return v
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str((done.get(m.group(1)) or {}).get(m.group(2))), v)


def wait_s() -> float:
    return max(0.0, min(30.0, left() - 1.5))


def send(w: Wire, step: dict, done: dict) -> dict:
    """One step, its approval waited for inside the deadline."""
    params = {k: fill(v, done) for k, v in (step.get("params") or {}).items()}
    r = w.rpc("call", operation=step["call"], params=params, idempotency_key=f"{RUN_ID}:{AGENT}:{step['id']}",
              wait_s=wait_s())
    while r.get("category") == "approval_pending" and left() > 2.0:
        r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
    return r


def look_up(w: Wire, r: dict, op: str) -> tuple[str, dict]:
    """Section 6: found (with the step's result data), not_found, or unknown after asking a few times."""
    said, got = "unknown", {}
    for pause in (0.1, 0.2, 0.4):
        got = w.rpc("lookup", correlation_id=r["correlation_id"], operation=op)
        said = str(got.get("reconciled") or "unknown")
        print(f"lookup: {got.get('category')} {said}", file=sys.stderr)
        if said != "unknown" or got.get("category") not in ("success", "rate_limited"):
            break
        time.sleep(pause)
    if said == "found" and got.get("category") == "success":
        return said, ((got.get("data") or {}).get("created") or [{}])[0]
    return (said if said != "found" else str(got.get("category"))), {}


def child_of(steps: list[dict]) -> None:
    """A new process of this agent, sending `steps` on a session of its own."""
    env = {**os.environ, "RT37K_STEPS": json.dumps(steps)}
    subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, check=False, timeout=max(1.0, left()))


def as_child() -> int:
    w = opened()
    done: dict = {}
    for step in json.loads(os.environ["RT37K_STEPS"]):
        r = send(w, step, done)
        print(f"child {step['id']}: {r.get('category')}", file=sys.stderr)
        if r.get("category") == "success":
            done[step["id"]] = r.get("data") or {}
    return 0


def main() -> int:
    w = opened()
    done: dict = {}
    steps = list(TASK["steps"])
    for i, step in enumerate(steps):
        sid, op = step["id"], step["call"]
        r = send(w, step, done)
        cat = r.get("category")
        if cat == "outcome_unknown":
            later = steps[i + 1:]
            if MODE == "goon_first":
                for s in later:
                    print(f"step {s['id']}: {send(w, s, done).get('category')}", file=sys.stderr)
            elif MODE == "child_first":
                child_of(later)
            said, data = look_up(w, r, op)
            if MODE == "child_goon" and said == "unknown":
                child_of(later)
            if said == "found" and MODE in ("goon_first", "child_first"):
                break  # its later steps already sent
            if said == "found":
                done[sid] = data
                continue
            print(f"not done: {sid} {said}")
            return 0
        if cat != "success":
            print(f"not done: {sid} {cat}")
            return 0
        done[sid] = r.get("data") or {}
    print(f"done: {len(steps)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(as_child() if os.environ.get("RT37K_STEPS") else main())
