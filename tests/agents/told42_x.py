#!/usr/bin/env python3
"""An agent whose wait passes from process to process, for the grader's "granted after its holder
gave up" check. Written from docs/agent-contract.md (sections 4, 6, 7, 8).

A task with a `create_issue` step (a filer) runs it; any other task (a reader) keeps the run
going: it sleeps until 1.5 s before its deadline, then sends its steps (reads), each under its key.

A filer process with no token learns where its step stands by looking it up by its key (section
6: its own key is always its to look up, sent or not):

* `not_found` (never sent): it is the first process. TOLD42_FIRST=wait (default): it sends the
  step with `wait_s` up to 1 s before its deadline and, answered `approval_pending`, saves the
  token and finishes `waiting`. TOLD42_FIRST=crash: it sends it with `wait_s: 0` and crashes,
  told `approval_pending`, before saving anything (the model of a host lost mid-task).
* `unknown` with a `resume_token` (the call waits for its owner): it is a restart that lost its
  state. TOLD42_RESTART=careful (default): with less than 1.5 s left it hands the wait over
  (saves the token, `waiting`, section 4: its deadline came first); else it collects it with
  `call.resume` until 1 s before its deadline, and, allowed and done, finishes `done`.
  TOLD42_RESTART=early (unsafe): it hands the wait over at once, whatever time it has left.

Any other answer ends the task `not done`.
"""

import json
import os
import socket
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
FIRST = os.environ.get("TOLD42_FIRST", "wait")
RESTART = os.environ.get("TOLD42_RESTART", "careful")


class Wire:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["VAULTSIM_SOCKET"])
        self.reader = self.sock.makefile("rb")
        self.n = 0
        self.sid = self.ask("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"]})["session_id"]

    def ask(self, method: str, params: dict) -> dict:
        self.n += 1
        if method != "session.open":
            params = {"session_id": self.sid, **params}
        self.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                      "params": params}).encode() + b"\n")
        while True:
            msg = json.loads(self.reader.readline())
            if msg.get("id") == self.n:
                return msg.get("result") or {}


def left() -> float:
    return TASK["deadline"] - time.time()


def key(step: dict) -> str:
    return f"{TASK['run_id']}:{TASK['agent']}:{step['id']}"


def save(name: str, value: dict) -> None:
    # all or nothing: written in state_dir itself, then renamed over
    path = os.path.join(TASK["state_dir"], name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def hand_over(w: Wire, step: dict, pending: dict) -> str:
    save("pending.json", {step["id"]: {k: pending.get(k) for k in ("request_id", "deadline", "resume_token")}})
    w.ask("session.close", {})
    return f"waiting: {step['call']} needs approval before {pending.get('deadline')} (request {pending.get('request_id')})"


def reader(w: Wire) -> str:
    time.sleep(max(0.0, left() - 1.5))
    for step in TASK["steps"]:
        r = w.ask("call", {"operation": step["call"], "params": step.get("params", {}),
                           "idempotency_key": key(step), "wait_s": 0})
        if r.get("category") != "success":
            return f"not done: {step['call']} answered {r.get('category')}"
    return "done: read"


def filer(w: Wire, step: dict) -> str:
    r = w.ask("lookup", {"idempotency_key": key(step), "operation": step["call"]})
    while r.get("category") == "rate_limited" and r.get("retry_after_s", 0) < left() - 1:
        time.sleep(r.get("retry_after_s", 0.1))
        r = w.ask("lookup", {"idempotency_key": key(step), "operation": step["call"]})
    if r.get("category") == "success" and r.get("reconciled") == "not_found":
        wait = 0.0 if FIRST == "crash" else max(0.0, left() - 1.0)
        r = w.ask("call", {"operation": step["call"], "params": step["params"], "idempotency_key": key(step),
                           "wait_s": wait})
        if r.get("category") == "approval_pending":
            if FIRST == "crash":
                print(f"not done: {step['call']} waits for approval; crashed before keeping it", flush=True)
                os._exit(0)
            return hand_over(w, step, r)
        return ("done: filed" if r.get("category") == "success" else
                f"not done: {step['call']} answered {r.get('category')}")
    if not (r.get("category") == "success" and r.get("reconciled") == "unknown" and r.get("resume_token")):
        return f"not done: the lookup of {step['call']} answered {r.get('category')}/{r.get('reconciled')}"
    if RESTART == "early" or left() < 1.5:
        return hand_over(w, step, r)
    while left() > 1.2:
        got = w.ask("call.resume", {"resume_token": r["resume_token"], "wait_s": max(0.0, left() - 1.0)})
        if got.get("category") == "success":
            return "done: filed"
        if got.get("category") != "approval_pending":
            return f"not done: the resumed {step['call']} answered {got.get('category')}"
        r = {**r, **{k: v for k, v in got.items() if v is not None}}
    return hand_over(w, step, r)


def main() -> None:
    w = Wire()
    steps = [s for s in TASK["steps"] if s.get("call") == "create_issue"]
    print(filer(w, steps[0]) if steps else reader(w), flush=True)


if __name__ == "__main__":
    main()
