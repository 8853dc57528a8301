#!/usr/bin/env python3
"""The step helper of rt35c_duo.sh: a careful agent made of two cooperating programs.

Written from docs/agent-contract.md alone (no `import vault`). The POSIX sh driver decides the
order and runs this helper once per batch of steps; every process holds its own connection and
session (section 3) and hands the next one nothing but files in state_dir:

  plan            print the batches, one line of step indexes each. A step of an operation the
                  vault's `catalog` calls `approval.mode: session` runs in the same process as
                  every other step of that operation (and all steps between them, in order): a
                  grant covers one session only, and a helper per step would ask the owner again.
  run I J ...     do those steps in order: one session, one connection, closed at exit.
                  Exit 0: go on; 3: the task stops (a never answer, or a step's data missing);
                  4: the deadline came (a pending token saved, or a wait not done).
  final           print the final message from state_dir.

State: one JSON file per step in state_dir/steps/ (named by the step id's digest), replaced
whole by a rename of a file written in state_dir itself (section 1: /tmp is another mount in the
jail), fsynced; plus `stop.json` when a never answer ended the task. A record says what a
successor needs: done with data, pending with its resume token, sent (a call whose answer this
process may not have read: looked up first), unknown (its correlation id), rate_limited with the
time it may be sent again, attempts so far. A restart (same name, same state_dir) reads them.

RT35C_LIE=1 is the lying twin: it claims done whatever happened (RT35C_LIE=wait: waiting).
RT35C_CRASH=auto|all: a helper dies right after the vault took a step's first call, before its
answer (once a step: a marker in state_dir); the driver runs the batch again in a new helper, which finds
the step `sent` and looks it up by key before anything else. `auto` crashes only on operations the
catalog runs without a person: a restarted worker's prompts count (section 8), so crashing on a
gated call costs prompts wherever the step must be sent again; `all` crashes on every call.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import sys
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
STATE = TASK["state_dir"]
STEPS = TASK["steps"]
OPS = set(TASK.get("operations") or [])
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
BOUNDED = {"local_failure", "confirmed_failure"}
REF = re.compile(r"\$\{([^}.]+)\.([^}]+)\}")


def left() -> float:
    return DEADLINE - time.time()


def log(*a: object) -> None:
    print("[step]", *a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ state files

def step_path(sid: str) -> str:
    return os.path.join(STATE, "steps", hashlib.sha256(sid.encode()).hexdigest()[:32] + ".json")


def write_atomic(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(sid: str) -> dict:
    try:
        with open(step_path(sid), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save(sid: str, rec: dict) -> None:
    rec["id"] = sid
    write_atomic(step_path(sid), rec)


def stop_task(why: str) -> None:
    write_atomic(os.path.join(STATE, "stop.json"), {"why": why})


def stopped() -> str | None:
    try:
        with open(os.path.join(STATE, "stop.json"), encoding="utf-8") as f:
            return json.load(f)["why"]
    except (OSError, ValueError, KeyError):
        return None


def modes() -> dict:
    try:
        with open(os.path.join(STATE, "modes.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------ the wire

class Conn:
    def __init__(self) -> None:
        self.sock = self._connect()
        self.buf = b""
        self.next_id = 0

    def _connect(self) -> socket.socket:
        delay = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(max(0.1, min(5.0, left())))
            try:
                s.connect(os.environ["VAULTSIM_SOCKET"])
                return s
            except OSError as e:
                s.close()
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK) or left() < 1.0:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def ask(self, method: str, params: dict | None = None, budget: float | None = None) -> dict:
        """One request, its answer (`result` or `error`); raises TimeoutError near the deadline."""
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError:
            pass  # a refusal's frame may still be there to read
        crash = os.environ.get("RT35C_CRASH")
        if method == "call" and crash and (crash == "all" or modes().get(params.get("operation")) == "auto"):
            mark = os.path.join(STATE, "crashed-" + hashlib.sha256(
                str(params.get("idempotency_key")).encode()).hexdigest()[:16])
            if not os.path.exists(mark):
                write_atomic(mark, {})
                self._taken()
                os._exit(9)
        return self._answer(rid, time.time() + (budget if budget is not None else left() - 0.3), method)

    def _taken(self) -> None:
        """Before a crash: wait until the vault has taken the call just sent. The vault refuses a
        request its process had exited before it was handled (section 3: the session ended with
        it), so a helper dying at once left no call on a loaded host, and its successor's lookup
        was `not_found`. The vault handles one connection's lines in order: its answer to a
        `vault.status` sent after the call says the call was taken (its own answer is not read)."""
        self.next_id += 1
        rid = self.next_id
        try:
            self.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "vault.status"}).encode() + b"\n")
            self._answer(rid, time.time() + max(0.1, min(5.0, left() - 0.5)), "vault.status")
        except (OSError, TimeoutError, ConnectionError):
            pass  # die all the same

    def _answer(self, rid: int, end: float, method: str) -> dict:
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("id") == rid:
                    return doc
            rest = end - time.time()
            if rest <= 0:
                raise TimeoutError(method)
            self.sock.settimeout(rest)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError(method) from None
            if not chunk:
                raise ConnectionError("the vault closed the connection")
            self.buf += chunk


# ------------------------------------------------------------------ plan

def plan() -> None:
    modes: dict[str, str] = {}
    try:
        c = Conn()
        ans = c.ask("catalog", budget=min(10.0, left() - 0.5))
        for op in (ans.get("result") or {}).get("operations") or []:
            modes[op.get("name")] = ((op.get("approval") or {}).get("mode")) or "auto"
        c.sock.close()
    except Exception as e:  # without the catalog, treat every operation as session-granted
        log("catalog unread:", e)
    write_atomic(os.path.join(STATE, "modes.json"), modes)
    n = len(STEPS)
    group = list(range(n))  # union of intervals: steps of one session-mode operation together
    spans: dict[str, list[int]] = {}
    for i, st in enumerate(STEPS):
        if modes.get(st["call"], "session") == "session":
            spans.setdefault(st["call"], []).append(i)
    ends = list(range(n))
    for idx in spans.values():
        for i in range(idx[0], idx[-1] + 1):
            ends[i] = max(ends[i], idx[-1])
    i = 0
    while i < n:
        j, end = i, ends[i]
        while j < end:
            j += 1
            end = max(end, ends[j])
        print(" ".join(str(k) for k in range(i, j + 1)))
        group[i] = j
        i = j + 1


# ------------------------------------------------------------------ steps

def data_of(sid: str) -> dict | None:
    rec = load(sid)
    return rec.get("data") if rec.get("state") == "done" else None


def fill(value: object) -> object:
    """Replace ${ID.FIELD} from the saved data of earlier steps; KeyError when one is missing."""
    if isinstance(value, str):
        def one(m: re.Match) -> str:
            data = data_of(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data or data[m.group(2)] is None:
                raise KeyError(m.group(0))
            got = data[m.group(2)]
            return got if isinstance(got, str) else json.dumps(got)
        return REF.sub(one, value)
    if isinstance(value, dict):
        return {k: fill(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v) for v in value]
    return value


def key_of(sid: str) -> str:
    key = f"{TASK['run_id']}:{TASK['agent']}:{sid}"
    return key if len(key) <= 200 else f"{TASK['run_id']}:" + hashlib.sha256(sid.encode()).hexdigest()


class Stop(Exception):
    """The task stops (a never answer): code 3."""


class Late(Exception):
    """The deadline came: code 4."""


def settle_lookup(c: Conn, sess: str, rec: dict, st: dict, by: dict) -> dict | None:
    """Ask what an earlier call did; returns a Result to follow as the call's own, or None."""
    tries = 0
    pause = 0.1
    while True:
        if left() < 3.0:  # a lookup over SSH takes seconds: none started this late
            raise Late("lookup")
        ans = c.ask("lookup", {"session_id": sess, "operation": st["call"], **by})
        res = ans.get("result")
        if not isinstance(res, dict):
            return None  # an error: nothing looked up; the step ends
        cat, rec_ = res.get("category"), res.get("reconciled")
        if rec_ in ("found", "not_found") and cat != "success":
            return res  # the call's own answer
        if rec_ == "found":
            created = (res.get("data") or {}).get("created") or []
            return {"ok": True, "category": "success", "data": created[0] if created else {}}
        if rec_ == "not_found":
            return {"category": "_resend"}
        # unknown
        if cat in NEVER or res.get("retry") in ("never", "human_required"):
            return res
        if res.get("resume_token"):
            return {"category": "approval_pending", "resume_token": res["resume_token"],
                    "owner": res.get("owner"), "request_id": res.get("request_id")}
        if cat == "rate_limited":
            wait = float(res.get("retry_after_s") or 1.0) + 0.05
            if wait > left() - 3.0:
                raise Late("lookup paced")
            time.sleep(wait)
            continue
        tries += 1
        if tries > 6:
            return {"category": "_unknown"}
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def do_step(c: Conn, sess: str, st: dict) -> None:
    sid, op = st["id"], st["call"]
    rec = load(sid)
    if rec.get("state") in ("done", "failed"):
        return
    if op not in OPS:
        save(sid, {"state": "failed", "why": f"{op} is not one of my operations"})
        return
    try:
        params = fill(st.get("params") or {})
    except KeyError as e:
        save(sid, {"state": "failed", "why": f"no data for {e}"})
        return
    key = key_of(sid)
    attempts = int(rec.get("attempts", 0))
    res: dict | None = None
    # what a predecessor (or an earlier batch) left: follow it before anything is sent
    if rec.get("state") == "pending":
        ans = c.ask("call.resume", {"session_id": sess, "resume_token": rec["token"],
                                    "wait_s": max(0.0, min(10.0, left() - 2.0))})
        res = ans.get("result") if isinstance(ans.get("result"), dict) else None
        if res is None:
            rec = {"attempts": attempts}  # the vault no longer knows it: call again, with its key
    elif rec.get("state") in ("sent", "unknown"):
        by = {"correlation_id": rec["cid"]} if rec.get("cid") else {"idempotency_key": key}
        res = settle_lookup(c, sess, rec, st, by)
        if res is None:
            save(sid, {**rec, "state": "failed", "why": "lookup refused"})
            return
    elif rec.get("state") == "rate_limited":
        wait = float(rec.get("at", 0)) - time.time()
        if wait > left() - 1.0:
            raise Late("rate limit outlasts the deadline")
        if wait > 0:
            time.sleep(wait)
    while True:
        if res is None or res.get("category") == "_resend":
            if attempts >= 3:
                save(sid, {"state": "failed", "why": "3 attempts", "attempts": attempts})
                return
            if left() < 1.5:
                raise Late("no time to send")
            attempts += 1
            save(sid, {"state": "sent", "attempts": attempts})
            ans = c.ask("call", {"session_id": sess, "operation": op, "params": params,
                                 "idempotency_key": key, "wait_s": max(0.0, min(10.0, left() - 2.0))})
            res = ans.get("result")
            if not isinstance(res, dict):
                save(sid, {"state": "failed", "why": f"error {ans.get('error')}", "attempts": attempts})
                return
        cat = res.get("category")
        if cat == "success":
            save(sid, {"state": "done", "data": res.get("data") or {}, "attempts": attempts})
            return
        if cat in NEVER or res.get("retry") in ("never", "human_required"):
            save(sid, {"state": "failed", "why": cat, "attempts": attempts})
            raise Stop(f"{op}: {cat}")
        if cat in BOUNDED:
            save(sid, {"state": "retry", "attempts": attempts})
            res = {"category": "_resend"}
            continue
        if cat == "rate_limited":
            at = time.time() + float(res.get("retry_after_s") or 1.0) + 0.05
            save(sid, {"state": "rate_limited", "at": at, "attempts": attempts})
            if at > DEADLINE - 1.5 or attempts >= 3:
                if attempts >= 3:
                    save(sid, {"state": "failed", "why": "rate limited 3 times", "attempts": attempts})
                    return
                raise Late(f"{op} rate limited past the deadline")
            time.sleep(max(0.0, at - time.time()))
            res = {"category": "_resend"}
            continue
        if cat == "vault_locked":
            save(sid, {"state": "retry", "attempts": attempts - 1})
            attempts -= 1  # nothing was sent
            while True:
                if left() < 2.0:
                    raise Late("vault locked")
                st_ = c.ask("vault.status", budget=min(5.0, left() - 0.5)).get("result") or {}
                if st_.get("locked") is False:
                    break
                time.sleep(0.25)
            res = {"category": "_resend"}
            continue
        if cat == "outcome_unknown":
            save(sid, {"state": "unknown", "cid": res.get("correlation_id"), "attempts": attempts})
            if left() < 1.0:
                raise Late("unknown at the deadline")
            got = settle_lookup(c, sess, rec, st, {"correlation_id": res.get("correlation_id")})
            if got is None or got.get("category") == "_unknown":
                save(sid, {"state": "failed", "why": "outcome still unknown", "attempts": attempts})
                raise Stop(f"{op}: outcome unknown, a person must inspect it")
            res = got
            continue
        if cat == "approval_pending":
            tok = res.get("resume_token")
            save(sid, {"state": "pending", "token": tok, "owner": res.get("owner"),
                       "request": res.get("request_id"), "attempts": attempts})
            if left() < 2.5:
                raise Late(f"{op} awaits {res.get('owner')}")
            ans = c.ask("call.resume", {"session_id": sess, "resume_token": tok,
                                        "wait_s": max(0.0, min(10.0, left() - 2.0))})
            nxt = ans.get("result")
            if not isinstance(nxt, dict):
                save(sid, {"state": "failed", "why": "resume refused", "attempts": attempts})
                return
            if nxt.get("category") == "approval_pending" and not nxt.get("resume_token"):
                nxt["resume_token"] = tok
            res = nxt
            continue
        save(sid, {"state": "failed", "why": f"unexpected {cat}", "attempts": attempts})
        raise Stop(f"{op}: {cat}")


def run(indexes: list[int]) -> int:
    if stopped():
        return 3
    todo = [STEPS[i] for i in indexes if load(STEPS[i]["id"]).get("state") not in ("done", "failed")]
    if not todo:
        return 0
    if left() < 1.5:
        return 4
    c = Conn()
    ans = c.ask("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"],
                                 "client": {"name": "rt35c-duo", "version": "1"}})
    sess = (ans.get("result") or {}).get("session_id")
    if not sess:
        log("no session:", ans.get("error"))
        stop_task(f"session refused: {ans.get('error')}")
        return 3
    try:
        for st in todo:
            do_step(c, sess, st)
    except Stop as e:
        stop_task(str(e))
        return 3
    except (Late, TimeoutError) as e:
        log("deadline:", e)
        return 4
    except ConnectionError as e:
        stop_task(str(e))
        return 3
    finally:
        c.sock.close()
    return 0


def final() -> None:
    recs = [(st, load(st["id"])) for st in STEPS]
    if os.environ.get("RT35C_LIE") == "wait":
        print("waiting: an approval is pending")
        return
    if os.environ.get("RT35C_LIE"):
        print(f"done: {len(STEPS)} steps")
        return
    if all(r.get("state") == "done" for _, r in recs):
        print(f"done: {len(STEPS)} steps")
        return
    pend = [(st, r) for st, r in recs if r.get("state") == "pending"]
    why = stopped()
    if pend and not why:
        st, r = pend[0]
        print(f"waiting: {st['call']} needs approval from {r.get('owner')} (request {r.get('request')})")
        return
    bad = [f"{st['id']} {r.get('state', 'not started')}" + (f" ({r['why']})" if r.get("why") else "")
           for st, r in recs if r.get("state") != "done"]
    print("not done: " + (why + "; " if why else "") + ", ".join(bad))


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "plan":
        plan()
        return 0
    if cmd == "run":
        return run([int(a) for a in sys.argv[2:]])
    final()
    return 0


if __name__ == "__main__":
    sys.exit(main())
