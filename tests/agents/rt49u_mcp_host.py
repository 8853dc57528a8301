#!/usr/bin/env python3
"""Red team 49u: an MCP host written from the README's MCP section and docs/agent-contract.md alone,
speaking MCP's stdio transport by hand (one JSON object a line) to `vaultsim mcp`, which it starts
as its child. ONE flaw, chosen by RT49U_MODE:

  cancel_resend  a tool call waiting for a person is cancelled (`notifications/cancelled`, as a host
                 does when its user presses stop) and the same tool call sent again at once under a
                 new JSON-RPC id, the same `idempotency_key`; its wait then handed over (`waiting`)
  cancel_newkey  the same, the tool call sent again under a new `idempotency_key` (a host that makes
                 one per tool call)
  nograce        the same as cancel_resend, the bridge started with `--cancel-grace 0` (the cancel
                 withdraws the call at once)
  (none)         the tool call waits, its wait handed over with `waiting`

It touches nothing outside its own trial; it prints no secret and kills nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

MODE = os.environ.get("RT49U_MODE", "")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))


def bridge() -> list[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "vaultsim")
    return [beside] if os.path.exists(beside) else [shutil.which("vaultsim") or "vaultsim"]


class Host:
    def __init__(self) -> None:
        grace = ["--cancel-grace", "0"] if MODE == "nograce" else []
        self.p = subprocess.Popen([*bridge(), "mcp", *grace], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(self, msg: dict) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps({"jsonrpc": "2.0", **msg}).encode() + b"\n")
        self.p.stdin.flush()

    def answer(self, rid: int) -> dict:
        assert self.p.stdout is not None
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise ConnectionError("the bridge closed its stdout")
            msg = json.loads(line)
            if msg.get("id") == rid:
                return msg

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(10)


def main() -> int:
    host = Host()
    host.send({"id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rt49u", "version": "1"}}})
    host.answer(1)
    host.send({"method": "notifications/initialized"})
    step = TASK["steps"][0]
    key = f"{TASK['run_id']}:{TASK['agent']}:{step['id']}"
    args = {**step.get("params", {}), "idempotency_key": key, "wait_s": 0.5}
    call = {"method": "tools/call", "params": {"name": step["call"], "arguments": args}}
    if MODE in ("cancel_resend", "cancel_newkey", "nograce"):
        host.send({"id": 2, **call, "params": {**call["params"], "arguments": {**args, "wait_s": 30}}})
        time.sleep(1.0)  # the person has been asked; the host's user presses stop
        host.send({"method": "notifications/cancelled", "params": {"requestId": 2, "reason": "user stop"}})
        rid = 3  # ... and the host sends the same tool call again under a new id
        if MODE == "cancel_newkey":
            call = {**call, "params": {**call["params"], "arguments": {**args, "idempotency_key": key + ":2"}}}
    else:
        rid = 2
    host.send({"id": rid, **call})
    out = host.answer(rid)["result"]
    doc = out.get("structuredContent") or {}
    print(f"rt49u mcp: {doc.get('category')}", file=sys.stderr, flush=True)
    host.close()
    if doc.get("category") == "approval_pending":
        with open(os.path.join(TASK["state_dir"], "wait.json"), "w") as f:
            json.dump({"step": step["id"], "resume_token": doc.get("resume_token")}, f)
        print(f"waiting: {step['call']} waits for {doc.get('owner')}", flush=True)
    elif doc.get("category") == "success":
        print("done: " + step["call"], flush=True)
    else:
        print(f"not done: {step['call']} {doc.get('category')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
