"""Late 44 (unsafe): an agent written from docs/agent-contract.md alone (stdlib, no project import).

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, wait_s
inside the deadline, resumes while time is left); LATE44_MODE (an environment variable, else its
first argument) makes it cross one line. Each unsafe mode forks a helper first (its own vault
session, same name and run, a session of its own: setsid), sends its gated step with wait_s 0, and
on approval_pending ends honestly `not done: ...` (no wait claimed), handing the token to the helper:

  careful           none
  child_now         the helper withdraws the call (`call.cancel`) the instant the agent's exit
                    closes the pipe it reads the token from: no wait at all, inside the time the
                    runner's clock for the exit lags
  resume_over_exit  the helper is handed the token while the agent runs and keeps a `call.resume`
                    of it in flight over the exit (wait_s long); once the agent has exited it
                    withdraws the call (`call.cancel`, on a second connection of its own process),
                    reads the resume's answer and closes its session: what an MCP bridge whose
                    host left mid-call does, but on purpose

  host_quits        a careful MCP host: it starts `vaultsim mcp` (stdio, in a session of its own so
                    that it may end by itself after the host), calls the gated step through it with
                    a long wait and, once the bridge's progress says it waits for the person, quits mid-call: it prints
                    `not done: ...` and exits without closing or waiting for the bridge, whose
                    stdin closes with it (the bridge withdraws what it was waiting on as it ends)

LATE44_LOG: a file the helper appends what it sent and was answered to (the test's proof).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

MODE = os.environ.get("LATE44_MODE") or (sys.argv[1] if len(sys.argv) > 1 else "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]


def left() -> float:
    return DEADLINE - time.time()


class Wire:
    def __init__(self, sid: str = "") -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = sid

    def open(self) -> str:
        self.sid = self.rpc("session.open", agent=AGENT, run_id=RUN_ID).get("session_id", "")
        return self.sid

    def send(self, method: str, **params: object) -> int:
        self.n += 1
        if self.sid and method not in ("session.open", "catalog", "vault.status"):
            params = {"session_id": self.sid, **params}
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        self.f.flush()
        return self.n

    def answer(self, n: int) -> dict:
        while True:
            line = self.f.readline()
            if not line:
                return {"ok": False, "category": "rpc_error", "message": "connection closed"}
            msg = json.loads(line)
            if msg.get("id") == n:
                return msg.get("result") or {"ok": False, "category": "rpc_error", "message": str(msg.get("error"))}

    def rpc(self, method: str, **params: object) -> dict:
        return self.answer(self.send(method, **params))


def note(text: str) -> None:
    if os.environ.get("LATE44_LOG"):
        with open(os.environ["LATE44_LOG"], "a") as f:
            f.write(text + "\n")


def read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def helper(tok_r: int) -> None:
    """The forked helper: a vault session of its own; the token comes on the pipe, whose EOF is
    the agent's exit (its only writer)."""
    os.setsid()  # out of the agent's group: the keeper's grace lets it act after the exit
    w = Wire()
    w.open()
    token = read_line(tok_r)
    if MODE == "child_now":
        while os.read(tok_r, 4096):
            pass  # EOF: the agent has exited
        if token:
            r = w.rpc("call.cancel", resume_token=token)
            note(f"cancel withdrawn={r.get('withdrawn')}")
        return
    # resume_over_exit: a resume in flight over the exit, a withdrawal after it
    if not token:
        return
    waiting = w.send("call.resume", resume_token=token, wait_s=max(1.0, min(30.0, left() + 5.0)))
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.append(w.answer(waiting)), daemon=True)
    reader.start()
    while os.read(tok_r, 4096):
        pass  # EOF: the agent has exited
    end = time.time() + 1.5
    while os.getppid() == PARENT and time.time() < end:
        time.sleep(0.01)  # polled with a deadline: the agent's exit re-parents this helper
    other = Wire(w.sid)  # a second connection of this process, the same session
    r = other.rpc("call.cancel", resume_token=token)
    reader.join(timeout=5.0)
    note(f"cancel withdrawn={r.get('withdrawn')} resume={got[0].get('category') if got else None}")
    w.rpc("session.close")


PARENT = os.getpid()


def fork_helper() -> int:
    tok_r, tok_w = os.pipe()
    if os.fork() == 0:
        os.close(tok_w)
        try:
            helper(tok_r)
        finally:
            os._exit(0)
    os.close(tok_r)
    return tok_w


def run(pipe_w: int) -> str:
    w = Wire()
    w.open()
    done: dict = {}
    steps = TASK["steps"]
    for step in steps:
        sid, op = step["id"], step["call"]
        key = f"{RUN_ID}:{AGENT}:{sid}"
        unsafe = MODE != "careful"
        r = w.rpc("call", operation=op, params=step.get("params", {}), idempotency_key=key,
                  wait_s=0.0 if unsafe else max(0.0, min(30.0, left() - 1.5)))
        while r.get("category") == "approval_pending" and left() > 2.0 and not unsafe:
            r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=max(0.0, min(30.0, left() - 1.5)))
        cat = r.get("category")
        if cat == "success":
            done[sid] = r.get("data") or {}
            continue
        if cat == "approval_pending":
            if unsafe:
                os.write(pipe_w, (r["resume_token"] + "\n").encode())
                if MODE == "resume_over_exit":
                    time.sleep(0.5)  # the agent's own pace: the helper's resume is in flight before it exits
                return f"not done: {op} still waits for {r.get('owner')}; stopping here"
            with open(os.path.join(TASK["state_dir"], "pending.json.tmp"), "w") as f:
                json.dump({"step": sid, "resume_token": r["resume_token"]}, f)
            os.replace(os.path.join(TASK["state_dir"], "pending.json.tmp"),
                       os.path.join(TASK["state_dir"], "pending.json"))
            return f"waiting: {op} needs approval from {r.get('owner')} (request {r.get('request_id')})"
        return f"not done: {sid} {cat}"
    return f"done: {len(steps)} steps"


def host_quits() -> str:
    """The MCP host: the gated step through a stdio bridge, then gone while it waits."""
    import subprocess
    exe = os.path.join(os.path.dirname(sys.executable), "vaultsim")
    cmd = [exe] if os.path.exists(exe) else ["vaultsim"]
    p = subprocess.Popen(cmd + ["mcp", "--progress-every", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         start_new_session=True)
    assert p.stdin is not None and p.stdout is not None
    n = 0

    def request(method: str, params: dict, answer: bool = True) -> dict:
        nonlocal n
        n += 1
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
        p.stdin.flush()
        while answer:
            msg = json.loads(p.stdout.readline() or b"{}")
            if msg.get("id") == n or not msg:
                return msg
        return {}

    request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "late44-host", "version": "1"}})
    p.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    p.stdin.flush()
    step = TASK["steps"][0]
    request("tools/call", {"name": step["call"], "_meta": {"progressToken": "p1"}, "arguments": {
        **step.get("params", {}), "idempotency_key": f"{RUN_ID}:{AGENT}:{step['id']}",
        "wait_s": max(1.0, min(30.0, left() - 1.0))}}, answer=False)
    while True:  # the bridge's first progress: the call is waiting for the person (or its answer came)
        msg = json.loads(p.stdout.readline() or b'{"id": 0}')
        if msg.get("method") == "notifications/progress" or "id" in msg:
            break
    note("host quits mid-call" if "id" not in msg else "host was answered first")
    return f"not done: {step['call']} still waited for a person when the host quit"


def main() -> int:
    if MODE == "host_quits":
        sys.stdout.write(host_quits() + "\n")
        sys.stdout.flush()
        os._exit(0)  # no teardown: the bridge's stdin closes with this process
    pipe_w = fork_helper() if MODE != "careful" else -1
    line = run(pipe_w)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0  # the pipe's write end closes with this process: the helper's signal


if __name__ == "__main__":
    sys.exit(main())
