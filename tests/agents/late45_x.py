"""Late 45 (unsafe): an agent written from docs/agent-contract.md alone (stdlib, no project import).

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, each
answer awaited) and exits the moment its last answer is in. LATE45_MODE (an environment
variable, else its first argument) makes it cross one line first: it double-forks a grandchild
(its middle child exits at once, so the grandchild hangs below the agent's keeper or the jail's
init, with no agent among its ancestors), which waits for the agent's exit (LATE45_WAIT: `pidfd`,
a pidfd of the agent's pid, or `pipe`, the EOF of a pipe the agent alone holds open) and then, with
no sleep at all:

  careful   none (its last call comes right before its exit)
  call      calls the task's first step again on a session it opened while the agent ran, under
            that step's key (a read: no second effect)
  lookup    looks that step up by its key, on a session it opened while the agent ran
  open      opens a session of its own (and nothing else)

LATE45_LOG: a file the grandchild appends what it sent and was answered to (the test's proof).
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time

MODE = os.environ.get("LATE45_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")
WAIT = os.environ.get("LATE45_WAIT", "pidfd")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]


class Wire:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = ""

    def open(self) -> str:
        self.sid = self.rpc("session.open", agent=AGENT, run_id=RUN_ID).get("session_id", "")
        return self.sid

    def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        if self.sid and method != "session.open":
            params = {"session_id": self.sid, **params}
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            if not line:
                return {"ok": False, "category": "rpc_error", "message": "connection closed"}
            msg = json.loads(line)
            if msg.get("id") == self.n:
                return msg.get("result") or {"ok": False, "category": "rpc_error", "message": str(msg.get("error"))}


def note(text: str) -> None:
    if os.environ.get("LATE45_LOG"):
        with open(os.environ["LATE45_LOG"], "a") as f:
            f.write(text + "\n")


def key(step: dict) -> str:
    return f"{RUN_ID}:{AGENT}:{step.get('id') or step['call']}"


def grandchild(agent: int, exit_r: int, ready_w: int) -> None:
    """Below the keeper (or the jail's init) once its parent is gone: waits for the agent's exit, then acts."""
    os.setsid()  # out of the agent's group: the keeper's grace for a helper ending by itself lets it act
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the agent's output pipes are its own
        os.dup2(null, fd)
    step = TASK["steps"][0]
    w = Wire()
    if MODE != "open":
        w.open()  # while the agent runs
    waiter = os.pidfd_open(agent) if WAIT == "pidfd" else exit_r
    os.write(ready_w, b"r")
    os.close(ready_w)
    poll = select.poll()
    poll.register(waiter, select.POLLIN)
    poll.poll()  # the agent's exit: its pidfd readable, or the pipe's EOF
    if MODE == "call":
        r = w.rpc("call", operation=step["call"], params=step.get("params", {}), idempotency_key=key(step))
        note(f"call {r.get('category')}")
    elif MODE == "lookup":
        r = w.rpc("lookup", idempotency_key=key(step), operation=step["call"])
        note(f"lookup {r.get('reconciled')}")
    elif MODE == "open":
        note(f"open {bool(w.open())}")


def double_fork() -> int:
    """The grandchild, started and ready (its session open, its wait set); returns the pipe whose
    write end the agent alone keeps (its EOF is the agent's exit)."""
    agent = os.getpid()
    exit_r, exit_w = os.pipe()
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:  # the middle child
        os.close(exit_w)
        os.close(ready_r)
        if os.fork() == 0:
            try:
                grandchild(agent, exit_r, ready_w)
            finally:
                os._exit(0)
        os._exit(0)
    os.close(exit_r)
    os.close(ready_w)
    os.read(ready_r, 1)  # its session is open and it waits
    os.close(ready_r)
    os.wait()  # the middle child: gone, the grandchild is an orphan now
    return exit_w


def run() -> str:
    w = Wire()
    w.open()
    for step in TASK["steps"]:
        r = w.rpc("call", operation=step["call"], params=step.get("params", {}), idempotency_key=key(step),
                  wait_s=max(0.0, min(30.0, DEADLINE - time.time() - 1.5)))
        if r.get("category") != "success":
            return f"not done: {step['call']} {r.get('category')}"
    return f"done: {len(TASK['steps'])} step(s)"


def main() -> int:
    if MODE != "careful":
        double_fork()  # (the pipe's write end stays open until this process exits)
    line = run()
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0  # exits now: the grandchild's pidfd turns readable, its pipe reads EOF


if __name__ == "__main__":
    sys.exit(main())
