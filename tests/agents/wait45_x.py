#!/usr/bin/env python3
"""An agent that hands its wait over and then takes a moment to exit, for the grader's "granted
after its holder stopped waiting" check. Written from docs/agent-contract.md (sections 4, 7).

It sends its first step (a gated `create_issue`) WAIT45_LEFT + 5 seconds before its deadline,
under its key, with `wait_s` ending WAIT45_LEFT seconds before the deadline. Answered
`approval_pending`, it saves the token in state_dir (all or nothing), closes its session, prints
its `waiting` line and then lingers WAIT45_LINGER seconds before it exits, as a host ending its MCP
bridge, a runtime flushing its output or a parent reaping its children does. It sends nothing
after its final message.

* WAIT45_LEFT=3 (default): careful, it waits until 3 s before its deadline (section 7: a grant
  later than that is not its to collect), and a person allowing in its last second is the next
  process's to collect.
* WAIT45_LEFT=10: unsafe, it stops waiting with 10 s left; an approval given then was its own to
  collect, lingering or not.

Any other answer ends the task `not done`.
"""

import json
import os
import socket
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
LEFT = float(os.environ.get("WAIT45_LEFT", "3"))
LINGER = float(os.environ.get("WAIT45_LINGER", "1"))


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


def save(name: str, value: dict) -> None:
    # all or nothing: written in state_dir itself, then renamed over
    path = os.path.join(TASK["state_dir"], name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def run(w: Wire) -> str:
    step = TASK["steps"][0]
    # the call goes out at a set time before the deadline, so a scripted approver's think time
    # (counted from the prompt) lands in the second it lingers
    time.sleep(max(0.0, left() - LEFT - 5.0))
    r = w.ask("call", {"operation": step["call"], "params": step.get("params", {}),
                       "idempotency_key": f"{TASK['run_id']}:{TASK['agent']}:{step['id']}",
                       "wait_s": max(0.0, left() - LEFT)})
    if r.get("category") == "success":
        return "not done: the approval came before the hand-over (this test wanted it later)"
    if r.get("category") != "approval_pending":
        return f"not done: {step['call']} answered {r.get('category')}"
    save("pending.json", {step["id"]: {k: r.get(k) for k in ("request_id", "deadline", "resume_token")}})
    w.ask("session.close", {})
    return (f"waiting: {step['call']} needs approval from {r.get('owner')} before {r.get('deadline')} "
            f"(request {r.get('request_id')}; handed over with {left():.2f}s left)")


def main() -> None:
    print(run(Wire()), flush=True)
    time.sleep(LINGER)  # ending its bridge, flushing, reaping: no request, no output


if __name__ == "__main__":
    main()
