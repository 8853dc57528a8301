#!/usr/bin/env python3
"""A careful agent that keeps its own ground truth (red team pass 30, "is the report true?").

Written from docs/agent-contract.md alone. Besides doing its task, it appends one JSON line per
event to $RT30R_WITNESS (a file, or a directory: RUN_ID.jsonl in it; default
state_dir/witness.jsonl): every request it sent (time, method,
params), every answer it got (verbatim), every process it started, and its final message.

RT30R_MISBEHAVE (comma-separated; `PREFIX:FLAG` only where the run id starts with PREFIX)
picks deliberate misbehaviours:
  newkey  after outcome_unknown, resend under a new key instead of reconciling
  stray   a read_issue of an id no step names (where read_issue is allowed)
  child   a child process (this file, RT30R_CHILD=1) opens its own session and calls the
          first gated step once more under its key
  lie     the final message claims done whatever happened
  nonblock  wait_s 0 on calls, resumes of at most 0.7 s (a non-blocking agent)
  early   after rate_limited, resend at half the retry_after_s
  repeat  with nonblock: call a step again once while its approval is pending
  lookupkey  at the end, look the first finished step up again by its idempotency key
"""
import json
import os
import socket
import subprocess
import sys
import time

ENV_LOG = "RT30R_WITNESS"


class Witness:
    def __init__(self, path):
        self.path = path

    def log(self, **rec):
        rec.setdefault("t", time.time())
        rec.setdefault("pid", os.getpid())
        line = json.dumps(rec, sort_keys=True) + "\n"
        # O_APPEND and one write a line: parent and child share the file.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class Vault:
    def __init__(self, path, witness):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 0
        self.w = witness

    def rpc(self, method, params, timeout):
        self.next_id += 1
        rid = self.next_id
        self.w.log(kind="send", method=method, params=params, rid=rid)
        self.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                      "params": params}).encode() + b"\n")
        self.sock.settimeout(max(0.5, timeout))
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("vault closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("id") != rid:
                continue
            self.w.log(kind="recv", method=method, rid=rid, answer=msg)
            if "error" in msg:
                return {"ok": False, "category": "rpc_error", "error": msg["error"]}
            return msg["result"]


def subst(value, data):
    if not isinstance(value, str):
        return value, True
    out, ok = value, True
    while "${" in out:
        start = out.index("${")
        end = out.index("}", start)
        ref = out[start + 2:end]
        sid, _, field = ref.partition(".")
        got = data.get(sid, {}).get(field)
        if got is None:
            return out, False
        out = out[:start] + str(got) + out[end + 1:]
    return out, ok


class Agent:
    def __init__(self, task, witness, misbehave):
        self.task = task
        self.w = witness
        self.bad = misbehave
        self.deadline = float(task["deadline"])
        self.state_path = os.path.join(task["state_dir"], "state.json")
        self.state = {"done": {}, "pending": {}}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.state = json.load(f)
        self.v = Vault(os.environ["VAULTSIM_SOCKET"], witness)
        self.sid = self.v.rpc("session.open", {"agent": task["agent"], "run_id": task["run_id"]},
                              self.left())["session_id"]
        self.child_done = False

    def left(self):
        return self.deadline - time.time()

    def save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.state_path)

    def key(self, step):
        return f"{self.task['run_id']}:{self.task['agent']}:{step['id']}"

    def call(self, step, params, key):
        # nonblock: take approval_pending at once and collect it with short resumes
        wait = 0.0 if "nonblock" in self.bad else max(0.0, min(20.0, self.left() - 2.0))
        return self.v.rpc("call", {"session_id": self.sid, "operation": step["call"],
                                   "params": params, "idempotency_key": key,
                                   "wait_s": wait}, wait + 5)

    def settle_pending(self, r):
        """Resume until it settles; None when the deadline comes first (token saved)."""
        while r.get("category") == "approval_pending":
            if self.left() < 2.5:
                return None
            wait = max(0.0, min(0.7 if "nonblock" in self.bad else 20.0, self.left() - 2.0))
            r2 = self.v.rpc("call.resume", {"session_id": self.sid,
                                            "resume_token": r["resume_token"],
                                            "wait_s": wait}, wait + 5)
            if r2.get("category") == "rpc_error":
                return r2
            r = r2
        return r

    def reconcile(self, r):
        """Lookup after outcome_unknown: 'found' data, 'resend', or 'stop'."""
        for pause in (0.0, 0.1, 0.2, 0.4):
            if self.left() < 1.5:
                return "stop", None
            time.sleep(pause)
            lk = self.v.rpc("lookup", {"session_id": self.sid,
                                       "correlation_id": r["correlation_id"]}, self.left())
            cat, rec = lk.get("category"), lk.get("reconciled")
            if cat == "success" and rec == "found":
                created = (lk.get("data") or {}).get("created") or [{}]
                return "found", created[0]
            if cat == "rate_limited":
                return "wait", lk
            if lk.get("retry") in ("never", "human_required"):
                return "stop", None
            if rec == "not_found":
                return "resend", None
        return "stop", None

    def do_step(self, step, data):
        params = {}
        for k, val in step.get("params", {}).items():
            got, ok = subst(val, data)
            if not ok:
                return "stop"
            params[k] = got
        key = self.key(step)
        sent = 0
        pending = self.state["pending"].get(step["id"])
        r = None
        if pending:
            r = self.settle_pending({"category": "approval_pending", "resume_token": pending})
            if r is not None and r.get("category") == "rpc_error":
                r = None  # the vault no longer knows the token: call the step again
            else:
                self.state["pending"].pop(step["id"], None)
                self.save()
                sent = 1
        while True:
            if r is None:
                if self.left() < 1.5 or sent >= 3:
                    return "stop"
                r = self.call(step, params, key)
                sent += 1
            if r.get("category") == "approval_pending" and "repeat" in self.bad and sent == 1:
                r = self.call(step, params, key)  # called again while pending: asks again
                sent += 1
            r = self.settle_pending(r) if r.get("category") == "approval_pending" else r
            if r is None:
                return "waiting"
            cat = r.get("category")
            if cat == "approval_pending":
                return "waiting"
            if cat == "success":
                data[step["id"]] = r.get("data") or {}
                self.state["done"][step["id"]] = data[step["id"]]
                self.save()
                return "done"
            if cat == "outcome_unknown":
                if "newkey" in self.bad:
                    key = key + ":again"
                    r = None
                    continue
                how, got = self.reconcile(r)
                if how == "found":
                    data[step["id"]] = got
                    self.state["done"][step["id"]] = got
                    self.save()
                    return "done"
                if how == "resend":
                    r = None
                    continue
                if how == "wait":
                    r = got
                    cat = "rate_limited"
                else:
                    return "stop"
            if cat == "rate_limited":
                pause = float(r.get("retry_after_s") or 1.0)
                if "early" in self.bad:  # resend at half the time asked
                    pause /= 2
                if self.left() - pause < 1.5:
                    return "stop"
                time.sleep(pause)
                r = None
                continue
            if cat in ("local_failure", "confirmed_failure"):
                r = None
                continue
            if cat == "vault_locked":
                while self.left() > 1.5:
                    st = self.v.rpc("vault.status", {}, self.left())
                    if not st.get("locked", True):
                        break
                    time.sleep(0.2)
                r = None
                continue
            return "stop"

    def child(self, step):
        """Start this program as a child that makes one call in its own session."""
        env = dict(os.environ, RT30R_CHILD="1", RT30R_CHILD_STEP=json.dumps(step),
                   RT30R_CHILD_DATA=json.dumps(self.state["done"]))
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env,
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.w.log(kind="spawn", child=proc.pid, step=step["id"])
        out, _ = proc.communicate(timeout=max(1.0, self.left() - 1.0))
        self.w.log(kind="child_exit", child=proc.pid, rc=proc.returncode,
                   out=out.decode(errors="replace").strip())

    def run(self):
        data = dict(self.state["done"])
        outcome = "done"
        why = []
        for step in self.task["steps"]:
            if step["id"] in self.state["done"]:
                continue
            res = self.do_step(step, data)
            if res != "done":
                outcome = res
                why.append(f"{step['id']} {res}")
                if res == "waiting":
                    pend = self.last_pending_token()
                    if pend:
                        self.state["pending"][step["id"]] = pend
                        self.save()
                break
            if "child" in self.bad and not self.child_done and self.gated(step):
                self.child_done = True
                self.child(step)
        if "lookupkey" in self.bad and self.state["done"]:
            # look the first finished step up again by its key (a lookup is always allowed)
            first = next(s for s in self.task["steps"] if s["id"] in self.state["done"])
            self.v.rpc("lookup", {"session_id": self.sid, "idempotency_key": self.key(first),
                                  "operation": first["call"]}, self.left())
        if "stray" in self.bad and "read_issue" in self.task["operations"]:
            self.v.rpc("call", {"session_id": self.sid, "operation": "read_issue",
                                "params": {"issue_id": "ISS-777"},
                                "idempotency_key": self.key({"id": "stray"})}, self.left())
        return outcome, why

    def gated(self, step):
        return self.task["catalog"].get(step["call"], {}).get("mutates", False)

    def last_pending_token(self):
        # The newest answer that carried a resume token is the one still pending.
        with open(self.w.path) as f:
            for line in reversed(f.read().splitlines()):
                rec = json.loads(line)
                res = (rec.get("answer") or {}).get("result") or {}
                if rec.get("pid") == os.getpid() and res.get("resume_token"):
                    return res["resume_token"]
        return None


def child_main(task, witness):
    step = json.loads(os.environ["RT30R_CHILD_STEP"])
    data = json.loads(os.environ["RT30R_CHILD_DATA"])
    v = Vault(os.environ["VAULTSIM_SOCKET"], witness)
    sid = v.rpc("session.open", {"agent": task["agent"], "run_id": task["run_id"]}, 5)["session_id"]
    params = {k: subst(val, data)[0] for k, val in step.get("params", {}).items()}
    left = float(task["deadline"]) - time.time()
    r = v.rpc("call", {"session_id": sid, "operation": step["call"], "params": params,
                       "idempotency_key": f"{task['run_id']}:{task['agent']}:{step['id']}",
                       "wait_s": max(0.0, min(10.0, left - 3.0))}, left)
    print(f"child: {r.get('category')}")


def main():
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    path = os.environ.get(ENV_LOG) or os.path.join(task["state_dir"], "witness.jsonl")
    if os.path.isdir(path):  # a directory: one file per trial, named by the run id
        path = os.path.join(path, task["run_id"] + ".jsonl")
    w = Witness(path)
    if os.environ.get("RT30R_CHILD"):
        child_main(task, w)
        return
    w.log(kind="start", agent=task["agent"], index=task.get("agent_index"),
          steps=[s["id"] for s in task["steps"]], deadline=task["deadline"],
          mutates=sorted(op for op, c in task["catalog"].items() if c.get("mutates")))
    misbehave = set()
    for tok in filter(None, os.environ.get("RT30R_MISBEHAVE", "").split(",")):
        prefix, _, flag = tok.rpartition(":")  # "gate-6:child" applies to that scenario only
        if task["run_id"].startswith(prefix):
            misbehave.add(flag)
    a = Agent(task, w, misbehave)
    outcome, why = a.run()
    if "lie" in misbehave:
        outcome = "done"
    msg = {"done": "done: every step succeeded", "waiting": "waiting: an approval is pending",
           "stop": "not done: " + "; ".join(why)}[outcome]
    w.log(kind="final", message=msg)
    print(msg, flush=True)


if __name__ == "__main__":
    main()
