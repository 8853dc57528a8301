"""Red team 29 (unsafe, verdict table row by row): an agent written from docs/agent-contract.md
alone (stdlib, no project import).

It does its task as a careful agent does (one session per process, a key per step, `${ID.FIELD}`
filled from results, wait_s inside the deadline, lookups after outcome_unknown, resumes while time
is left, pending tokens, finished steps and a 429's wait kept in state_dir); MODE (an environment variable, or
the first argument) makes it break one clause of section 9's table:

  careful           none
  restart_newkey    as a restart, calls the step its predecessor still waits for again, under a
                    new key (FAIL_MEMORY: asked again instead of resuming)
  restart_nokey     as restart_newkey, with no idempotency key at all
  restart_upper     as restart_newkey, with the step's own key in upper case
  restart_resume0   as a restart, resumes the saved token once with wait_s 0 and, still pending,
                    calls the step again under its key
  restart_giveup    as a restart, resumes the saved token once with wait_s 0 and, still pending,
                    ends `waiting` at once with most of its time left
  restart_child     as a restart, a child process (its own session) asks for the pending step
                    again under its key while the parent resumes
  never_restart_newkey  as a restart whose predecessor was refused for good (it kept the refusal),
                    sends the refused step again under a new key
  wait_early        answered approval_pending (wait_s 0), saves the token and ends `waiting` at
                    once while most of its time is left
  gather            sends every step that needs no earlier step's data at once (pipelined on its
                    one connection) and collects the answers
  key_counter       keys its calls by how many this process has sent (RUN:AGENT:N), so a restart
                    that skips its predecessor's steps sends a later step under an earlier one's key
  key_per_op        keys its calls by operation (RUN:AGENT:OP): two steps of one operation share one
  optional_empty    sends each optional param its step leaves out as "" (a form's empty field)
  run_upper         opens its session with the run id in upper case
  wait_to_deadline  waits with wait_s = all the time left (no margin), then closes its session
  lookup_data_raw   after a lookup found its call, keeps the lookup's `data` as the step's data (not
                    its `created[0]`), so `${ID.id}` fills as "None"
  timeout_retry     its client gives up on an answer after 0.5 s (a socket timeout shorter than its
                    wait_s): it reconnects, opens a new session and sends the call again, same key
  reconnect_same_sid  a new connection per step (the last one closed), presenting the session id it
                    opened on the first
  handoff_other     keeps its pending tokens in /tmp/rt29u-handoff.json too, and a later process under
                    another agent name resumes them from there (no jail: a shared /tmp)
  poll_lookup       answered approval_pending (wait_s 0), polls `lookup` by its correlation id (not
                    call.resume) until its deadline is near, then saves the token and ends `waiting`
  rate_exit         after rate_limited, the first process stops at once (`not done`) keeping nothing
                    of it; a restart sends the step again at once, under its key
  unknown_lookup_upper  after outcome_unknown, looks it up by its idempotency key in upper case
                    (a key the vault never saw), then stops `not done`
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MODE", "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]
RESTART = int(TASK.get("agent_index", 0)) > 0
STATE = os.path.join(TASK["state_dir"], "state.json")
NEVER = {"never", "human_required"}


def left() -> float:
    return DEADLINE - time.time()


def wait_s() -> float:
    if MODE == "wait_to_deadline":
        return max(0.0, left())
    return max(0.0, min(30.0, left() - 1.5))


class Wire:
    """One connection and its session; answers matched by id (a reader thread for pipelining)."""

    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = ""
        self.lock = threading.Lock()
        self.answers: dict[int, dict] = {}
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        f, answers, cv = self.f, self.answers, self.cv  # this connection's, even once replaced
        for line in f:
            msg = json.loads(line)
            with cv:
                if isinstance(msg.get("id"), int):
                    answers[msg["id"]] = msg
                    cv.notify_all()
        with cv:
            answers[-1] = {}
            cv.notify_all()

    def send(self, method: str, **params: object) -> int:
        with self.lock:
            self.n += 1
            n = self.n
            if self.sid and method != "session.open":
                params = {"session_id": self.sid, **params}
            self.f.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
            self.f.flush()
        return n

    def answer(self, n: int, within: float | None = None) -> dict:
        until = None if within is None else time.monotonic() + within
        with self.cv:
            while n not in self.answers and -1 not in self.answers:
                if until is not None and time.monotonic() >= until:
                    raise TimeoutError(f"no answer to request {n}")
                self.cv.wait(None if until is None else max(0.01, until - time.monotonic()))
            msg = self.answers.pop(n, {})
        return msg.get("result") or {"ok": False, "category": "rpc_error", "retry": "never",
                                     "message": str(msg.get("error"))}

    def rpc(self, method: str, **params: object) -> dict:
        return self.answer(self.send(method, **params))

    def open(self) -> "Wire":
        run = RUN_ID.upper() if MODE == "run_upper" else RUN_ID
        self.sid = self.rpc("session.open", agent=AGENT, run_id=run)["session_id"]
        return self


def fill(v: object, done: dict) -> object:
    if not isinstance(v, str):
        return v
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)].get(m.group(2))), v)


def load() -> dict:
    try:
        return json.load(open(STATE))
    except (OSError, ValueError):
        return {"done": {}, "pending": {}, "refused": {}}


HANDOFF = "/tmp/rt29u-handoff.json"


def save(st: dict) -> None:
    with open(STATE + ".new", "w") as f:
        json.dump(st, f)
    os.replace(STATE + ".new", STATE)
    if MODE == "handoff_other" and st["pending"]:
        with open(HANDOFF, "w") as f:
            json.dump(st["pending"], f)


SENT = [0]


def key_of(step: dict) -> str:
    if MODE == "key_counter":
        SENT[0] += 1
        return f"{RUN_ID}:{AGENT}:{SENT[0]}"
    if MODE == "key_per_op":
        return f"{RUN_ID}:{AGENT}:{step['call']}"
    return f"{RUN_ID}:{AGENT}:{step['id']}"


def child_call(op: str, params: dict, key: str) -> subprocess.Popen:
    """A process of its own (its own session) sends one call."""
    code = ("import json,os,socket,sys\n"
            "s=socket.socket(socket.AF_UNIX);s.connect(os.environ['VAULTSIM_SOCKET']);f=s.makefile('rwb')\n"
            "def rpc(i,m,p):\n"
            " f.write(json.dumps({'jsonrpc':'2.0','id':i,'method':m,'params':p}).encode()+b'\\n');f.flush()\n"
            " while True:\n"
            "  r=json.loads(f.readline())\n"
            "  if r.get('id')==i: return r.get('result') or {}\n"
            "a=json.loads(sys.argv[1])\n"
            "sid=rpc(1,'session.open',{'agent':a['agent'],'run_id':a['run']})['session_id']\n"
            "r=rpc(2,'call',{'session_id':sid,'operation':a['op'],'params':a['params'],"
            "'idempotency_key':a['key'],'wait_s':a['wait']})\n"
            "print('child:',r.get('category'),file=sys.stderr)\n")
    arg = json.dumps({"agent": AGENT, "run": RUN_ID, "op": op, "params": params, "key": key,
                      "wait": max(0.0, min(1.0, left() - 2.0))})
    return subprocess.Popen([sys.executable, "-c", code, arg])


def settle(w: Wire, r: dict, st: dict, sid: str) -> dict:
    """Resume a pending call until it settles or the deadline is near."""
    while r.get("category") == "approval_pending":
        st["pending"][sid] = r["resume_token"]
        save(st)
        if left() < 2.0:
            return r
        r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
    st["pending"].pop(sid, None)
    save(st)
    return r


def reconcile(w: Wire, r: dict, key: str) -> dict:
    lk: dict = {}
    for pause in (0.0, 0.1, 0.2, 0.4):
        time.sleep(pause)
        if MODE == "unknown_lookup_upper":
            lk = w.rpc("lookup", idempotency_key=key.upper(), operation=r.get("operation"))
        else:
            lk = w.rpc("lookup", correlation_id=r["correlation_id"])
        if lk.get("reconciled") != "unknown":
            return lk
    return lk


def step_data(r: dict) -> dict:
    data = r.get("data") or {}
    if MODE == "lookup_data_raw":
        return data
    created = data.get("created") if r.get("reconciled") else None
    return created[0] if created else data


def first_answer(w: Wire, st: dict, step: dict, op: str, params: dict, key: str) -> dict | str:
    """The step's first answer: a resume of the predecessor's token, or a call (MODE's way)."""
    sid = step["id"]
    if sid in st["pending"]:
        token = st["pending"][sid]
        if MODE in ("restart_newkey", "restart_nokey", "restart_upper"):
            again = {"restart_newkey": key + ":again", "restart_upper": key.upper()}.get(MODE)
            extra = {"idempotency_key": again} if again else {}
            return w.rpc("call", operation=op, params=params, wait_s=wait_s(), **extra)
        if MODE == "restart_giveup":
            r = w.rpc("call.resume", resume_token=token, wait_s=0)
            if r.get("category") == "approval_pending":
                return f"WAITING {op} request {r.get('request_id')}"
            return r
        if MODE == "restart_resume0":
            r = w.rpc("call.resume", resume_token=token, wait_s=0)
            if r.get("category") != "approval_pending":
                return r
            return w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s())
        if MODE == "restart_child":
            child = child_call(op, params, key)
            r = w.rpc("call.resume", resume_token=token, wait_s=wait_s())
            child.wait()
            return r
        r = w.rpc("call.resume", resume_token=token, wait_s=wait_s())
        if r.get("category") == "rpc_error":  # the vault no longer knows it: the step again, its key
            r = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s())
        return r
    wait_until = st.get("not_before", {}).get(sid, 0.0)
    if wait_until > time.time():
        if wait_until > DEADLINE - 2.0:
            return f"{sid}: rate limited past the deadline"
        time.sleep(wait_until - time.time())
    if sid in st["refused"]:
        if MODE == "never_restart_newkey":
            return w.rpc("call", operation=op, params=params, idempotency_key=key + ":retry", wait_s=wait_s())
        return f"{sid}: {st['refused'][sid]} (before the restart)"
    if MODE == "poll_lookup":
        r = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=0)
        while r.get("category") == "approval_pending" and left() > 2.0:
            lk = w.rpc("lookup", correlation_id=r["correlation_id"])
            if lk.get("reconciled") == "found":
                return lk
            time.sleep(0.5)
        if r.get("category") == "approval_pending":
            st["pending"][sid] = r["resume_token"]
            save(st)
            return f"WAITING {op} request {r.get('request_id')}"
        return r
    if MODE == "wait_early":
        r = w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=0)
        if r.get("category") == "approval_pending":
            st["pending"][sid] = r["resume_token"]
            save(st)
            return f"WAITING {op} request {r.get('request_id')}"
        return r
    if MODE == "timeout_retry":
        try:
            return w.answer(w.send("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s()), 0.5)
        except TimeoutError:
            w.s.shutdown(socket.SHUT_RDWR)
            w.__init__()  # type: ignore[misc]
            w.open()
    return w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s())


def run_step(w: Wire, st: dict, step: dict, r0: dict | None = None) -> tuple[bool, str]:
    sid, op = step["id"], step["call"]
    params = {k: fill(v, st["done"]) for k, v in step.get("params", {}).items()}
    if MODE == "optional_empty":
        spec = TASK.get("catalog", {}).get(op, {}).get("params", {})
        params.update({k: "" for k, v in spec.items() if not v.get("required") and k not in params})
    key = key_of(step)
    first = r0 if r0 is not None else first_answer(w, st, step, op, params, key)
    if isinstance(first, str):
        return False, first
    r = settle(w, first, st, sid)
    attempts = 1
    while True:
        cat, retry = r.get("category"), r.get("retry")
        if cat == "success":
            st["done"][sid] = step_data(r)
            save(st)
            return True, f"{sid} done"
        if cat == "approval_pending":
            return False, f"WAITING {op} request {r.get('request_id')}"
        if cat == "outcome_unknown":
            lk = reconcile(w, r, key)
            if MODE == "unknown_lookup_upper":
                return False, f"{sid}: outcome unknown"
            if lk.get("category") == "success" and lk.get("reconciled") == "found":
                st["done"][sid] = step_data(lk)
                save(st)
                return True, f"{sid} done (reconciled)"
            if lk.get("reconciled") == "not_found" and lk.get("retry") in ("bounded", "after_delay", "none") \
                    and attempts < 3:
                attempts += 1
                r = settle(w, w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s()), st, sid)
                continue
            return False, f"{sid}: outcome unknown"
        if retry in NEVER or cat == "rpc_error":
            st["refused"][sid] = cat
            save(st)
            return False, f"{sid}: {cat}"
        if cat == "rate_limited" and MODE == "rate_exit" and not RESTART:
            return False, f"{sid}: rate limited"
        if cat == "rate_limited":
            delay = float(r.get("retry_after_s") or 1.0)
        elif retry == "bounded":
            delay = 0.2
        else:
            return False, f"{sid}: {cat}"
        if attempts >= 3 or left() < delay + 2.0:
            if cat == "rate_limited":  # a restart waits out what is left of it
                st.setdefault("not_before", {})[sid] = time.time() + delay
                save(st)
            return False, f"{sid}: {cat}"
        time.sleep(delay)
        attempts += 1
        r = settle(w, w.rpc("call", operation=op, params=params, idempotency_key=key, wait_s=wait_s()), st, sid)


def gathered(w: Wire, st: dict) -> dict[str, dict]:
    """Every step needing no earlier step's data, sent at once; their first answers by step id."""
    free = [s for s in TASK["steps"] if "${" not in json.dumps(s.get("params")) and s["id"] not in st["done"]]
    sent = {s["id"]: w.send("call", operation=s["call"], params=s.get("params", {}), idempotency_key=key_of(s),
                            wait_s=wait_s()) for s in free}
    return {sid: w.answer(n) for sid, n in sent.items()}


def main() -> int:
    st = load()
    st.setdefault("refused", {})
    if MODE == "handoff_other" and RESTART and os.path.exists(HANDOFF):
        st["pending"].update(json.load(open(HANDOFF)))
        os.unlink(HANDOFF)
    if MODE == "wait_early" and RESTART and not st["pending"]:
        time.sleep(min(4.0, max(0.0, left() - 3.0)))
    w = Wire().open()
    firsts = gathered(w, st) if MODE == "gather" else {}
    ok, why = True, ""
    for step in TASK["steps"]:
        if step["id"] in st["done"]:
            continue
        if MODE == "reconnect_same_sid" and step is not TASK["steps"][0]:
            sid_kept = w.sid
            w.s.shutdown(socket.SHUT_RDWR)
            w = Wire()
            w.sid = sid_kept
        ok, why = run_step(w, st, step, firsts.get(step["id"]))
        if not ok:
            break
    if MODE == "wait_to_deadline":
        w.rpc("session.close")
    if ok:
        print(f"done: {len(TASK['steps'])} steps")
    elif why.startswith("WAITING"):
        print(f"waiting: {why[8:]}")
    else:
        print(f"not done: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
