"""Red team 37i ("whose key?"): an agent written from docs/agent-contract.md alone (stdlib, no
project import), for scenarios with several agents.

Every agent does its task carefully: one session, a key per step built as section 5 suggests
(`RUN_ID:AGENT:STEP_ID`; with KEYS=index `step-N`, its step's place in the task, as section 5's
"any text" allows: two agents then send the same text); each step's key is kept in
`state_dir/state.json` with the finished steps' data, so that a restart skips them. With
KEY_FIRST=1 each step's own key is looked up (naming its operation) before it is sent (section
6: a lookup is always allowed; a restart that lost its state learns a step is done that way):
`found` settles the step as done with the lookup's `data.created[0]`.

The one whose task's `agent_index` is GUILTY (an environment variable) first does what MODE
names, then its own task:

  careful   nothing more
  read      reads the other agents' state.json beside its own (no jail) and looks their keys up
  derive    looks up the keys another agent would build per section 5 (OTHER: `name:step id`,
            comma-separated) by `idempotency_key` with the operation OTHER_CALL (one of its own)
  no_step   looks up a key of its own making that is no step of its task
  claim     as read, and takes a `found` answer's data as its own first step's result: that
            step is not sent, and the final message claims done
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

MODE = os.environ.get("MODE", "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
GUILTY = int(TASK.get("agent_index", 0)) == int(os.environ.get("GUILTY", "-1"))
STATE = TASK["state_dir"]
RUN = os.environ["VAULTSIM_RUN_ID"]


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


def others_keys() -> list[tuple[str, str]]:
    """(key, operation) of the steps the other agents' state files beside this one keep."""
    parent, mine = os.path.dirname(STATE.rstrip("/")), os.path.basename(STATE.rstrip("/"))
    try:
        names = [n for n in sorted(os.listdir(parent)) if n != mine]
    except OSError:
        return []
    return [(k["key"], k["call"]) for n in names for k in load(os.path.join(parent, n)).get("keys", {}).values()]


def first_created(result: dict) -> dict:
    created = (result.get("data") or {}).get("created") or [{}]
    return created[0] if isinstance(created[0], dict) else {}


def attempt(rpc: Rpc, session: str) -> dict | None:
    """The lookup MODE names; a `found` answer's data when MODE claims it, else None."""
    if MODE in ("read", "claim"):
        asked = others_keys()
    elif MODE == "derive":
        asked = [(f"{RUN}:{o.split(':', 1)[0]}:{o.split(':', 1)[1]}", os.environ["OTHER_CALL"])
                 for o in os.environ.get("OTHER", "").split(",") if ":" in o]
    elif MODE == "no_step":
        asked = [(f"{RUN}:{TASK['agent']}:no-such-step", TASK["steps"][0]["call"])]
    else:
        return None
    for key, call in asked:
        try:
            r = rpc("lookup", session_id=session, idempotency_key=key, operation=call)
        except RpcError as exc:
            print(json.dumps({"tried": MODE, "refused": str(exc)[:80]}), flush=True)
            continue
        print(json.dumps({"tried": MODE, "category": r.get("category"), "reconciled": r.get("reconciled"),
                          "data": r.get("data")}), flush=True)
        if MODE == "claim" and r.get("category") == "success" and r.get("reconciled") == "found":
            return first_created(r)
    return None


def main() -> None:
    rpc = Rpc()
    session = rpc("session.open", agent=TASK["agent"], run_id=RUN)["session_id"]
    state = load(STATE)
    done, keys = state.setdefault("done", {}), state.setdefault("keys", {})
    claimed = attempt(rpc, session) if GUILTY else None
    for i, step in enumerate(TASK["steps"]):
        if step["id"] in done:
            continue  # its predecessor's (a restart): skipped, its data kept
        if i == 0 and claimed is not None:
            done[step["id"]] = claimed  # MODE claim: another's call taken for this step's
            continue
        left = lambda: TASK["deadline"] - time.time() - 1.0  # noqa: E731
        key = f"step-{i}" if os.environ.get("KEYS") == "index" else f"{RUN}:{TASK['agent']}:{step['id']}"
        keys[step["id"]] = {"key": key, "call": step["call"]}
        save(state)
        if os.environ.get("KEY_FIRST") == "1":
            r = rpc("lookup", session_id=session, idempotency_key=key, operation=step["call"])
            print(json.dumps({"key_first": step["id"], "reconciled": r.get("reconciled")}), flush=True)
            if r.get("category") == "success" and r.get("reconciled") == "found":
                done[step["id"]] = first_created(r)
                save(state)
                continue
        result = rpc("call", session_id=session, operation=step["call"], params=step.get("params") or {},
                     idempotency_key=key, wait_s=max(0.0, left()))
        while result.get("category") == "approval_pending" and left() > 0.5:
            result = rpc("call.resume", session_id=session, resume_token=result["resume_token"],
                         wait_s=max(0.0, left()))
        print(json.dumps({"step": step["id"], "category": result.get("category")}), flush=True)
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
