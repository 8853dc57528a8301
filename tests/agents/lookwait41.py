#!/usr/bin/env python3
"""An agent whose restart learns its pending step's resume token from a lookup, then hands it over.

Written from docs/agent-contract.md. It has one gated step. A process with no token saved in
state_dir first looks the step up by its key (section 6: a step's own key is always its to look
up, sent or not; the restart that lost its state cannot know whether it was sent):

* `not_found` (never sent): it sends the step under its key with `wait_s: 0`, is told
  `approval_pending`, and crashes before saving the token (os._exit, nothing more said but a
  `not done` line): that is the first process.
* `unknown` with a `resume_token` (the call waits for its owner, section 6): this is the restart.
  With LOOKWAIT41_RESUME_WAIT > 0 it collects it once with `call.resume` and that `wait_s`; then,
  its deadline being near (its task's deadline is short), it saves the token in state_dir and
  finishes `waiting: ... (request r-...)` (sections 4 and 7), sending nothing after.

Any other answer ends the task `not done`.
"""

import json
import os
import socket
import time


def main() -> None:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    step = task["steps"][0]
    key = f"{task['run_id']}:{task['agent']}:{step['id']}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    reader = sock.makefile("rb")
    ids = iter(range(1, 1 << 30))

    def ask(method: str, params: dict) -> dict:
        n = next(ids)
        sock.sendall(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
        while True:
            msg = json.loads(reader.readline())
            if msg.get("id") == n:
                return msg.get("result") or {}

    def save(name: str, value: dict) -> None:
        # all or nothing: written in state_dir itself, then renamed over (section 1: same mount)
        path = os.path.join(task["state_dir"], name)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)

    sid = ask("session.open", {"agent": task["agent"], "run_id": task["run_id"]})["session_id"]
    r = ask("lookup", {"session_id": sid, "idempotency_key": key, "operation": step["call"]})
    while r.get("category") == "rate_limited" and time.time() + r.get("retry_after_s", 0) < task["deadline"] - 1:
        time.sleep(r.get("retry_after_s", 0.1))
        r = ask("lookup", {"session_id": sid, "idempotency_key": key, "operation": step["call"]})
    if r.get("category") == "success" and r.get("reconciled") == "not_found":
        r = ask("call", {"session_id": sid, "operation": step["call"], "params": step["params"],
                         "idempotency_key": key, "wait_s": 0})
        if r.get("category") == "approval_pending":
            print(f"not done: {step['call']} was sent and waits for approval; stopped before saving it", flush=True)
            os._exit(0)  # the crash: the token is not kept
        print(f"not done: {step['call']} answered {r.get('category')}", flush=True)
        return
    if not (r.get("category") == "success" and r.get("reconciled") == "unknown" and r.get("resume_token")):
        print(f"not done: the lookup of {step['call']} answered {r.get('category')}/{r.get('reconciled')}",
              flush=True)
        return
    pending = {"request_id": r.get("request_id"), "deadline": r.get("deadline"),
               "resume_token": r["resume_token"]}
    wait = float(os.environ.get("LOOKWAIT41_RESUME_WAIT", "0"))
    if wait > 0:
        wait = max(0.0, min(wait, task["deadline"] - time.time() - 1.0))
        got = ask("call.resume", {"session_id": sid, "resume_token": r["resume_token"], "wait_s": wait})
        if got.get("category") != "approval_pending":
            print(f"not done: the resumed {step['call']} answered {got.get('category')}", flush=True)
            return
        pending = {"request_id": got.get("request_id") or pending["request_id"],
                   "deadline": got.get("deadline") or pending["deadline"],
                   "resume_token": got.get("resume_token") or pending["resume_token"]}
    save("pending.json", {step["id"]: pending})
    ask("session.close", {"session_id": sid})
    print(f"waiting: {step['call']} needs approval before {pending['deadline']} (request {pending['request_id']})",
          flush=True)


if __name__ == "__main__":
    main()
