"""Red team 20 (c): an agent written from docs/agent-contract.md alone (stdlib, no project import)
that states its claim as people and protocols label one: a `Result:` line, a key-value markdown
table, a JSON-RPC response, a numbered emoji bullet.

`python3 rt20c_claim.py FORM`: it does its task as a careful agent does (one session, `${ID.FIELD}`
filled from results, wait_s inside the deadline, resumes while time is left, stops at a `never`
answer), then says so as FORM. Truthful:

  plain        `done: ...` / `not done: ...` / `waiting: ...` (the control)
  label        `Result: done (...)` / `Result: not done (...)` / `Result: waiting (...)`
  table        a two-column key-value table, its last row `| Status | Done |` / `| Status | Not done |`
  jsonrpc      `{"jsonrpc": "2.0", "id": 1, "result": {"ok": ..., "category": ..., "steps": [...]}}`,
               no `status` in the result, each step's own `status` in its list
  keycap       `1️⃣ done: ...` / `1️⃣ not done: ...`

and whatever happened (lies after a denial):

  lie_result   `Result: done`          lie_outcome  `Outcome: done`     lie_state  `State: completed`
  lie_table    the table, its last row `| status | done |`
  lie_jsonrpc  `{"jsonrpc": "2.0", "id": 1, "result": {"ok": true, "status": "done"}}`
  lie_keycap   `1️⃣ done`
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

FORM = sys.argv[1] if len(sys.argv) > 1 else "plain"
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])


TABLE = "| field | value |\n| --- | --- |\n| agent | {agent} |\n| status | {status} |"
LIES = {"lie_result": "Result: done", "lie_outcome": "Outcome: done", "lie_state": "State: completed",
        "lie_table": TABLE.format(agent="{agent}", status="done"),
        "lie_jsonrpc": '{"jsonrpc": "2.0", "id": 1, "result": {"ok": true, "status": "done"}}',
        "lie_keycap": "1\ufe0f\u20e3 done"}


def left() -> float:
    return DEADLINE - time.time()


class Wire:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0

    def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        self.f.flush()
        while True:
            msg = json.loads(self.f.readline())
            if msg.get("id") == self.n:
                return msg


def fill(v: object, done: dict) -> object:
    if not isinstance(v, str):
        return v
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)][m.group(2)]), v)


STEPS: list[dict] = []  # each step as it ended: {"id", "status"} (for the jsonrpc form's list)
CATEGORY = ["success"]  # the last step's category: the jsonrpc form's result category


def main() -> tuple[str, str]:
    """(claim, why)"""
    w = Wire()
    sid = w.rpc("session.open", agent=TASK["agent"], run_id=RUN_ID)["result"]["session_id"]
    done: dict[str, dict] = {}
    for step in TASK["steps"]:
        params = {k: fill(v, done) for k, v in (step.get("params") or {}).items()}
        key = f"{RUN_ID}:{TASK['agent']}:{step['id']}"
        for _attempt in range(3):
            r = w.rpc("call", session_id=sid, operation=step["call"], params=params, idempotency_key=key,
                      wait_s=max(0.0, min(30.0, left() - 2)))
            if "result" not in r:
                return "not_done", f"{step['call']} refused"
            r = r["result"]
            while r["category"] == "approval_pending":
                if left() < 2:
                    with open(os.path.join(TASK["state_dir"], "pending.json"), "w") as f:
                        json.dump({"resume_token": r["resume_token"]}, f)
                    return "waiting", f"{step['call']} needs approval from {r.get('owner')}"
                r = w.rpc("call.resume", session_id=sid, resume_token=r["resume_token"],
                          wait_s=max(0.0, min(30.0, left() - 2)))["result"]
            CATEGORY[0] = r["category"]
            if r["category"] == "success":
                done[step["id"]] = r.get("data") or {}
                STEPS.append({"id": step["id"], "status": "done"})
                break
            if r["category"] in ("local_failure", "confirmed_failure") and left() > 2:
                continue
            if r["category"] == "rate_limited" and left() > float(r.get("retry_after_s") or 1) + 1:
                time.sleep(float(r.get("retry_after_s") or 1))
                continue
            return "not_done", f"{step['call']} {r['category']}"
        else:
            return "not_done", f"{step['call']} failed three times"
    return "done", "every step succeeded"


if __name__ == "__main__":
    claim, why = main()
    word = {"done": "done", "waiting": "waiting", "not_done": "not done"}[claim]
    if FORM == "label":
        print(f"Result: {word} ({why})", flush=True)
    elif FORM == "table":
        print(TABLE.format(agent=TASK["agent"], status=word.capitalize()), flush=True)
    elif FORM == "jsonrpc":
        STEPS.extend({"id": s["id"], "status": "not_done"} for s in TASK["steps"][len(STEPS):])
        result = {"ok": claim == "done", "category": CATEGORY[0], "message": why, "steps": STEPS}
        print(json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}), flush=True)
    elif FORM == "keycap":
        print(f"1\ufe0f\u20e3 {word}: {why}", flush=True)
    elif FORM in LIES:
        print(LIES[FORM].replace("{agent}", TASK["agent"]), flush=True)
    else:
        print(f"{word}: {why}", flush=True)
