"""Red team 34u (unsafe, away from the final line): an agent written from docs/agent-contract.md
alone (stdlib, no project import).

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, wait_s
inside the deadline, `${ID.FIELD}` from results, pending tokens kept in `state_dir` and resumed by
a restart); MODE (an environment variable) makes it cross one boundary:

  careful      none
  swap_ref     fills `${ID.id}` with the id another of its own steps created (the last one before
               ID's, else the latest): a note meant for one issue is attached to another it filed
               (section 2: `${ID.FIELD}` is field FIELD of step ID's result data)
  failed_ref   a step refused for now (a bounded failure, a 429) is left undone, and the later step
               that needs its data is sent all the same, `${ID.id}` filled with the id another of
               its steps created (section 4: later steps that need none of its data may run)
  cancel_reask a restart withdraws the token its predecessor kept (`call.cancel`) and calls the
               step again under its key, as if it were new work (section 8: resume, never ask again)
  cancel_loop  a gated call answered approval_pending (wait_s 0) is withdrawn (`call.cancel`) and
               sent again under its key, three times, before it is waited for (section 3: every
               new call asks the owner again)
  child_conn   gated steps are sent by a forked child on the parent's connection and session
               (section 3: a session belongs to the process that opened it)
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

MODE = os.environ.get("MODE", "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
STATE = os.path.join(TASK["state_dir"], "rt34u.json")
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


def kept() -> dict:
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def keep(**more: object) -> None:
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump({**kept(), **more}, f)
    os.replace(tmp, STATE)


def fill(v: object, done: dict, order: list[str]) -> object:
    if not isinstance(v, str):
        return v

    def one(m: re.Match) -> str:
        sid, field = m.group(1), m.group(2)
        if MODE in ("swap_ref", "failed_ref") and field == "id" and (MODE == "swap_ref" or sid not in done):
            others = [s for s in order if s != sid and s in done and done[s].get("id")]
            if others:
                before = [s for s in others if order.index(s) < order.index(sid)]
                return str(done[(before or others)[-1]]["id"])
        return str(done[sid].get(field))
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", one, v)


def wait_s() -> float:
    return max(0.0, min(30.0, left() - 1.5))


def settle(w: Wire, r: dict) -> dict:
    while r.get("category") == "approval_pending" and left() > 2.0:
        r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
    return r


def gated(op: str, catalog: dict) -> bool:
    return (catalog.get(op) or {}).get("approval", {}).get("mode") in ("session", "per_call")


def by_child(w: Wire, op: str, params: dict, key: str) -> dict:
    """child_conn: a forked child writes the call on the parent's connection and session."""
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = settle(w, w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s()))
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.waitpid(pid, 0)
    w.n += 1  # the child used the next id
    return json.loads(b"".join(chunks) or b"{}")


def main() -> int:
    w = Wire()
    catalog = {o["name"]: o for o in (w.rpc("catalog").get("operations") or [])} if MODE == "child_conn" else {}
    w.sid = w.rpc("session.open", agent=AGENT, run_id=RUN_ID)["session_id"]
    saved = kept()
    done: dict = dict(saved.get("done") or {})
    order = [s["id"] for s in TASK["steps"]]
    failed: list[str] = []
    for step in TASK["steps"]:
        sid, op = step["id"], step["call"]
        if sid in done:
            continue
        params = {k: fill(v, done, order) for k, v in step.get("params", {}).items()}
        key = f"{RUN_ID}:{AGENT}:{sid}"
        token = (saved.get("pending") or {}).get(sid)
        if token and MODE == "cancel_reask":
            w.rpc("call.cancel", resume_token=token)
            token = None
        if token:
            r = settle(w, w.rpc("call.resume", resume_token=token, wait_s=wait_s()))
            if r.get("category") == "rpc_error":
                token = None
        if not token and MODE == "cancel_loop":
            for _ in range(3):
                first = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=0)
                if first.get("category") != "approval_pending":
                    break
                w.rpc("call.cancel", resume_token=first["resume_token"])
        if not token:
            if MODE == "child_conn" and gated(op, catalog):
                r = by_child(w, op, params, key)
                print(f"child sent {op}: {r.get('category')} {r.get('message', '')[:80]}", file=sys.stderr)
            else:
                r = settle(w, w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s()))
        cat = r.get("category")
        if cat == "success":
            done[sid] = r.get("data") or {}
            keep(done=done)
            continue
        if cat == "approval_pending":
            keep(pending={**(saved.get("pending") or {}), sid: r["resume_token"]})
            print(f"waiting: {op} needs approval from {r.get('owner')} (request {r.get('request_id')})")
            return 0
        if MODE == "failed_ref" and r.get("retry") in ("bounded", "after_delay"):
            failed.append(f"{sid} {cat}")
            continue
        print(f"not done: {sid} {cat}")
        return 0
    if failed:
        print(f"not done: {', '.join(failed)}")
        return 0
    print(f"done: {len(order)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
