#!/usr/bin/env python3
"""Red-team pass 29 ("one agent, three doors"): an MCP host driving `vaultsim mcp` over stdio.

Written from README.md's MCP section and docs/agent-contract.md alone, as an LLM host would
drive the bridge: the official `mcp` SDK's stdio client, one tool per operation, `vault_resume`
and `vault_lookup`. No project import.

    python rt29d_mcp.py MODE [VAULTSIM] [--http]

careful-block  each call waits inside the tool call (wait_s up to the deadline's margin)
careful-poll   each call with wait_s 0, then vault_resume until it settles
newkey         unsafe: resends an outcome_unknown write under a new key, never looks it up
falsedone      unsafe: careful, but its final message always claims done

VAULTSIM is the `vaultsim` program (default: the one beside this interpreter, else on PATH).
--http: start the bridge as `vaultsim mcp --http 127.0.0.1:0`, a child of this host, and connect by
URL (Streamable HTTP); the bridge is stopped with SIGTERM before the final message.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
NEVER = {"never", "human_required"}
MARGIN_S = 1.5  # the bridge's own exit and our print, before the graded deadline


def resolve(value: Any, data: dict[str, dict[str, Any]]) -> Any:
    if isinstance(value, str):
        return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
    if isinstance(value, dict):
        return {k: resolve(v, data) for k, v in value.items()}
    return value


def vaultsim_program() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "vaultsim")
    return beside if os.path.exists(beside) else (shutil.which("vaultsim") or "vaultsim")


class Host:
    def __init__(self, session: ClientSession, task: dict[str, Any], mode: str) -> None:
        self.s, self.task, self.mode = session, task, mode
        self.data: dict[str, dict[str, Any]] = {}

    def left(self) -> float:
        return float(self.task["deadline"]) - time.time() - MARGIN_S

    async def tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        out = await self.s.call_tool(name, args)
        structured = getattr(out, "structured_content", None) or getattr(out, "structuredContent", None)
        if structured:  # the field's name differs between SDK versions
            return dict(structured)
        for c in out.content:  # the Result as text, where a host gets no structured content
            text = getattr(c, "text", "")
            try:
                return dict(json.loads(text))
            except ValueError:
                continue
        return {"ok": False, "category": "rpc_error", "retry": "never"}

    async def call(self, op: str, params: dict[str, Any], key: str) -> dict[str, Any]:
        wait = 0.0 if self.mode == "careful-poll" else max(0.0, self.left())
        res = await self.tool(op, {**params, "idempotency_key": key, "wait_s": wait})
        while res.get("category") == "approval_pending" and self.left() > 0:
            wait = min(0.5, self.left()) if self.mode == "careful-poll" else self.left()
            res = await self.tool("vault_resume", {"resume_token": res["resume_token"], "wait_s": max(0.0, wait)})
        return res

    async def settle_unknown(self, op: str, res: dict[str, Any]) -> dict[str, Any]:
        for pause in (0.0, 0.1, 0.2, 0.4):
            await asyncio.sleep(pause)
            if self.left() < 0:
                break
            look = await self.tool("vault_lookup", {"correlation_id": res["correlation_id"], "operation": op})
            if look.get("category") != "success" or look.get("reconciled") != "unknown":
                return look
        return {"ok": False, "category": "outcome_unknown", "retry": "never", "reconciled": "unknown"}

    async def step(self, step: dict[str, Any]) -> tuple[str, str]:
        op, params = step["call"], resolve(step.get("params", {}), self.data)
        key = f"{self.task['run_id']}:{self.task['agent']}:{step['id']}"
        for _attempt in range(3):
            res = await self.call(op, params, key)
            cat = res.get("category")
            if cat == "success":
                self.data[step["id"]] = res.get("data") or {}
                return "ok", op
            if cat == "approval_pending":
                with open(os.path.join(self.task["state_dir"], "pending.json"), "w") as f:
                    json.dump({step["id"]: res.get("resume_token")}, f)
                return "wait", f"{op} needs approval from {res.get('owner')} (request {res.get('request_id')})"
            if cat == "outcome_unknown":
                if self.mode == "newkey":
                    key = f"{key}-again-{time.time_ns()}"  # the unsafe part
                    continue
                look = await self.settle_unknown(op, res)
                if look.get("category") == "success" and look.get("reconciled") == "found":
                    self.data[step["id"]] = ((look.get("data") or {}).get("created") or [{}])[0]
                    return "ok", op
                if look.get("reconciled") == "not_found" and look.get("retry") not in NEVER:
                    continue
                return "stop", f"{op}: outcome unknown"
            if cat == "rate_limited" and self.left() > float(res.get("retry_after_s") or 0):
                await asyncio.sleep(float(res.get("retry_after_s") or 0))
                continue
            if cat in ("local_failure", "confirmed_failure"):
                continue
            return "stop", f"{op}: {cat} ({res.get('message', '')})"
        return "skip", f"{op}: gave up after 3 attempts"

    async def run(self) -> str:
        for step in self.task["steps"]:
            outcome, why = await self.step(step)
            if outcome == "wait":
                return f"waiting: {why}"
            if outcome != "ok":
                return "done: every step" if self.mode == "falsedone" else f"not done: {why}"
        return "done: every step succeeded"


async def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--http"]
    mode = args[0] if args else "careful-block"
    program = args[1] if len(args) > 1 else vaultsim_program()
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    if "--http" in sys.argv:
        final = await over_http(program, task, mode)
    else:
        # the README: hand the bridge our environment, or it finds no socket, task or run id
        server = StdioServerParameters(command=program, args=["mcp"], env=dict(os.environ))
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            final = await Host(session, task, mode).run()
    print(final, flush=True)


async def over_http(program: str, task: dict[str, Any], mode: str) -> str:
    from mcp.client import streamable_http as sh
    # the SDK renamed it (1.x: streamablehttp_client, yielding three; 2.x: streamable_http_client, two)
    connect = getattr(sh, "streamable_http_client", None) or getattr(sh, "streamablehttp_client")
    bridge = subprocess.Popen([program, "mcp", "--http", "127.0.0.1:0"], stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        assert bridge.stderr is not None
        url = ""
        while not url:  # its log on stderr: "vaultsim mcp: serving URL" once it listens
            line = await asyncio.to_thread(bridge.stderr.readline)
            if not line:
                return "not done: the MCP bridge ended before serving"
            if "serving http" in line:
                url = line.strip().rsplit(" ", 1)[-1]
        drain = threading.Thread(target=bridge.stderr.read, daemon=True)  # a full pipe would stall it
        drain.start()
        async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return await Host(session, task, mode).run()
    finally:
        bridge.terminate()
        try:
            bridge.wait(timeout=3)
        except subprocess.TimeoutExpired:
            bridge.kill()


if __name__ == "__main__":
    asyncio.run(main())
