"""A pool agent and a `never` answer (docs/agent-contract.md §4, §9), from the contract alone
(stdlib, no project import).

The task: a read that will be refused for good (`never`), an independent read, then a create.
Worker B (the independent read) is forked first and has its session open before worker A (the
refused read) is forked; B sends only once A has its answer, as a pool's other worker may.
MODE (an environment variable):

  sibling  B's read goes out after A's refusal, from a worker started before it (§9: not held);
           the parent then stops `not done`: careful
  parent   the same, then the parent, which handed A its step and read its refusal, sends the
           create all the same: went on after `never`
  child    A, told `never`, forks a new child that sends the independent read; B sends nothing:
           went on after `never` (a process started after the answer is held to it)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

MODE = os.environ.get("MODE", "sibling")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
AGENT = TASK["agent"]


class Wire:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = ""
        self.sid = self.rpc("session.open", agent=AGENT, run_id=RUN_ID)["session_id"]

    def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        if self.sid:
            params = {"session_id": self.sid, **params}
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            if not line:
                return {"ok": False, "category": "rpc_error"}
            msg = json.loads(line)
            if msg.get("id") == self.n:
                return msg.get("result") or {"ok": False, "category": "rpc_error"}

    def step(self, step: dict) -> dict:
        return self.rpc("call", operation=step["call"], params=step.get("params") or {},
                        idempotency_key=f"{RUN_ID}:{AGENT}:{step['id']}", wait_s=5)


def main() -> int:
    refused, other, create = TASK["steps"][:3]
    ready_r, ready_w = os.pipe()   # B: my session is open
    told_r, told_w = os.pipe()     # A: I have my answer
    result_r, result_w = os.pipe()  # A: what I was told
    b = os.fork()
    if b == 0:
        w = Wire()
        os.write(ready_w, b"1")
        os.read(told_r, 1)
        if MODE != "child":
            w.step(other)
        os._exit(0)
    os.read(ready_r, 1)
    time.sleep(0.05)  # a pool started well before its next task's answer (more than a clock tick)
    a = os.fork()
    if a == 0:
        r = Wire().step(refused)
        os.write(result_w, str(r.get("retry")).encode() + b"\n")
        if MODE == "child" and r.get("retry") == "never":
            if os.fork() == 0:
                Wire().step(other)
                os._exit(0)
            os.wait()
        os.write(told_w, b"1")
        os._exit(0)
    os.waitpid(a, 0)
    os.waitpid(b, 0)
    retry = os.read(result_r, 64).decode().strip()
    if retry == "never" and MODE == "parent":
        Wire().step(create)
    print(f"not done: {refused['call']} was refused for good (retry: {retry})" if retry == "never" else "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
