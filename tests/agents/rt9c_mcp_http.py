"""A careful agent that reaches the vault as an MCP host does over Streamable HTTP.

Written from the README's MCP section and docs/agent-contract.md alone: it starts
`vaultsim mcp --http 127.0.0.1:PORT` as its own child (in the jail, its own loopback), talks to
it with the official Python SDK's `ClientSession` over `streamable_http_client`, does its task's
steps the careful way (one key per step, same key on resends, a lookup after an unknown outcome,
stop on `never`, resume a pending approval until the deadline nears) and stops its bridge
before it exits. RT9C_RECONNECT=1 opens a new MCP session (initialize..DELETE) per step, as a
host that reconnects between tool calls does.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

TASK = json.loads(Path(os.environ["VAULTSIM_TASK"]).read_text())
DEADLINE = float(TASK["deadline"])
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
STATE = Path(TASK["state_dir"]) / "rt9c-mcp.json" if TASK.get("state_dir") else None
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def left() -> float:
    return DEADLINE - time.time()


def load() -> dict[str, Any]:
    try:
        return json.loads(STATE.read_text()) if STATE else {}
    except (OSError, ValueError):
        return {}


def save(state: dict[str, Any]) -> None:
    if STATE:
        part = STATE.with_suffix(".part")   # beside its final name: /tmp is another mount in the jail
        part.write_text(json.dumps(state))
        part.replace(STATE)


def subst(value: Any, done: dict[str, Any]) -> Any:
    if isinstance(value, str):
        def one(m: re.Match[str]) -> str:
            data = done[m.group(1)]
            return str(data[m.group(2)])
        return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", one, value)
    if isinstance(value, dict):
        return {k: subst(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [subst(v, done) for v in value]
    return value


def result_of(res: Any) -> dict[str, Any]:
    if res.structured_content:
        return dict(res.structured_content)
    for c in res.content:
        try:
            return dict(json.loads(c.text))
        except (AttributeError, ValueError):
            continue
    return {"ok": False, "category": "malformed_response", "retry": "never"}


def wait_s() -> float:
    # 3 s kept for the end: closing the MCP session, stopping the bridge and exiting took 2.5 s
    # on a loaded 2-core host (FAIL_DEADLINE by 0.55 s with 2 s kept)
    return max(0.0, min(40.0, left() - 3.0))


class Host:
    def __init__(self, url: str) -> None:
        self.url = url
        self.stack: Any = None
        self.session: ClientSession | None = None

    async def open(self) -> ClientSession:
        from contextlib import AsyncExitStack
        self.stack = AsyncExitStack()
        streams = await self.stack.enter_async_context(streamable_http_client(self.url))
        r, w = streams[0], streams[1]
        self.session = await self.stack.enter_async_context(
            ClientSession(r, w, client_info=__import__("mcp").types.Implementation(name="rt9c-host ✓", version="1")))
        await self.session.initialize()
        return self.session

    async def close(self) -> None:
        if self.stack is not None:
            await self.stack.aclose()
        self.stack = self.session = None


async def step_once(s: ClientSession, step: dict[str, Any], state: dict[str, Any]) -> tuple[str, str]:
    sid, op = str(step.get("id", "")), step["call"]
    key = f"{RUN_ID}:{TASK['agent']}:{sid}"
    try:
        params = subst(step.get("params", {}), state["done"])
    except KeyError:
        return "stop", f"{sid}: a value it needs is missing"
    attempts = 0
    token = state["pending"].get(sid)
    res: dict[str, Any] | None = None
    if token:
        r = result_of(await s.call_tool("vault_resume", {"resume_token": token, "wait_s": wait_s()}))
        res = r if r.get("category") != "malformed_response" or r.get("correlation_id") else None
    while True:
        if res is None:
            if attempts >= 3 or left() < 1.0:
                return "stop", f"{sid}: gave up"
            attempts += 1
            res = result_of(await s.call_tool(op, {**params, "idempotency_key": key, "wait_s": wait_s()}))
        cat = res.get("category")
        print(f"log: {sid} {op}: {cat}", flush=True)
        if cat == "success":
            state["done"][sid] = res.get("data") or {}
            state["pending"].pop(sid, None)
            save(state)
            return "done", sid
        if cat == "approval_pending":
            state["pending"][sid] = res["resume_token"]
            save(state)
            while res.get("category") == "approval_pending":
                if left() < 3.5:
                    return "wait", f"{op} needs approval from {res.get('owner')} (request {res.get('request_id')})"
                res = result_of(await s.call_tool("vault_resume", {"resume_token": state["pending"][sid],
                                                                   "wait_s": wait_s()}))
            state["pending"].pop(sid, None)
            save(state)
            continue
        if cat in ("local_failure", "confirmed_failure"):
            res = None
            continue
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 1.0)
            if left() - delay < 2.0:
                return "stop", f"{sid}: rate limited past the deadline"
            await asyncio.sleep(delay)
            res = None
            continue
        if cat == "vault_locked":
            return "stop", f"{sid}: vault locked"
        if cat == "outcome_unknown":
            delay = 0.1
            for _ in range(4):
                lk = result_of(await s.call_tool("vault_lookup", {"correlation_id": res["correlation_id"],
                                                                  "operation": op}))
                if lk.get("reconciled") == "found":
                    created = (lk.get("data") or {}).get("created") or [{}]
                    state["done"][sid] = created[0]
                    save(state)
                    return "done", sid
                if lk.get("reconciled") == "not_found":
                    break
                if left() - delay < 1.5:
                    break
                await asyncio.sleep(delay)
                delay *= 2
            else:
                return "stop", f"{sid}: outcome unknown"
            if lk.get("reconciled") != "not_found":
                return "stop", f"{sid}: outcome unknown"
            res = None
            continue
        return "stop", f"{sid}: {cat}"


async def main(url: str) -> str:
    state = load()
    state.setdefault("done", {})
    state.setdefault("pending", {})
    todo = [st for st in TASK["steps"] if str(st.get("id", "")) not in state["done"]]
    reconnect = os.environ.get("RT9C_RECONNECT") == "1"
    host = Host(url)
    s = await host.open()
    names = {t.name for t in (await s.list_tools()).tools}
    waits: list[str] = []
    try:
        for step in todo:
            if step["call"] not in names:
                return f"not done: no tool {step['call']}"
            if reconnect and step is not todo[0]:
                await host.close()
                s = await host.open()
            how, why = await step_once(s, step, state)
            if how == "stop":
                return f"not done: {why}"
            if how == "wait":
                waits.append(why)
                break
    finally:
        await host.close()
    return f"waiting: {'; '.join(waits)}" if waits else "done: every step succeeded"


def start_bridge() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exe = str(Path(sys.executable).with_name("vaultsim"))
    proc = subprocess.Popen([exe, "mcp", "--http", f"127.0.0.1:{port}"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)
    while left() > 1.0 and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/mcp"


if __name__ == "__main__":
    bridge, url = start_bridge()
    try:
        final = asyncio.run(asyncio.wait_for(main(url), timeout=max(0.5, left() - 0.8)))
    except BaseException as exc:  # a careful agent still ends with a claim it can stand behind
        import traceback
        traceback.print_exc(file=open(os.environ["RT9C_TB"], "a") if os.environ.get("RT9C_TB") else sys.stderr)
        final = f"not done: {type(exc).__name__}"
    finally:
        bridge.send_signal(signal.SIGTERM)
        try:
            bridge.wait(timeout=max(0.2, left() - 0.3))
        except subprocess.TimeoutExpired:
            bridge.kill()
            bridge.wait()
    print(final, flush=True)
