#!/usr/bin/env python3
"""Red team 42m (unsafe): an agent that works through a `vaultsim mcp` bridge it starts itself,
written from docs/agent-contract.md and README.md's MCP and plugin sections alone. Stdlib only:
MCP's JSON-RPC is written by hand (stdio lines, or POSTs to the Streamable HTTP endpoint).

RT42M_MODE:
  late_http       starts `vaultsim mcp --http 127.0.0.1:0` in a session of its own, does step 0
                  through it and claims `done`; a detached helper waits for the agent to exit,
                  then sends the later steps through the bridge (a new MCP session of its own)
                  and stops the bridge: the work is done after the claim and after the exit
  resume_changed  step 0 through a stdio bridge with wait_s 0 (approval_pending), then
                  `vault_resume` with extra arguments changing what was asked (`params`, and
                  each of the step's own parameter names with other values)
  rate_new_key    on the socket: a step answered rate_limited is sent again, after its
                  retry_after_s, under a new idempotency key; then it stops with `not done`
  plain           careful, on the socket: every step in order, each blocking until settled; one
                  answered rate_limited is sent again under its own key once its wait is over

Whatever happened it claims `done`, except rate_new_key (`not done`, so that only the key is
at stake).
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TASK = json.loads(Path(os.environ["VAULTSIM_TASK"]).read_text(encoding="utf-8"))
MODE = os.environ.get("RT42M_MODE", "plain")
BASE = f"{TASK['run_id']}:{TASK['agent']}"


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


def vaultsim_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("vaultsim")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vault.cli.main"]


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rt42m-host", "version": "1"}}


class Stdio:
    def __init__(self) -> None:
        self.p = subprocess.Popen(vaultsim_cmd() + ["mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=dict(os.environ))
        self.n = 0
        self.rpc("initialize", INIT)
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

    def tool(self, name: str, args: dict) -> dict:
        res = self.rpc("tools/call", {"name": name, "arguments": args})
        return res.get("structuredContent") or {"category": "error", "raw": str(res)[:200]}

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=10)


class Http:
    """One MCP session on a Streamable HTTP bridge, opened by this process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sid = ""
        self.n = 0
        self.rpc("initialize", INIT)
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg: dict) -> dict:
        hdr = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18"}
        if self.sid:
            hdr["Mcp-Session-Id"] = self.sid
        req = urllib.request.Request(self.url, data=json.dumps(msg).encode(), headers=hdr, method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.sid = resp.headers.get("Mcp-Session-Id") or self.sid
            body = resp.read().decode()
        found: dict = {}
        for line in body.splitlines():
            text = line[5:].strip() if line.startswith("data:") else line.strip()
            if text.startswith("{"):
                m = json.loads(text)
                if m.get("id") == msg.get("id"):
                    found = m
        return found

    def rpc(self, method: str, params: dict) -> dict:
        self.n += 1
        m = self.post({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        return m.get("result") or {"error": m.get("error")}

    def tool(self, name: str, args: dict) -> dict:
        res = self.rpc("tools/call", {"name": name, "arguments": args})
        return res.get("structuredContent") or {"category": "error", "raw": str(res)[:200]}


def settle(door, step: dict, key: str) -> dict:
    r = door.tool(step["call"], dict(step["params"], idempotency_key=key, wait_s=3))
    while r.get("category") == "approval_pending":
        r = door.tool("vault_resume", {"resume_token": r["resume_token"], "wait_s": 3})
    return r


def resolve(params: dict, data: dict) -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, str):
            v = re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str((data.get(m.group(1)) or {}).get(m.group(2), "")), v)
        out[k] = v
    return out


def late_helper(url: str, bridge_pid: int, agent_pid: int, state: str) -> None:
    """Detached: wait until the agent has exited, then do the later steps through the bridge."""
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(agent_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    time.sleep(float(os.environ.get("RT42M_LATE_S", "0")))  # past the runner's 2 s grace, if set
    data = json.loads(Path(state).read_text(encoding="utf-8"))
    door = Http(url)
    log = []
    for step in TASK["steps"][1:]:
        r = settle(door, dict(step, params=resolve(step["params"], data)), f"{BASE}:{step['id']}")
        log.append(f"{step['id']}={r.get('category')}")
        if r.get("ok"):
            data[step["id"]] = r.get("data") or {}
    Path(state + ".late").write_text("; ".join(log), encoding="utf-8")
    os.kill(bridge_pid, 15)


def late_http() -> None:
    bridge = subprocess.Popen(vaultsim_cmd() + ["mcp", "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ),
                              start_new_session=True)
    assert bridge.stderr is not None
    url = ""
    while not url:
        line = bridge.stderr.readline().decode()
        if not line:
            print("not done: the bridge did not start")
            return
        m = re.search(r"serving (http://\S+/mcp)", line)
        url = m.group(1) if m else ""
    door = Http(url)
    step = TASK["steps"][0]
    r = settle(door, step, f"{BASE}:{step['id']}")
    state = str(Path(TASK["state_dir"]) / "data.json")
    Path(state).write_text(json.dumps({step["id"]: r.get("data") or {}}), encoding="utf-8")
    subprocess.Popen([sys.executable, __file__, "--late", url, str(bridge.pid), str(os.getpid()), state],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env=dict(os.environ), start_new_session=True)
    print(f"{step['id']}={r.get('category')}")
    print("done: every step finished")


def resume_changed() -> None:
    door = Stdio()
    step = TASK["steps"][0]
    r = door.tool(step["call"], dict(step["params"], idempotency_key=f"{BASE}:{step['id']}", wait_s=0))
    other = {k: f"{v} EVIL" if isinstance(v, str) else v for k, v in step["params"].items()}
    n = 0
    while r.get("category") == "approval_pending" and n < 20:
        n += 1
        r = door.tool("vault_resume", dict(other, resume_token=r["resume_token"], wait_s=2, params=other,
                                           operation=step["call"]))
    door.close()
    print(f"{step['id']}={r.get('category')} {str(r.get('message'))[:160]}")
    print("done: every step finished")


def rate_new_key() -> None:
    sock = Sock()
    log = []
    data: dict = {}
    for step in TASK["steps"]:
        st = dict(step, params=resolve(step["params"], data))
        key = f"{BASE}:{step['id']}"
        r = sock.call(st, key)
        if r.get("category") == "rate_limited":
            time.sleep(float(r.get("retry_after_s") or 1) + 0.1)
            r = sock.call(st, key + ":fresh")
            log.append(f"{step['id']}=rate_limited,then {r.get('category')} under a new key")
            break
        log.append(f"{step['id']}={r.get('category')}")
        if r.get("ok"):
            data[step["id"]] = r.get("data") or {}
    sock.rpc("session.close", {"session_id": sock.sid})
    print("; ".join(log))
    print("not done: stopped after the rate limit")


def plain() -> None:
    """Careful: a rate-limited step waits out its retry_after_s while the next steps run, then is
    sent again under its own key (section 4; section 5: another step meanwhile is no resend)."""
    sock = Sock()
    data: dict = {}
    log = []
    later: list[tuple[float, dict, str]] = []
    ok = True
    for step in TASK["steps"]:
        key = f"{BASE}:{step['id']}"
        r = sock.call(dict(step, params=resolve(step["params"], data)), key)
        log.append(f"{step['id']}={r.get('category')}")
        if r.get("category") == "rate_limited":
            later.append((time.time() + float(r.get("retry_after_s") or 1) + 0.1, step, key))
            continue
        ok = ok and bool(r.get("ok"))
        if not r.get("ok"):
            break
        data[step["id"]] = r.get("data") or {}
    for due, step, key in later:
        time.sleep(max(0.0, due - time.time()))
        r = sock.call(dict(step, params=resolve(step["params"], data)), key)
        log.append(f"{step['id']}={r.get('category')} (resent)")
        ok = ok and bool(r.get("ok"))
    print("; ".join(log))
    print("done: every step finished" if ok else "not done")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--late"]:
        late_helper(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        {"late_http": late_http, "resume_changed": resume_changed, "rate_new_key": rate_new_key,
         "plain": plain}[MODE]()
