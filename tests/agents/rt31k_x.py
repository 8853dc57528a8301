"""Red team 31k (keys of agents sharing one vault): an agent written from docs/agent-contract.md
alone (stdlib, no project import).

It does its task carefully (one session, a key per step, the same key on every resend, `${ID.FIELD}`
filled from results, lookups after outcome_unknown, waits after rate_limited) with keys as KEYS (an
environment variable) says: `plain` (the default) is `CALL-N`, the N-th step of that operation in
its task (`create_issue-1`: the same text another agent with such a step picks), `contract` is the
contract's example `RUN_ID:AGENT:STEP_ID`. The agent whose task's `agent_index` is GUILTY also does
what MODE names:

  careful  nothing more
  steal    sends its first step under VICTIM_KEY (another agent's key, e.g. `create_issue-1` or
           `RUN_ID:alpha:STEP`: §5's example is easy to guess), then looks that key up and prints
           what the lookup answered (`(learned: {...})` after its final word), before going on with its task
  probe    before its task, looks up PROBES (default 2000) correlation ids it made up, naming the
           operation of its first step, and prints how they were answered (`probed: {...}`)
  keyflood as probe, with PROBES idempotency keys it made up (§6: with `operation`, the remote is
           asked about your own key), never waiting for a `retry_after_s`
  restart  a restarted agent's reconciling (§6): before each step, looks its key up with the step's
           operation (again 0.1, 0.2, 0.4 s apart while `unknown`, waiting a `retry_after_s`);
           `found` takes its data and does not send it, `not_found` sends it, else it stops
  restart_all  as restart, but it looks every step up at once (all its lookups written on its
           connection before it reads an answer); §6 paces them past 16 (`rate_limited`,
           `unknown`, `retry_after_s`): those it asks again together after the longest wait, then
           does its steps as restart does; it prints `paced: N` (lookups answered so) before its
           last line

Its last line is `done: STEP=ID ...` (the ids its steps created) or `not done: ...`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time

MODE = os.environ.get("MODE", "careful")
KEYS = os.environ.get("KEYS", "plain")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
GUILTY = int(TASK.get("agent_index", 0)) == int(os.environ.get("GUILTY", "-1"))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]


def left() -> float:
    return DEADLINE - time.time()


class Wire:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = ""

    def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        if self.sid:
            params = {"session_id": self.sid, **params}
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode()
                     + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            if not line:
                return {"ok": False, "category": "rpc_error", "retry": "never", "message": "closed"}
            msg = json.loads(line)
            if msg.get("id") == self.n:  # lines without our id are not ours
                return msg.get("result") or {"ok": False, "category": "rpc_error", "retry": "never",
                                             "message": str(msg.get("error"))}

    def many(self, calls: list) -> list:
        """Send every (method, params) of `calls` before reading an answer; their results, in order."""
        ids = []
        for method, params in calls:
            self.n += 1
            ids.append(self.n)
            params = {"session_id": self.sid, **params} if self.sid else params
            self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode()
                         + b"\n")
        self.f.flush()
        got: dict = {}
        while len(got) < len(ids):
            line = self.f.readline()
            if not line:
                break
            msg = json.loads(line)
            if msg.get("id") in ids:
                got[msg["id"]] = msg.get("result") or {"ok": False, "category": "rpc_error", "retry": "never",
                                                        "message": str(msg.get("error"))}
        closed = {"ok": False, "category": "rpc_error", "retry": "never", "message": "closed"}
        return [got.get(i, closed) for i in ids]


def fill(v: object, done: dict) -> object:
    """${ID.FIELD} from the data of an earlier step; None when that step has no such data."""
    if isinstance(v, str):
        missing = []

        def sub(m: re.Match) -> str:
            got = (done.get(m.group(1)) or {}).get(m.group(2))
            if got is None:
                missing.append(m.group(0))
                return ""
            return str(got)
        out = re.sub(r"\$\{([^.}]+)\.([^}]+)\}", sub, v)
        return None if missing else out
    if isinstance(v, dict):
        items = {k: fill(x, done) for k, x in v.items()}
        return None if any(x is None for x in items.values()) else items
    return v


def keys_of(steps: list) -> dict:
    seen: dict = {}
    out = {}
    for st in steps:
        seen[st["call"]] = seen.get(st["call"], 0) + 1
        out[st["id"]] = (f"{st['call']}-{seen[st['call']]}" if KEYS == "plain"
                         else f"{RUN_ID}:{AGENT}:{st['id']}")
    return out


def settle_unknown(w: Wire, r: dict) -> tuple[str, dict | None]:
    """Look an outcome_unknown up by its correlation id: (found|not_found|unknown, its data)."""
    for pause in (0.0, 0.1, 0.2, 0.4, 0.8):
        if left() < 2:
            break
        time.sleep(pause)
        got = w.rpc("lookup", correlation_id=r["correlation_id"], operation=r["operation"])
        if got.get("category") != "success":
            return "stop", None
        if got.get("reconciled") in ("found", "not_found"):
            created = (got.get("data") or {}).get("created") or [{}]
            return got["reconciled"], created[0]
    return "unknown", None


def do_step(w: Wire, st: dict, params: dict, key: str) -> tuple[bool, dict | None]:
    """(stop the task?, the step's data if it succeeded)"""
    for _ in range(3):
        if left() < 1.5:
            return False, None
        r = w.rpc("call", operation=st["call"], params=params, idempotency_key=key,
                  wait_s=max(0.0, min(30.0, left() - 1.0)))
        cat = r.get("category")
        if cat == "success":
            return False, r.get("data") or {}
        if cat in ("local_failure", "confirmed_failure"):
            continue
        if cat == "rate_limited":
            wait = float(r.get("retry_after_s") or 0)
            if wait > left() - 1.5:
                return False, None
            time.sleep(wait)
            continue
        if cat == "outcome_unknown":
            state, data = settle_unknown(w, r)
            if state == "found":
                return False, data or {}
            if state == "not_found":
                continue
            return True, None
        return True, None  # never / human_required / pending past the deadline: stop
    return False, None


def probe(w: Wire, operation: str) -> None:
    count = int(os.environ.get("PROBES", "2000"))
    seen: dict = {}
    for _ in range(count):
        if left() < 3:
            break
        made_up = f"c-{int(time.time() * 1000):011x}{secrets.token_hex(8)}"
        got = w.rpc("lookup", correlation_id=made_up, operation=operation)
        label = f"{got.get('category')}/{got.get('reconciled')}" + ("+data" if got.get("data") else "")
        seen[label] = seen.get(label, 0) + 1
    print("probed: " + json.dumps(seen, sort_keys=True), flush=True)


def key_flood(w: Wire, operation: str) -> None:
    seen: dict = {}
    for _ in range(int(os.environ.get("PROBES", "2000"))):
        if left() < 3:
            break
        got = w.rpc("lookup", idempotency_key="k-" + secrets.token_hex(8), operation=operation)
        label = f"{got.get('category')}/{got.get('reconciled')}" + ("+data" if got.get("data") else "")
        seen[label] = seen.get(label, 0) + 1
    print("probed: " + json.dumps(seen, sort_keys=True), flush=True)


def reconcile(w: Wire, st: dict, key: str) -> tuple[str, dict | None]:
    """A restarted agent's lookup of a step by its key: (found|not_found|stop, its data)."""
    pauses = [0.1, 0.2, 0.4]
    for _ in range(6):
        if left() < 2:
            break
        got = w.rpc("lookup", idempotency_key=key, operation=st["call"])
        if got.get("category") == "rate_limited":
            wait = float(got.get("retry_after_s") or 0)
        elif got.get("category") != "success":
            return "stop", None
        elif got.get("reconciled") in ("found", "not_found"):
            return got["reconciled"], ((got.get("data") or {}).get("created") or [{}])[0]
        elif pauses:
            wait = pauses.pop(0)
        else:
            break
        if wait > left() - 2:
            break
        time.sleep(wait)
    return "stop", None


def reconcile_all(w: Wire, steps: list, keys: dict) -> tuple[dict, int]:
    """A restarted agent's lookups of every step at once: {step id: (found|not_found|stop, its
    data)} (a step it could not tell is `stop`), and how many answers were `rate_limited`."""
    todo = {st["id"]: st for st in steps}
    pauses = {sid: [0.1, 0.2, 0.4] for sid in todo}
    states: dict = {}
    paced = 0
    while todo and left() > 2:
        asked = list(todo.items())
        answers = w.many([("lookup", {"idempotency_key": keys[sid], "operation": st["call"]}) for sid, st in asked])
        wait = 0.0
        for (sid, st), got in zip(asked, answers):
            if got.get("category") == "rate_limited":
                paced += 1
                wait = max(wait, float(got.get("retry_after_s") or 0))
            elif got.get("category") != "success":
                states[sid] = ("stop", None)
            elif got.get("reconciled") in ("found", "not_found"):
                states[sid] = (got["reconciled"], ((got.get("data") or {}).get("created") or [{}])[0])
            elif pauses[sid]:
                wait = max(wait, pauses[sid].pop(0))
            else:
                states[sid] = ("stop", None)
            if sid in states:
                del todo[sid]
        if todo and wait > left() - 2:
            break
        time.sleep(wait if todo else 0)
    return {**{sid: ("stop", None) for sid in todo}, **states}, paced


def main() -> None:
    w = Wire()
    w.sid = w.rpc("session.open", agent=AGENT, run_id=RUN_ID)["session_id"]
    steps = TASK["steps"]
    keys = keys_of(steps)
    done: dict = {}
    learned = ""  # what a lookup of another agent's key told it, in its final message (the report keeps it)
    if GUILTY and MODE == "probe" and steps:
        probe(w, steps[0]["call"])
    if GUILTY and MODE == "keyflood" and steps:
        key_flood(w, steps[0]["call"])
    if GUILTY and MODE == "steal" and steps:
        st = steps[0]
        params = fill(st["params"], done)
        victim = os.environ["VICTIM_KEY"].replace("RUN_ID", RUN_ID)
        keys[st["id"]] = victim
        stop, data = do_step(w, st, params, victim)
        got = w.rpc("lookup", idempotency_key=victim, operation=st["call"])
        learned = " (learned: " + json.dumps({"reconciled": got.get("reconciled"), "data": got.get("data")},
                                             sort_keys=True) + ")"
        if data is not None:
            done[st["id"]] = data
        if stop:
            print("not done: stopped at " + st["id"] + learned)
            return
    looked: dict = {}
    if GUILTY and MODE == "restart_all":
        looked, paced = reconcile_all(w, steps, keys)
        print(f"paced: {paced}", flush=True)
    for st in steps[1:] if GUILTY and MODE == "steal" else steps:  # its first step had its 3 attempts
        if st["id"] in done:
            continue
        params = fill(st["params"], done)
        if params is None:
            continue  # a value it would have to guess: never sent
        if GUILTY and MODE in ("restart", "restart_all"):
            state, data = looked.get(st["id"]) or reconcile(w, st, keys[st["id"]])
            if state == "found":
                done[st["id"]] = data or {}
                continue
            if state == "stop":
                break
        stop, data = do_step(w, st, params, keys[st["id"]])
        if data is not None:
            done[st["id"]] = data
        if stop:
            break
    missing = [st["id"] for st in steps if st["id"] not in done]
    made = " ".join(f"{k}={v['id']}" for k, v in done.items() if isinstance(v, dict) and "id" in v)
    print(("done: " + made if not missing else "not done: " + ", ".join(missing) + " did not succeed") + learned)


if __name__ == "__main__":
    main()
