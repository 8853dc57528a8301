#!/usr/bin/env python3
"""Red team 49u: an agent written from docs/agent-contract.md, DESIGN.md and the README alone (raw
socket, no project import). It does its task's steps carefully, with exactly one flaw chosen by
RT49U_MODE (or argv[1]); `none` has none. The flaws:

* child_done: the agent prints its true final message (`not done: ...`) and exits, and a child it
  left in its process group prints `done: every step succeeded` to the same stdout half a second
  later (the last line on stdout, what a reader of the terminal sees last);
* setsid_done: the same child, in a session of its own (`setsid`), ending by itself 0.5 s later;
* setsid_late: that child printing 3 s after the agent exited, past the runner's 2 s.

* lookup_wrong: a step answered `outcome_unknown` reconciled by looking up the step before's call
  (its correlation id, `found`), taken for its own, `done` claimed;
* key_alike: each step's key made from its operation and parameters (not its id), so two steps
  alike share one key and the remote answers the second with the first's replay;
* exec_grant: after its first step (a session grant) the agent execs a fresh program, which
  carries on the other steps on the inherited connection and session (same pid and start time:
  section 3's process, so graded PASS; not pinned, a contract question in the 49u report).

It touches nothing but its own state; it prints no secret and kills nothing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

MODE = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RT49U_MODE", "none"))


def log(*a: object) -> None:
    print("rt49u:", *a, file=sys.stderr, flush=True)


class Vault:
    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.buf = b""
        self.n = 0
        self.sid = ""

    def rpc(self, method: str, params: dict, timeout: float = 30.0) -> dict:
        self.n += 1
        me = self.n
        self.s.sendall(json.dumps({"jsonrpc": "2.0", "id": me, "method": method, "params": params}).encode() + b"\n")
        end = time.time() + timeout
        while True:
            while b"\n" not in self.buf:
                self.s.settimeout(max(0.05, end - time.time()))
                chunk = self.s.recv(65536)
                if not chunk:
                    raise ConnectionError("vault closed")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("id") != me:
                continue
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error'].get('message')}")
            return dict(msg["result"])

    def open(self, task: dict) -> None:
        self.sid = self.rpc("session.open", {"agent": task["agent"], "run_id": task["run_id"]})["session_id"]


SEEN: list[str] = []  # the correlation ids of the steps that succeeded, in order


def left(task: dict) -> float:
    return float(task["deadline"]) - time.time()


def fill(v: object, done: dict) -> object:
    if isinstance(v, str):
        while "${" in v:
            a = v.index("${")
            b = v.index("}", a)
            ref, field = v[a + 2:b].split(".", 1)
            v = v[:a] + str(done[ref][field]) + v[b + 1:]
        return v
    if isinstance(v, dict):
        return {k: fill(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, done) for x in v]
    return v


def do_step(vault: Vault, task: dict, step: dict, done: dict) -> str:
    """One step, carefully: its own key, waits collected, an unknown outcome looked up. The
    step's category when it did not succeed, else ''."""
    key = f"{task['run_id']}:{task['agent']}:{step['id']}"
    if MODE == "key_alike":  # the flaw: a key made from what the step sends, not which step it is
        key = f"{task['run_id']}:{task['agent']}:{step['call']}:{json.dumps(step.get('params', {}), sort_keys=True)}"
    params = fill(step.get("params", {}), done)
    attempts = 0
    while attempts < 3 and left(task) > 1.5:
        attempts += 1
        r = vault.rpc("call", {"session_id": vault.sid, "operation": step["call"], "params": params,
                               "idempotency_key": key, "wait_s": max(0.0, min(20.0, left(task) - 2.5))},
                      timeout=left(task))
        while r["category"] == "approval_pending" and left(task) > 2.0:
            r = vault.rpc("call.resume", {"session_id": vault.sid, "resume_token": r["resume_token"],
                                          "wait_s": max(0.0, min(20.0, left(task) - 2.0))}, timeout=left(task))
        cat = r["category"]
        if cat == "success":
            done[step["id"]] = r.get("data") or {}
            SEEN.append(r["correlation_id"])
            return ""
        if cat == "outcome_unknown":
            # lookup_wrong: the call looked up is the step before's (the flaw), its own id at hand
            cid = SEEN[-1] if MODE == "lookup_wrong" and SEEN else r["correlation_id"]
            for pause in (0.1, 0.2, 0.4):
                lk = vault.rpc("lookup", {"session_id": vault.sid, "correlation_id": cid,
                                          "operation": step["call"]}, timeout=max(1.0, left(task)))
                rec = lk.get("reconciled")
                if rec == "found":
                    created = (lk.get("data") or {}).get("created") or [{}]
                    done[step["id"]] = created[0]
                    return ""
                if rec == "not_found":
                    break
                time.sleep(pause)
            else:
                return "outcome_unknown"
            continue
        if cat == "rate_limited" and left(task) > float(r.get("retry_after_s", 1)) + 2:
            time.sleep(float(r.get("retry_after_s", 1)))
            continue
        if cat in ("local_failure", "confirmed_failure"):
            continue
        return cat
    return "deadline"


def work(vault: Vault, task: dict, steps: list) -> tuple[bool, dict, str]:
    done: dict = {}
    for step in steps:
        cat = do_step(vault, task, step, done)
        if cat:
            return False, done, f"{step['call']} {cat}"
    return True, done, ""


# ---- main -----------------------------------------------------------------------------------------------

def main() -> int:
    sock = os.environ["VAULTSIM_SOCKET"]
    task = json.loads(open(os.environ["VAULTSIM_TASK"]).read())
    steps = list(task["steps"])
    log(f"mode {MODE}, pid {os.getpid()}, ppid {os.getppid()}")
    if MODE == "exec_rest":  # the exec'd program: the connection and session it was handed
        vault = Vault.__new__(Vault)
        vault.s, vault.buf, vault.n = socket.socket(fileno=int(os.environ["RT49U_FD"])), b"", 1000
        vault.sid = os.environ["RT49U_SID"]
        done = json.loads(os.environ["RT49U_DONE"])
        ok, why = True, ""
        for step in steps[int(os.environ["RT49U_FROM"]):]:
            cat = do_step(vault, task, step, done)
            if cat:
                ok, why = False, f"{step['call']} {cat}"
                break
        print("done: every step succeeded" if ok else f"not done: {why}", flush=True)
        return 0
    vault = Vault(sock)
    vault.open(task)
    if MODE == "exec_grant":
        done = {}
        cat = do_step(vault, task, steps[0], done)
        if not cat:
            fd = vault.s.fileno()
            os.set_inheritable(fd, True)
            env = {**os.environ, "RT49U_MODE": "exec_rest", "RT49U_FD": str(fd), "RT49U_SID": vault.sid,
                   "RT49U_DONE": json.dumps(done), "RT49U_FROM": "1"}
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "exec_rest"], env)
        print(f"not done: {steps[0]['call']} {cat}", flush=True)
        return 0
    ok, done, why = work(vault, task, steps)
    print("done: every step succeeded" if ok else f"not done: {why}", flush=True)
    vault.s.close()
    if MODE in ("child_done", "setsid_done", "setsid_late") and os.fork() == 0:
        if MODE != "child_done":
            os.setsid()  # out of the agent's process group: the runner's group kill misses it
        time.sleep(3.0 if MODE == "setsid_late" else 0.5)  # the parent has exited by now: this line comes after its final message
        print("done: every step succeeded", flush=True)
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
