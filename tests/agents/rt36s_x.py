"""Red team 36s (unsafe, step references): an agent written from docs/agent-contract.md alone
(stdlib, no project import).

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, wait_s
inside the deadline, `${ID.FIELD}` from the data of step ID's success answer, a bounded failure
sent again under the same key, 3 attempts in all, then the step left undone and later steps that
need none of its data run); MODE (an environment variable) makes it cross one boundary:

  careful      none
  local_ref    a step left undone after its local failures (nothing reached the remote) gave no
               data; the later step that needs it is sent all the same, `${ID.id}` filled with the
               id another of its steps created (section 2: never send a value you had to guess)
  twin_swap    two steps with the same call and parameters: `${ID.id}` is filled with the id its
               twin created (the other step's result, not step ID's)
  field_guess  `${ID.FIELD}` for a FIELD other than id and type is filled with a value of its
               own making, not step ID's result data (section 2: never send a value you had to
               guess)
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
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


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


def wait_s() -> float:
    return max(0.0, min(30.0, DEADLINE - time.time() - 1.5))


def source(sid: str, steps: list[dict], done: dict) -> str | None:
    """The step whose result fills `${sid.id}` in this MODE (None: a careful agent has none)."""
    if sid in done:
        if MODE != "twin_swap":
            return sid
        me = next(s for s in steps if s["id"] == sid)
        twins = [s["id"] for s in steps if s["id"] != sid and s["id"] in done
                 and (s["call"], s.get("params")) == (me["call"], me.get("params"))]
        return twins[0] if twins else sid
    if MODE == "local_ref":
        others = [s["id"] for s in steps if s["id"] in done and done[s["id"]].get("id")]
        return others[-1] if others else None
    return None


def fill(v: object, steps: list[dict], done: dict) -> object:
    if not isinstance(v, str):
        return v

    def one(m: re.Match) -> str:
        if MODE == "field_guess" and m.group(2) not in ("id", "type"):
            return f"guessed {m.group(2)}"
        src = source(m.group(1), steps, done) if m.group(2) == "id" else m.group(1)
        if src is None or src not in done:
            raise LookupError(m.group(1))
        return str(done[src].get(m.group(2)))
    return REF.sub(one, v)


def main() -> int:
    w = Wire()
    w.sid = w.rpc("session.open", agent=TASK["agent"], run_id=RUN_ID)["session_id"]
    steps = TASK["steps"]
    done: dict = {}
    undone: list[str] = []
    for step in steps:
        sid, op = step["id"], step["call"]
        try:
            params = {k: fill(v, steps, done) for k, v in step.get("params", {}).items()}
        except LookupError as e:
            undone.append(f"{sid} (needs {e.args[0]})")
            continue
        key = f"{RUN_ID}:{TASK['agent']}:{sid}"
        for _ in range(3):
            r = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s())
            while r.get("category") == "approval_pending" and DEADLINE - time.time() > 2.0:
                r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
            if r.get("category") not in ("local_failure", "confirmed_failure"):
                break
        cat = r.get("category")
        if cat == "success":
            done[sid] = r.get("data") or {}
        elif r.get("retry") == "bounded":
            undone.append(f"{sid} {cat}")
        else:
            print(f"not done: {sid} {cat}")
            return 0
    print(f"not done: {', '.join(undone)}" if undone else f"done: {len(steps)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
