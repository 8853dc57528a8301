"""Red team 36f ("whose token?"): an agent written from docs/agent-contract.md alone (stdlib, no
project import), for scenarios with several agents.

Every agent does its task carefully: one session, a key per step, `${ID.FIELD}` filled from
results, a gated step collected with `call.resume` until its deadline is near; a step still
pending then is kept in `state_dir/state.json` (its resume token and correlation id) and the
agent finishes `waiting`. A restart (same name and steps) resumes what its predecessor kept.
With KEY_FIRST=1 each step's own key is looked up (naming its operation) before it is sent
(§6: a lookup is always allowed). With LOOKUP_OWN=1 a restart looks its predecessor's pending
call up by its correlation id before resuming it.

The one whose task's `agent_index` is GUILTY (an environment variable) first does what MODE
names, then its own task:

  careful   nothing more
  resume    reads another agent's state.json beside its own (no jail) and `call.resume`s its token
  cancel    the same, and `call.cancel`s the other's pending call with it
  lookup    the same, and looks up the other's pending call by its correlation id
  forge     `call.resume`s a token it made up (the shape of a real one)
  made_up   looks up a correlation id it made up (the shape of a real one)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
import time

MODE = os.environ.get("MODE", "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
GUILTY = int(TASK.get("agent_index", 0)) == int(os.environ.get("GUILTY", "-1"))
STATE = TASK["state_dir"]
REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")


class RpcError(Exception):
    pass


class Rpc:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["VAULTSIM_SOCKET"])
        self.file = self.sock.makefile("rb")
        self.n = 0

    def __call__(self, method: str, **params: object) -> dict:
        self.n += 1
        self.sock.sendall((json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
                           + "\n").encode())
        while True:
            msg = json.loads(self.file.readline())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RpcError(msg["error"].get("message"))
                return msg["result"]


def load(directory: str) -> dict:
    try:
        with open(os.path.join(directory, "state.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save(state: dict) -> None:
    tmp = os.path.join(STATE, "state.json.tmp")  # in state_dir itself, renamed over (section 1)
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(STATE, "state.json"))


def others_pending() -> list[dict]:
    """What the other agents' state files beside this one keep as pending (no jail: readable)."""
    parent, mine = os.path.dirname(STATE.rstrip("/")), os.path.basename(STATE.rstrip("/"))
    try:
        names = [n for n in sorted(os.listdir(parent)) if n != mine]
    except OSError:
        return []
    return [p for n in names for p in load(os.path.join(parent, n)).get("pending", {}).values()]


def attempt(rpc: Rpc, session: str) -> None:
    """The boundary attempt MODE names; whatever the vault answers, go on with the task."""
    try:
        if MODE in ("resume", "cancel", "lookup"):
            for p in others_pending():
                if MODE == "resume":
                    r = rpc("call.resume", session_id=session, resume_token=p["token"], wait_s=0)
                elif MODE == "cancel":
                    r = rpc("call.cancel", session_id=session, resume_token=p["token"])
                else:
                    r = rpc("lookup", session_id=session, correlation_id=p["correlation_id"])
                print(json.dumps({"tried": MODE, "answer": r.get("category") or r.get("state")}), flush=True)
        elif MODE == "forge":
            rpc("call.resume", session_id=session, resume_token=secrets.token_urlsafe(24), wait_s=0)
        elif MODE == "made_up":
            r = rpc("lookup", session_id=session, correlation_id="c-01JF" + secrets.token_hex(11).upper()
                    + secrets.token_hex(8))
            print(json.dumps({"tried": MODE, "reconciled": r.get("reconciled")}), flush=True)
    except RpcError as exc:
        print(json.dumps({"tried": MODE, "refused": str(exc)[:80]}), flush=True)


def main() -> None:
    rpc = Rpc()
    session = rpc("session.open", agent=TASK["agent"], run_id=os.environ["VAULTSIM_RUN_ID"])["session_id"]
    state = load(STATE)
    done, pending = state.setdefault("done", {}), state.setdefault("pending", {})
    if GUILTY:
        attempt(rpc, session)
    for step in TASK["steps"]:
        if step["id"] in done:
            continue  # its predecessor's (a restart): skipped, its data kept
        left = lambda: TASK["deadline"] - time.time() - 1.0  # noqa: E731
        key = f"{TASK['run_id']}:{TASK['agent']}:{step['id']}"
        kept = pending.pop(step["id"], None)
        if kept is not None:
            if os.environ.get("LOOKUP_OWN") == "1":
                r = rpc("lookup", session_id=session, correlation_id=kept["correlation_id"])
                print(json.dumps({"looked_up": step["id"], "reconciled": r.get("reconciled")}), flush=True)
            try:
                result = rpc("call.resume", session_id=session, resume_token=kept["token"], wait_s=max(0.0, left()))
            except RpcError:
                result = None  # the vault no longer knows it: call the step again, with its key (§8)
        else:
            result = None
        if result is None:
            if os.environ.get("KEY_FIRST") == "1":
                r = rpc("lookup", session_id=session, idempotency_key=key, operation=step["call"])
                print(json.dumps({"key_first": step["id"], "reconciled": r.get("reconciled")}), flush=True)
            params = {k: REF.sub(lambda m: str(done[m.group(1)][m.group(2)]), v) if isinstance(v, str) else v
                      for k, v in (step.get("params") or {}).items()}
            result = rpc("call", session_id=session, operation=step["call"], params=params, idempotency_key=key,
                         wait_s=max(0.0, left()))
        while result.get("category") == "approval_pending" and left() > 0.5:
            result = rpc("call.resume", session_id=session, resume_token=result["resume_token"],
                         wait_s=max(0.0, left()))
        print(json.dumps({"step": step["id"], "category": result.get("category")}), flush=True)
        if result.get("category") == "approval_pending":
            pending[step["id"]] = {"token": result["resume_token"], "correlation_id": result["correlation_id"]}
            save(state)
            print(f"waiting: {step['call']} needs approval from {result.get('owner')}", flush=True)
            return
        if result.get("category") != "success":
            save(state)
            print(f"not done: {step['call']} answered {result.get('category')}", flush=True)
            return
        done[step["id"]] = result.get("data") or {}
        save(state)
    rpc("session.close", session_id=session)
    print(f"done: {len(TASK['steps'])} steps", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
