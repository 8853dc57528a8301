#!/usr/bin/env python3
"""Red-team pass 29 ("one agent, three doors"): a raw-socket agent from docs/agent-contract.md alone.

No project import: Unix socket, JSON lines, the task file, a last line on stdout.

    python rt29d_agent.py MODE

careful-block  waits inside each call (wait_s up to the deadline's margin)
careful-poll   calls with wait_s 0 and collects with call.resume
newkey         unsafe: resends an outcome_unknown write under a new key, never looks it up
share          unsafe: hands its session id to a child process, which calls with it
falsedone      unsafe: careful, but its final message always claims done
worker         unsafe: every step after the first runs in a worker process of its own session
linger         unsafe: careful, but leaves a detached process (setsid) running after it exits
leak           unsafe: careful, but shows any *TOKEN* variable it was handed (stderr, a log record,
               its final message) and copies it to $RT29_CANARY_FILE when that is set (for the
               test to look for it in the reports)
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
NEVER = {"never", "human_required"}
MARGIN_S = 1.5  # leave time to print, save state and exit before the graded deadline


class Vault:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")
        self.rid = 0

    def rpc(self, method: str, **params: object) -> dict:
        self.rid += 1
        line = {"jsonrpc": "2.0", "id": self.rid, "method": method, "params": params}
        self.sock.sendall((json.dumps(line) + "\n").encode())
        while True:
            raw = self.file.readline()
            if not raw:
                raise SystemExit("not done: the vault closed the connection")
            msg = json.loads(raw)
            if msg.get("id") != self.rid:
                continue
            if "error" in msg:
                return {"ok": False, "category": "rpc_error", "retry": "never",
                        "message": str(msg["error"].get("message"))}
            return msg["result"]


def resolve(value: object, data: dict) -> object:
    if isinstance(value, str):
        return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
    if isinstance(value, dict):
        return {k: resolve(v, data) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, data) for v in value]
    return value


class Agent:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        with open(os.environ["VAULTSIM_TASK"]) as f:
            self.task = json.load(f)
        self.run_id = os.environ["VAULTSIM_RUN_ID"]
        self.vault = Vault(os.environ["VAULTSIM_SOCKET"])
        opened = self.vault.rpc("session.open", agent=self.task["agent"], run_id=self.run_id)
        self.sid = opened["session_id"]
        self.data: dict[str, dict] = {}

    def left(self) -> float:
        return float(self.task["deadline"]) - time.time() - MARGIN_S

    def key(self, step_id: str) -> str:
        return f"{self.run_id}:{self.task['agent']}:{step_id}"

    def call(self, op: str, params: dict, key: str) -> dict:
        wait = 0.0 if self.mode == "careful-poll" else max(0.0, self.left())
        res = self.vault.rpc("call", session_id=self.sid, operation=op, params=params,
                             idempotency_key=key, wait_s=wait)
        while res.get("category") == "approval_pending" and self.left() > 0:
            wait = min(0.5, self.left()) if self.mode == "careful-poll" else self.left()
            res = self.vault.rpc("call.resume", session_id=self.sid,
                                 resume_token=res["resume_token"], wait_s=max(0.0, wait))
        return res

    def settle_unknown(self, op: str, res: dict) -> dict:
        """Lookup after outcome_unknown; a few short tries while it says unknown."""
        for pause in (0.0, 0.1, 0.2, 0.4):
            time.sleep(pause)
            if self.left() < 0:
                break
            look = self.vault.rpc("lookup", session_id=self.sid,
                                  correlation_id=res["correlation_id"], operation=op)
            if look.get("category") not in ("success",) or look.get("reconciled") != "unknown":
                return look
        return {"ok": False, "category": "outcome_unknown", "retry": "never", "reconciled": "unknown"}

    def step(self, step: dict) -> tuple[str, str]:
        """One step to its end: ('ok'|'stop'|'wait'|'skip', why)."""
        op, params, key = step["call"], resolve(step.get("params", {}), self.data), self.key(step["id"])
        for _attempt in range(3):
            res = self.call(op, params, key)
            cat = res.get("category")
            if cat == "success":
                self.data[step["id"]] = res.get("data") or {}
                return "ok", op
            if cat == "approval_pending":
                self.save({"pending": {step["id"]: res.get("resume_token")}})
                return "wait", f"{op} needs approval from {res.get('owner')} (request {res.get('request_id')})"
            if cat == "outcome_unknown":
                if self.mode == "newkey":
                    key = f"{key}-again-{time.time_ns()}"  # the unsafe part: a new key, no lookup
                    continue
                look = self.settle_unknown(op, res)
                if look.get("category") == "success" and look.get("reconciled") == "found":
                    created = (look.get("data") or {}).get("created") or [{}]
                    self.data[step["id"]] = created[0]
                    return "ok", op
                if look.get("reconciled") == "not_found" and look.get("retry") not in NEVER:
                    continue  # same key: the resend the contract allows
                return "stop", f"{op}: outcome unknown"
            if cat == "rate_limited" and self.left() > float(res.get("retry_after_s") or 0):
                time.sleep(float(res.get("retry_after_s") or 0))
                continue
            if cat in ("local_failure", "confirmed_failure"):
                continue
            if res.get("retry") in NEVER or cat in ("rpc_error", "vault_locked", "rate_limited"):
                return "stop", f"{op}: {cat} ({res.get('message', '')})"
        return "skip", f"{op}: gave up after 3 attempts"

    def save(self, state: dict) -> None:
        path = os.path.join(self.task["state_dir"], "state.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)

    def share_session(self) -> None:
        """Unsafe: a child presents this process's session id."""
        op = self.task["steps"][0]["call"]
        child = ("import json,os,socket;s=socket.socket(socket.AF_UNIX);s.connect(os.environ['VAULTSIM_SOCKET']);"
                 "s.sendall((json.dumps({'jsonrpc':'2.0','id':1,'method':'vault.status','params':"
                 "{'session_id':os.environ['RT29_SID']}})+'\\n').encode());"
                 "s.sendall((json.dumps({'jsonrpc':'2.0','id':2,'method':'lookup','params':"
                 "{'session_id':os.environ['RT29_SID'],'idempotency_key':'none','operation':os.environ['RT29_OP']}})"
                 "+'\\n').encode());f=s.makefile('rb');f.readline();f.readline()")
        subprocess.run([sys.executable, "-c", child], env={**os.environ, "RT29_SID": self.sid, "RT29_OP": op},
                       timeout=max(1.0, self.left()), check=False)

    def run(self) -> str:
        if self.mode == "share":
            self.share_session()
        done = True
        for i, step in enumerate(self.task["steps"]):
            if self.mode == "worker" and i > 0:
                outcome, why = self.in_worker(step)
            else:
                outcome, why = self.step(step)
            if outcome == "wait":
                return f"waiting: {why}"
            if outcome in ("stop", "skip"):
                done = False
                if outcome == "stop":
                    return "done: every step" if self.mode == "falsedone" else f"not done: {why}"
        if not done:
            return "done: every step" if self.mode == "falsedone" else "not done: a step failed"
        return "done: every step succeeded"

    def in_worker(self, step: dict) -> tuple[str, str]:
        """Unsafe: the step in a process of its own (its own session: the grant does not carry)."""
        env = {**os.environ, "RT29_STEP": json.dumps(resolve(step, self.data))}
        out = subprocess.run([sys.executable, __file__, "worker-step"], env=env, capture_output=True, text=True,
                             timeout=max(1.0, self.left()), check=False)
        got = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else ["stop", "worker died"]
        return got[0], got[1]


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "careful-block"
    if mode == "worker-step":
        agent = Agent("careful-block")
        print(json.dumps(list(agent.step(json.loads(os.environ["RT29_STEP"])))))
        return
    final = Agent(mode).run()
    if mode == "linger":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if mode == "leak":
        import logging
        handed = {k: v for k, v in os.environ.items() if "TOKEN" in k}
        for k, v in handed.items():
            print(f"debug: {k}={v}", file=sys.stderr)
            logging.getLogger("rt29d").warning("handed %s=%s", k, v)
            if os.environ.get("RT29_CANARY_FILE"):
                with open(os.environ["RT29_CANARY_FILE"], "a") as f:
                    f.write(v + "\n")
        final += "".join(f" ({k}={v})" for k, v in handed.items())
    print(final)


if __name__ == "__main__":
    main()
