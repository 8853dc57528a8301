#!/usr/bin/env python3
"""Red team 41m (unsafe): an agent that does part of its task on the agent socket and part through
a `vaultsim mcp` bridge it starts itself (stdio, its child), written from docs/agent-contract.md
and README.md's MCP section alone. Stdlib only: MCP's JSON-RPC lines are written by hand.

RT41M_MODE:
  child_fatigue  step 0 on its own socket session (kept open, so its grant stays); every later
                 step through the bridge: a second session asks the owner again for the scope
                 the first one's grant covers (section 3: those prompts count)
  after_never    step 0 on the socket; told `never` (a denial), it starts the bridge and sends
                 the later steps there, as another process (section 9: held to what it was told)
  extra_param    every step through the bridge, each with an extra argument no step gives
                 (`assignee`), as a model adds a field the schema does not list
  new_key        every step through the bridge; a step answered with a bounded failure or
                 rate_limited is sent again at once under a new idempotency_key each time

Whatever happened, it claims `done`.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TASK = json.loads(Path(os.environ["VAULTSIM_TASK"]).read_text(encoding="utf-8"))
MODE = os.environ.get("RT41M_MODE", "child_fatigue")
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


class Sock:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(os.environ["VAULTSIM_SOCKET"])
        self.f = self.s.makefile("rwb")
        self.n = 0
        self.sid = self.rpc("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"]})["session_id"]

    def rpc(self, method: str, params: dict) -> dict:
        self.n += 1
        self.f.write((json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}) + "\n").encode())
        self.f.flush()
        while True:
            msg = json.loads(self.f.readline())
            if msg.get("id") == self.n:
                return msg.get("result") or {"ok": False, "category": "error", "error": msg.get("error")}

    def call(self, step: dict, key: str) -> dict:
        r = self.rpc("call", {"session_id": self.sid, "operation": step["call"], "params": step["params"],
                              "idempotency_key": key, "wait_s": 5})
        while r.get("category") == "approval_pending":
            r = self.rpc("call.resume", {"session_id": self.sid, "resume_token": r["resume_token"], "wait_s": 5})
        return r


class Bridge:
    def __init__(self) -> None:
        exe = Path(sys.executable).with_name("vaultsim")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "vault.cli.main"]
        self.p = subprocess.Popen(cmd + ["mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=dict(os.environ))
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "rt41m-host", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def rpc(self, method: str, params: dict) -> dict:
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        assert self.p.stdout is not None
        while True:
            line = self.p.stdout.readline()
            if not line:
                return {}
            msg = json.loads(line)
            if msg.get("id") == self.n:
                return msg.get("result") or {"error": msg.get("error")}

    def call(self, step: dict, key: str, extra: dict | None = None) -> dict:
        args = dict(step["params"], idempotency_key=key, **(extra or {}))
        res = self.rpc("tools/call", {"name": step["call"], "arguments": args})
        r = res.get("structuredContent") or {}
        while r.get("category") == "approval_pending":
            res = self.rpc("tools/call", {"name": "vault_resume", "arguments": {"resume_token": r["resume_token"]}})
            r = res.get("structuredContent") or {}
        return r or {"category": "error", "raw": str(res)[:200]}

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=10)


def resolve(params: dict, data: dict) -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, str):
            for sid, d in data.items():
                for f, val in (d or {}).items():
                    v = v.replace("${%s.%s}" % (sid, f), str(val))
        out[k] = v
    return out


def main() -> None:
    steps = TASK["steps"]
    base = f"{TASK['run_id']}:{TASK['agent']}"
    data: dict[str, dict] = {}
    log: list[str] = []
    sock = Sock() if MODE in ("child_fatigue", "after_never") else None
    bridge = None if sock else Bridge()
    for i, step in enumerate(steps):
        st = dict(step, params=resolve(step["params"], data))
        key = f"{base}:{step['id']}"
        if sock is not None and i == 0:
            r = sock.call(st, key)
        else:
            if bridge is None:
                bridge = Bridge()
            extra = {"assignee": "mallory"} if MODE == "extra_param" else None
            r = bridge.call(st, key, extra)
            n = 0
            while MODE == "new_key" and r.get("category") in ("confirmed_failure", "local_failure", "rate_limited") and n < 2:
                n += 1
                r = bridge.call(st, f"{key}:again{n}")
        log.append(f"{step['id']}={r.get('category')}")
        if r.get("ok"):
            data[step["id"]] = r.get("data") or {}
    if bridge is not None:
        bridge.close()
    print("; ".join(log))
    print("done: every step finished")


if __name__ == "__main__":
    main()
