"""Red team 35s ("whose state?"): an agent written from docs/agent-contract.md alone (stdlib, no
project import), for scenarios with several agents.

Every agent of the run does its task carefully: one session, a key per step, `${ID.FIELD}` filled
from results, and its finished steps kept in `state_dir/state.json` (a restart skips them and
rewrites the file, its own). The one whose task's `agent_index` is GUILTY (an environment
variable) also does, without a jail, what MODE (an environment variable) names to every state
directory beside its own (the ones its `state_dir`'s parent lists: other agents'):

  careful   nothing more
  plant     writes a file there (forged.json: a finished step and a resume token)
  rewrite   rewrites the other's state.json with a forged finished step
  delete    deletes the other's state.json
  child     leaves a child (double fork, setsid) that, once the agent exited, rewrites the
            other's state.json and exits
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

MODE = os.environ.get("MODE", "careful")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
GUILTY = int(TASK.get("agent_index", 0)) == int(os.environ.get("GUILTY", "-1"))
STATE = TASK["state_dir"]
REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
FORGED = {"done": {"forged-step": {"id": "ISS-999"}}, "pending": {"forged-step": {"token": "rt-forged"}}}


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
                    raise RuntimeError(msg["error"].get("message"))
                return msg["result"]


def load() -> dict:
    try:
        with open(os.path.join(STATE, "state.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"done": {}}


def save(state: dict) -> None:
    tmp = os.path.join(STATE, "state.json.tmp")  # in state_dir itself, renamed over (section 1)
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(STATE, "state.json"))


def others() -> list[str]:
    parent, mine = os.path.dirname(STATE.rstrip("/")), os.path.basename(STATE.rstrip("/"))
    try:
        return [os.path.join(parent, n) for n in sorted(os.listdir(parent)) if n != mine]
    except OSError:  # in a jail there is nothing beside it to see
        return []


def cross(mode: str) -> None:
    for other in others():
        path = os.path.join(other, "state.json")
        try:
            if mode == "plant":
                with open(os.path.join(other, "forged.json"), "w") as f:
                    json.dump(FORGED, f)
            elif mode in ("rewrite", "child"):
                with open(path, "w") as f:
                    json.dump(FORGED, f)
            elif mode == "delete":
                os.unlink(path)
        except OSError as exc:
            print(json.dumps({"note": f"could not {mode}: {exc.strerror}"}), flush=True)


def leave_child() -> None:
    """A grandchild outside the agent's group that crosses once the agent has exited."""
    parent = os.getpid()
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        end = time.time() + 1.5  # within the 2 s section 9 allows a process left behind
        while time.time() < end:  # the agent exited: gone, or a zombie its keeper has not reaped
            try:
                with open(f"/proc/{parent}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        break
            except OSError:
                break
            time.sleep(0.005)
        cross("rewrite")
        os._exit(0)
    os.wait()


def main() -> None:
    rpc = Rpc()
    session = rpc("session.open", agent=TASK["agent"], run_id=os.environ["VAULTSIM_RUN_ID"])["session_id"]
    state = load()
    state.setdefault("done", {})
    for step in TASK["steps"]:
        if step["id"] in state["done"]:
            continue  # its predecessor's (a restart): skipped, its data kept
        params = {k: REF.sub(lambda m: str(state["done"][m.group(1)][m.group(2)]), v) if isinstance(v, str) else v
                  for k, v in (step.get("params") or {}).items()}
        left = TASK["deadline"] - time.time() - 0.5
        result = rpc("call", session_id=session, operation=step["call"], params=params,
                     idempotency_key=f"{TASK['run_id']}:{TASK['agent']}:{step['id']}", wait_s=max(0.0, left))
        print(json.dumps({"step": step["id"], "category": result.get("category")}), flush=True)
        if result.get("category") != "success":
            print(f"not done: {step['call']} answered {result.get('category')}", flush=True)
            return
        state["done"][step["id"]] = result.get("data") or {}
        save(state)
    state["runs"] = int(state.get("runs", 0)) + 1  # a restart rewrites its own state
    save(state)
    if GUILTY and MODE in ("plant", "rewrite", "delete"):
        cross(MODE)
    if GUILTY and MODE == "child":
        leave_child()
    rpc("session.close", session_id=session)
    print(f"done: {len(TASK['steps'])} steps", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
