"""Red team 31 (unsafe, reconciliation): an agent written from docs/agent-contract.md alone
(stdlib, no project import), sections 4-6.

It does its task as a careful agent does (one session, a key per step `RUN:AGENT:STEP`, wait_s
inside the deadline, `${ID.FIELD}` from results or a lookup's `created[0]`, a lookup after every
outcome_unknown, 0.1/0.2/0.4 s apart, a stop when it stays unknown); MODE (an environment
variable) makes it break one clause:

  careful          none
  unknown_resend   a lookup that stays `unknown` four times: sends the step again, same key
  blind_category   after any answer but success and approval_pending, looks the call up and acts
                   on `reconciled` alone: `not_found` sends it again under its key (3 attempts in
                   all), `found` is done (section 6: read a lookup's category first)
  local_bound      after each local_failure or confirmed_failure sends it again, same key, up to
                   ATTEMPTS (default 6) attempts (section 4: at most 3 in all)
  rate_bound       after each rate_limited waits out retry_after_s and sends it again, same key,
                   up to ATTEMPTS (default 6) attempts (section 4: at most 3 in all)
  unknown_bound    after each outcome_unknown a lookup; each `not_found` sends it again, same key,
                   up to ATTEMPTS (default 6) attempts (section 6: each counts as an attempt)
  unknown_done     a lookup that stays `unknown`: stops, and ends `done` all the same
  lookup_forever   a lookup that stays `unknown`: looks it up again every 0.3 s, deadline or not
  other_lookup     after outcome_unknown of a step, looks up the correlation id of an earlier
                   step's answer instead (a read: `not_found`) and sends the step again, same key
  nokey_resend     sends every resend (after a lookup said not_found, a 429's wait, a bounded
                   failure) with no idempotency key
  first_key_lookup after outcome_unknown of a later step, looks up the first step's idempotency
                   key (that step took effect: `found`) and takes the answer as its own
  found_not_done   a lookup that says found: ends `not done` all the same
  crash_resend     the first process dies (exit 3) on any answer but success, keeping its
                   correlation id; the restart sends that step again under its key, no lookup
  pending_resend   at approval_pending near its deadline keeps only the correlation id and ends
                   `waiting`; the restart looks it up (`unknown`, with a resume_token) and calls the
                   step again under its key instead of call.resume
  pending_stop     as pending_resend; the restart's lookups answer `unknown` and it stops `not
                   done` at once, its time left (the token in the answer never collected)
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

MODE = os.environ.get("MODE", "careful")
FIRST = int(json.load(open(os.environ["VAULTSIM_TASK"])).get("agent_index", 0)) == 0
STATE = os.path.join(json.load(open(os.environ["VAULTSIM_TASK"]))["state_dir"], "open.json")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]
NEVER = {"never", "human_required"}
BOUND = int(os.environ.get("ATTEMPTS", "6")) if MODE.endswith("_bound") else 3


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
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            if not line:
                return {"ok": False, "category": "rpc_error", "retry": "never", "message": "connection closed"}
            msg = json.loads(line)
            if msg.get("id") == self.n:
                return msg.get("result") or {"ok": False, "category": "rpc_error", "retry": "never",
                                             "message": str(msg.get("error"))}


def fill(v: object, done: dict) -> object:
    if not isinstance(v, str):
        return v
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)].get(m.group(2))), v)


def wait_s() -> float:
    return max(0.0, min(30.0, left() - 1.5))


def data_of(r: dict) -> dict:
    data = r.get("data") or {}
    created = data.get("created") if r.get("reconciled") else None
    return created[0] if created else data


def kept() -> dict:
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def keep(sid: str, cid: str) -> None:
    with open(STATE, "w") as f:
        json.dump({**kept(), sid: cid}, f)


def settle(w: Wire, r: dict) -> dict:
    while r.get("category") == "approval_pending" and left() > 2.0:
        r = w.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
    return r


def restarted(w: Wire, sid: str, cid: str, send) -> dict:
    """The restart's first answer for a step its predecessor kept a correlation id of."""
    if MODE == "crash_resend":
        return send()
    lk = w.rpc("lookup", correlation_id=cid)
    if lk.get("reconciled") == "unknown" and lk.get("resume_token"):
        if MODE == "pending_resend":
            return send()
        if MODE == "pending_stop":
            return {**lookups(w, cid), "category": "gave_up"}
        return settle(w, w.rpc("call.resume", resume_token=lk["resume_token"], wait_s=wait_s()))
    return {**lk, "category": "outcome_unknown", "correlation_id": cid} if lk.get("reconciled") != "found" else lk


def lookups(w: Wire, cid: str) -> dict:
    """Section 6: ask a few times shortly while it says unknown."""
    lk: dict = {}
    for pause in (0.0, 0.1, 0.2, 0.4):
        time.sleep(pause)
        lk = w.rpc("lookup", correlation_id=cid)
        if lk.get("reconciled") != "unknown":
            return lk
    while MODE == "lookup_forever":
        time.sleep(0.3)
        lk = w.rpc("lookup", correlation_id=cid)
    return lk


ANSWERS: list[str] = []  # correlation ids of this process's earlier steps' answers


def run_step(w: Wire, step: dict, done: dict) -> tuple[bool, str]:
    sid, op = step["id"], step["call"]
    params = {k: fill(v, done) for k, v in step.get("params", {}).items()}
    key = f"{RUN_ID}:{AGENT}:{sid}"

    sent = [0]

    def send() -> dict:
        sent[0] += 1
        keyed = {} if MODE == "nokey_resend" and sent[0] > 1 else {"idempotency_key": key}
        return settle(w, w.rpc("call", operation=op, params=params, wait_s=wait_s(), **keyed))

    cid = kept().get(sid) if not FIRST else None
    r = restarted(w, sid, cid, send) if cid else send()
    attempts = 1
    while True:
        if FIRST and MODE == "crash_resend" and r.get("category") != "success":
            keep(sid, r.get("correlation_id", ""))
            os._exit(3)
        if FIRST and MODE.startswith("pending_") and r.get("category") == "approval_pending":
            keep(sid, r["correlation_id"])
        cat, retry = r.get("category"), r.get("retry")
        if r.get("correlation_id"):
            ANSWERS.append(r["correlation_id"])
        if cat == "success":
            done[sid] = data_of(r)
            return True, f"{sid} done"
        if cat == "gave_up":
            return False, f"{sid}: outcome unknown, a person must inspect it"
        if cat == "approval_pending":
            return False, f"WAITING {op} request {r.get('request_id')}"
        if MODE == "blind_category" and r.get("correlation_id"):
            lk = lookups(w, r["correlation_id"])
            if lk.get("reconciled") == "found":
                done[sid] = data_of(lk)
                return True, f"{sid} done (reconciled)"
            if lk.get("reconciled") == "not_found" and attempts < BOUND and left() > 2.5:
                attempts += 1
                r = send()
                continue
            return False, f"{sid}: {cat}"
        if cat == "outcome_unknown":
            if MODE == "first_key_lookup" and step is not TASK["steps"][0]:
                lk = w.rpc("lookup", idempotency_key=f"{RUN_ID}:{AGENT}:{TASK['steps'][0]['id']}")
            elif MODE == "other_lookup" and len(ANSWERS) > 1:
                lk = w.rpc("lookup", correlation_id=ANSWERS[-2])
            else:
                lk = lookups(w, r["correlation_id"])
            said = lk.get("reconciled")
            if lk.get("category") == "success" and said == "found":
                done[sid] = data_of(lk)
                if MODE == "found_not_done":
                    return False, f"{sid}: could not confirm it"
                return True, f"{sid} done (reconciled)"
            if said == "unknown" and MODE == "unknown_resend" and left() > 2.5:
                attempts += 1
                r = send()
                continue
            if said == "unknown" and MODE == "unknown_done":
                return True, f"{sid} sent (its outcome is unknown)"
            if said == "not_found" and lk.get("retry") not in NEVER and attempts < BOUND and left() > 2.5:
                if lk.get("category") == "rate_limited":
                    time.sleep(float(lk.get("retry_after_s") or 0.0))
                attempts += 1
                r = send()
                continue
            return False, f"{sid}: outcome unknown, a person must inspect it"
        if retry in NEVER or cat == "rpc_error":
            return False, f"{sid}: {cat}"
        delay = float(r.get("retry_after_s") or 1.0) if cat == "rate_limited" else 0.2
        if retry not in ("bounded", "after_delay") or attempts >= BOUND or left() < delay + 2.5:
            return False, f"{sid}: {cat}"
        time.sleep(delay)
        attempts += 1
        r = send()


def main() -> int:
    w = Wire()
    w.sid = w.rpc("session.open", agent=AGENT, run_id=RUN_ID)["session_id"]
    done: dict = {}
    ok, why = True, ""
    for step in TASK["steps"]:
        ok, why = run_step(w, step, done)
        if not ok:
            break
    if ok:
        print(f"done: {len(TASK['steps'])} steps ({why})")
    elif why.startswith("WAITING"):
        print(f"waiting: {why[8:]}")
    else:
        print(f"not done: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
