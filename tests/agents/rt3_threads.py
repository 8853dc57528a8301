#!/usr/bin/env python3
"""A careful agent with threads, written from docs/agent-contract.md alone.

Each step runs on its own worker thread (one after another, as the steps are in
order); the threads share the process's one connection and session: a reader
thread hands each answer to the thread waiting for its id. A watchdog thread
asks vault.status meanwhile. Blocking style: one call with wait_s up to shortly
before the deadline. Final message: `SUCCESS` / `FAILED: ...` / `PENDING: ...`,
and exit 3 when not done (the contract reports it with the last stderr line).
"""
import json
import os
import re
import socket
import sys
import threading
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID") or TASK["run_id"]
AGENT = TASK["agent"]
DEADLINE = float(TASK["deadline"])
STATE = os.path.join(TASK["state_dir"], "threads-agent.json")
NEVER = {"authentication_failed", "authorization_denied", "malformed_response",
         "approval_denied", "approval_expired", "approval_unroutable"}


def left():
    return DEADLINE - time.time()


class Stop(Exception):
    def __init__(self, claim, why):
        super().__init__(why)
        self.claim = claim


class Vault:
    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["VAULTSIM_SOCKET"])
        self.lock = threading.Lock()
        self.n = 0
        self.slots = {}
        self.closed = threading.Event()
        self.sid = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.sock.makefile("rb"):
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            slot = self.slots.get(msg.get("id")) if isinstance(msg, dict) else None
            if slot:
                slot[1] = msg
                slot[0].set()
        self.closed.set()
        for slot in list(self.slots.values()):
            slot[0].set()

    def rpc(self, method, **params):
        if left() <= 0:
            raise Stop("not_done", "deadline reached")
        with self.lock:
            self.n += 1
            rid = self.n
            slot = self.slots[rid] = [threading.Event(), None]
            self.sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                           "params": params}) + "\n").encode())
        slot[0].wait(timeout=max(0.5, left() + 0.5))
        del self.slots[rid]
        msg = slot[1]
        if msg is None:
            raise Stop("not_done", f"no answer to {method}")
        return {"_error": msg["error"]} if "error" in msg else msg["result"]


def load():
    try:
        with open(STATE) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save(st):
    with open(STATE + ".tmp", "w") as fh:
        json.dump(st, fh)
    os.replace(STATE + ".tmp", STATE)


def fill(v, done):
    if isinstance(v, str):
        return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)][m.group(2)]), v)
    if isinstance(v, dict):
        return {k: fill(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, done) for x in v]
    return v


def work(v, st, s):
    sid, op = s["id"], s["call"]
    try:
        params = fill(s.get("params") or {}, st["done"])
    except KeyError:
        raise Stop("not_done", f"{sid}: missing data from an earlier step")
    key = f"{RUN_ID}:{AGENT}:{sid}"
    attempts, token = 0, st["pending"].get(sid)
    while True:
        wait = max(0.0, min(60.0, left() - 2.5))
        if token:
            res = v.rpc("call.resume", session_id=v.sid, resume_token=token, wait_s=wait)
            if "_error" in res:
                token = None
                continue
        else:
            if attempts == 3:
                raise Stop("not_done", f"{sid}: 3 attempts")
            attempts += 1
            res = v.rpc("call", session_id=v.sid, operation=op, params=params, idempotency_key=key, wait_s=wait)
            if "_error" in res:
                raise Stop("not_done", f"{sid}: {res['_error'].get('message')}")
        cat = res["category"]
        if cat == "success":
            st["done"][sid] = res.get("data") or {}
            st["pending"].pop(sid, None)
            save(st)
            return
        if cat in NEVER:
            st["pending"].pop(sid, None)
            save(st)
            raise Stop("not_done", f"{sid}: {cat}")
        token = None
        if cat in ("local_failure", "confirmed_failure"):
            continue
        if cat == "rate_limited":
            d = float(res.get("retry_after_s", 1))
            if attempts >= 3 or left() < d + 1:
                raise Stop("not_done", f"{sid}: rate limited")
            time.sleep(d)
        elif cat == "vault_locked":
            while v.rpc("vault.status").get("locked") is not False:
                if left() < 1.5:
                    raise Stop("not_done", f"{sid}: locked")
                time.sleep(0.2)
        elif cat == "outcome_unknown":
            rec = "unknown"
            for pause in (0, 0.1, 0.2, 0.4):
                time.sleep(pause)
                lk = v.rpc("lookup", session_id=v.sid, correlation_id=res["correlation_id"], operation=op)
                rec = lk.get("reconciled", "error")
                if rec != "unknown":
                    break
            if rec == "found":
                st["done"][sid] = ((lk.get("data") or {}).get("created") or [{}])[0]
                save(st)
                return
            if rec != "not_found":
                raise Stop("not_done", f"{sid}: outcome unknown")
        elif cat == "approval_pending":
            token = res["resume_token"]
            st["pending"][sid] = token
            save(st)
            if left() < 3:
                raise Stop("waiting", f"{sid}: {op} waits for {res.get('owner')} until {res.get('deadline')}")
        else:
            raise Stop("not_done", f"{sid}: {cat}")


def main():
    st = load()
    v = Vault()
    opened = v.rpc("session.open", agent=AGENT, run_id=RUN_ID, client={"name": "threads-agent"})
    if "_error" in opened:
        raise Stop("not_done", "no session")
    v.sid = opened["session_id"]
    stop_watch = threading.Event()

    def watchdog():
        while not stop_watch.wait(0.4) and left() > 1:
            try:
                v.rpc("vault.status")
            except Stop:
                return

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        for s in TASK["steps"]:
            if s["id"] in st["done"]:
                continue
            if s["call"] not in TASK["operations"]:
                raise Stop("not_done", f"{s['call']} not allowed")
            err = []

            def run(s=s):
                try:
                    work(v, st, s)
                except BaseException as e:
                    err.append(e)

            t = threading.Thread(target=run, name=s["id"])
            t.start()
            t.join()
            if err:
                raise err[0]
    finally:
        stop_watch.set()
    v.rpc("session.close", session_id=v.sid)


try:
    main()
    print("SUCCESS", flush=True)
except Stop as e:
    print(("PENDING: " if e.claim == "waiting" else "FAILED: ") + str(e), flush=True)
    if e.claim != "waiting":
        print(f"threads-agent: {e}", file=sys.stderr, flush=True)
        sys.exit(3)
