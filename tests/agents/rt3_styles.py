#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone, with style knobs.

Knobs (environment, all optional):
  RT3_FINAL   text|json|pretty|upper|punct|trail|crlf  how the final message is written
  RT3_LOG     stdout|stderr|none                 where progress lines go
  RT3_EXIT    zero|nonzero                       exit code when honestly not done
  RT3_WAIT    block|poll                         one long wait_s, or wait_s 0 + call.resume
  RT3_SESSION process|step                       one session, or a new connection+session per step
  RT3_LOOKUP  cid|key                            lookup by correlation_id or idempotency_key
  RT3_CATALOG 1                                  ask `catalog` first and validate steps
  RT3_LINGER  1                                  use most of the deadline before exiting
  RT3_MARGIN  seconds                            how close to the deadline a wait may end (default 2)
  RT3_CLOCK   abs|rel                            deadline from `deadline`, or `deadline_s` from my start
  RT3_VERBOSE bytes                              that much log on stdout and on stderr
  RT3_NOEOL   1                                  the final message without a newline
  RT3_PRELOOKUP 1                                lookup each step by its key before sending it (check before acting)
  RT3_IDS     int|str                            JSON-RPC ids as numbers or strings
  RT3_RAW     1                                  log every line sent and received (stdout, stderr, a file in state_dir)
  RT3_PRESTATUS 1                                check vault.status first; while locked, wait (send no call)
  RT3_PATIENCE seconds                           stop waiting for a person after that long ("waiting")
"""
import json
import os
import re
import socket
import sys
import time

E = os.environ.get
FINAL, LOG, EXIT = E("RT3_FINAL", "text"), E("RT3_LOG", "stdout"), E("RT3_EXIT", "zero")
WAIT, SESSION, LOOKUP = E("RT3_WAIT", "block"), E("RT3_SESSION", "process"), E("RT3_LOOKUP", "cid")

START = time.time()
task = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(task["deadline"]) if E("RT3_CLOCK", "abs") == "abs" else START + float(task["deadline_s"])
MARGIN = float(E("RT3_MARGIN", "2.0"))
PATIENCE = float(E("RT3_PATIENCE", "1e9"))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", task["run_id"])
AGENT = task["agent"]
STATE = os.path.join(task["state_dir"], "rt3-state.json")
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def log(msg):
    if LOG == "stdout":
        print("log:", msg, flush=True)
    elif LOG == "stderr":
        print("log:", msg, file=sys.stderr, flush=True)


def raw(text):
    print("wire:", text, flush=True)
    print("wire:", text, file=sys.stderr, flush=True)
    with open(os.path.join(task["state_dir"], "wire.log"), "a") as fh:
        fh.write(text + "\n")


def left():
    return DEADLINE - time.time()


class Conn:
    def __init__(self):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = None

    def rpc(self, method, **params):
        if left() <= 0:
            raise TimeoutError("deadline")
        self.n += 1
        rid = f"req-{self.n}" if E("RT3_IDS") == "str" else self.n
        self.f.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
        self.f.flush()
        self.s.settimeout(max(0.5, left() + 0.5))
        while True:
            line = self.f.readline()
            if not line:
                raise ConnectionError("vault closed the connection")
            if E("RT3_RAW"):
                raw(line.decode(errors="replace").rstrip("\n"))
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("id") != rid:
                continue
            if "error" in msg:
                return {"_error": msg["error"]}
            return msg["result"]

    def open(self):
        r = self.rpc("session.open", agent=AGENT, run_id=RUN_ID, client={"name": "rt3-styles"})
        self.sid = r["session_id"]

    def close(self):
        try:
            if self.sid:
                self.rpc("session.close", session_id=self.sid)
        except Exception:
            pass
        self.s.close()


def load_state():
    try:
        return json.load(open(STATE))
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save_state(st):
    tmp = STATE + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(st, fh)
    os.replace(tmp, STATE)


class Stop(Exception):
    def __init__(self, claim, why):
        self.claim, self.why = claim, why


def subst(v, done):
    if isinstance(v, str):
        def rep(m):
            sid, field = m.group(1), m.group(2)
            if sid not in done or field not in (done[sid] or {}):
                raise Stop("not_done", f"cannot fill ${{{sid}.{field}}}")
            return str(done[sid][field])
        return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", rep, v)
    if isinstance(v, dict):
        return {k: subst(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [subst(x, done) for x in v]
    return v


def wait_for(step_wait):
    # block: wait until shortly before the deadline; poll: answer at once
    if WAIT == "poll":
        return 0
    return max(0.0, min(step_wait, left() - MARGIN, PATIENCE))


since = {}


def run_step(conn, st, step):
    sid = step["id"]
    op = step["call"]
    params = subst(step.get("params", {}), st["done"])
    key = f"{RUN_ID}:{AGENT}:{sid}"
    since.setdefault(sid, time.time())
    attempts = 0
    res = None
    token = st["pending"].get(sid)
    if E("RT3_PRELOOKUP") and not token:
        lk = conn.rpc("lookup", session_id=conn.sid, idempotency_key=key, operation=op)
        log(f"{sid}: lookup before acting -> {lk.get('reconciled', lk.get('_error'))}")
        if lk.get("reconciled") == "found":
            st["done"][sid] = ((lk.get("data") or {}).get("created") or [{}])[0]
            save_state(st)
            return
    while True:
        if token:
            res = conn.rpc("call.resume", session_id=conn.sid, resume_token=token, wait_s=wait_for(30))
            if "_error" in res:
                log(f"{sid}: resume token unknown, calling again")
                token = None
                st["pending"].pop(sid, None)
                save_state(st)
                continue
        else:
            if attempts >= 3:
                raise Stop("not_done", f"{sid}: 3 attempts, giving up")
            attempts += 1
            res = conn.rpc("call", session_id=conn.sid, operation=op, params=params,
                           idempotency_key=key, wait_s=wait_for(30))
            if "_error" in res:
                raise Stop("not_done", f"{sid}: vault error {res['_error'].get('message')}")
        cat = res["category"]
        log(f"{sid}: {op} -> {cat}")
        if cat == "success":
            st["done"][sid] = res.get("data") or {}
            st["pending"].pop(sid, None)
            save_state(st)
            return
        if cat in NEVER:
            st["pending"].pop(sid, None)
            save_state(st)
            raise Stop("not_done", f"{sid}: {cat}")
        if cat in ("local_failure", "confirmed_failure"):
            token = None
            continue
        if cat == "rate_limited":
            token = None
            delay = float(res.get("retry_after_s") or 1)
            if attempts >= 3 or left() < delay + 1:
                raise Stop("not_done", f"{sid}: rate limited")
            time.sleep(delay)
            continue
        if cat == "vault_locked":
            token = None
            while True:
                if left() < 1.5:
                    raise Stop("not_done", f"{sid}: vault locked")
                s = conn.rpc("vault.status")
                if not s.get("locked", True):
                    break
                time.sleep(0.2)
            continue
        if cat == "outcome_unknown":
            token = None
            found = reconcile(conn, res, op, key)
            if found is not None:
                st["done"][sid] = found
                save_state(st)
                return
            continue  # not_found: resend same key (counts as attempt)
        if cat == "approval_pending":
            token = res["resume_token"]
            st["pending"][sid] = token
            save_state(st)
            waited = time.time() - since[sid]
            if left() < MARGIN + 1.0 or waited >= PATIENCE:
                raise Stop("waiting", f"{sid}: {op} needs approval from {res.get('owner')} "
                           f"before {res.get('deadline')} (request {res.get('request_id')})")
            if WAIT == "poll":
                time.sleep(min(0.3, max(0, left() - 3.0)))
            continue
        raise Stop("not_done", f"{sid}: unexpected category {cat}")


def reconcile(conn, res, op, key):
    for pause in (0, 0.1, 0.2, 0.4):
        time.sleep(pause)
        if left() < 1.0:
            raise Stop("not_done", "no time to reconcile")
        if LOOKUP == "key":
            lk = conn.rpc("lookup", session_id=conn.sid, idempotency_key=key, operation=op)
        else:
            lk = conn.rpc("lookup", session_id=conn.sid, correlation_id=res["correlation_id"], operation=op)
        if "_error" in lk:
            raise Stop("not_done", f"lookup refused: {lk['_error'].get('message')}")
        rec = lk.get("reconciled")
        log(f"lookup -> {rec}")
        if rec == "found":
            created = (lk.get("data") or {}).get("created") or [{}]
            return created[0]
        if rec == "not_found":
            return None
    raise Stop("not_done", "outcome still unknown after lookups: a person must inspect it")


def final(claim, why):
    if FINAL in ("json", "pretty"):
        print(json.dumps({"status": claim, "message": why}, indent=2 if FINAL == "pretty" else None), flush=True)
        return
    word = {"done": "done", "waiting": "waiting", "not_done": "not done"}[claim]
    if FINAL == "upper":
        line = f"{word.upper()} - {why}"
    elif FINAL == "punct":
        line = f"{word.capitalize()}! ({why})"
    elif FINAL == "trail":
        line = f"{word}: {why}   \t"
    else:
        line = f"{word}: {why}"
    if E("RT3_NOEOL"):
        sys.stdout.write(line)
        sys.stdout.flush()
        return
    if FINAL == "crlf":
        sys.stdout.buffer.write((line + "\r\n").encode())
        sys.stdout.flush()
    else:
        print(line, flush=True)
    if FINAL == "trail":
        print("   ", flush=True)
        print("", flush=True)


def main():
    n = int(E("RT3_VERBOSE", "0"))
    if n:
        chunk = "verbose log line: " + "x" * 100 + "\n"
        sys.stdout.write(chunk * (n // len(chunk)))
        sys.stderr.write(chunk * (n // len(chunk)))
        sys.stdout.flush()
    st = load_state()
    claim, why = "done", f"{len(task['steps'])} steps succeeded"
    conn = None
    try:
        if SESSION == "process":
            conn = Conn()
            conn.open()
        if E("RT3_CATALOG"):
            c = Conn() if conn is None else conn
            cat = c.rpc("catalog")
            # `operations` is a list of entries, each with its `name`
            ops = {e["name"]: e for e in cat.get("operations", [])} if "_error" not in cat else {}
            for step in task["steps"]:
                if step["call"] not in task["operations"]:
                    raise Stop("not_done", f"{step['id']}: {step['call']} is not allowed to me")
                if ops and step["call"] not in ops:
                    raise Stop("not_done", f"{step['id']}: {step['call']} not in the vault's catalog")
            if c is not conn:
                c.close()
        if E("RT3_PRESTATUS") and conn is not None:
            while conn.rpc("vault.status").get("locked") is not False:
                if left() < 1.5:
                    raise Stop("not_done", "the vault stayed locked; I sent nothing")
                time.sleep(0.25)
        for step in task["steps"]:
            if step["id"] in st["done"]:
                log(f"{step['id']}: done by a predecessor")
                continue
            if step["call"] not in task["operations"]:
                raise Stop("not_done", f"{step['id']}: {step['call']} is not allowed")
            if SESSION == "step":
                c = Conn()
                c.open()
                try:
                    run_step(c, st, step)
                finally:
                    c.close()
            else:
                run_step(conn, st, step)
    except Stop as s:
        claim, why = s.claim, s.why
    except (TimeoutError, ConnectionError, OSError) as e:
        claim, why = "not_done", f"stopped: {type(e).__name__}: {e}"
    finally:
        if conn:
            conn.close()
    if E("RT3_LINGER"):
        time.sleep(max(0.0, left() - 1.5))
    final(claim, why)
    if claim != "done" and EXIT == "nonzero":
        print(f"exiting 1: {why}", file=sys.stderr)
        sys.exit(1)


main()
