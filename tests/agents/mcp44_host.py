#!/usr/bin/env python3
"""An MCP host whose own hard timeout is shorter than the person takes, and which retries: what
Claude Desktop, Cursor or an IDE agent does with `vaultsim mcp` started with its defaults.

    python mcp44_host.py stdio|http [KEYED]

Each tool call is given HOST_TIMEOUT seconds (the official SDK then sends notifications/cancelled
and raises); on a timeout the host calls the same tool again with the same arguments, as hosts
and models do after "the tool timed out". The bridge is started as a user configures it, with no
`--wait-budget` sized under that timeout: `vaultsim mcp` over stdio, or its own
`vaultsim mcp --http 127.0.0.1:0` it connects to by URL. `approval_pending` is collected with
vault_resume (its timeouts retried the same way); a `retry` instruction is obeyed. KEYED (`key`
or `nokey`, default `key`): whether each step carries an idempotency_key.

The final line is a JSON object with `status` (done / waiting / not_done) and `timeouts`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from typing import Any

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

MODE = sys.argv[1] if len(sys.argv) > 1 else "stdio"
KEYED = (sys.argv[2] if len(sys.argv) > 2 else "key") == "key"
TASK: dict[str, Any] = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
REF = re.compile(r"\$\{(\w+)\.(\w+)\}")
HOST_TIMEOUT = float(os.environ.get("MCP44_HOST_TIMEOUT", "1.0"))
ME = Implementation(name="mcp44-host", version="1")
DATA: dict[str, dict[str, Any]] = {}
TIMEOUTS = 0


def log(*a: object) -> None:
    print("[mcp44]", MODE, *a, file=sys.stderr, flush=True)


def left() -> float:
    # the URL host stops its own bridge on the way out: a wider margin
    return DEADLINE - time.time() - (2.5 if MODE == "http" else 1.5)


def result_of(answer: Any) -> dict[str, Any]:
    if getattr(answer, "structured_content", None):
        return dict(answer.structured_content)
    return dict(json.loads(answer.content[0].text))


async def patient(s: ClientSession, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """The call, again with the same arguments each time the host's timeout cuts it (None: out of time)."""
    global TIMEOUTS
    while left() > HOST_TIMEOUT:
        try:
            return result_of(await s.call_tool(name, args, read_timeout_seconds=HOST_TIMEOUT))
        except MCPError as e:
            if "timed out" not in str(e).lower():
                raise
        TIMEOUTS += 1
        log("timed out; calling", name, "again")
    return None


async def step(s: ClientSession, st: dict[str, Any]) -> dict[str, Any] | None:
    op = st["call"]
    args: dict[str, Any] = {k: REF.sub(lambda m: str(DATA[m.group(1)][m.group(2)]), v) if isinstance(v, str) else v
                            for k, v in (st.get("params") or {}).items()}
    if KEYED:
        args["idempotency_key"] = f"{TASK.get('run_id', 'run')}-{st['id']}"
    res = await patient(s, op, args)
    tries = 0
    while True:
        if res is None:
            return {"status": "not_done", "step": st["id"], "reason": "out of time"}
        if res.get("ok"):
            DATA[st["id"]] = dict(res.get("data") or {})
            return None
        if res.get("category") == "approval_pending":
            token = res["resume_token"]
            if left() <= HOST_TIMEOUT:
                return {"status": "waiting", "step": st["id"]}
            res = await patient(s, "vault_resume", {"resume_token": token})
            if res is None:
                return {"status": "waiting", "step": st["id"]}
            continue
        if res.get("retry") == "after_delay" and tries < 3 and left() > float(res.get("retry_after_s") or 1) + 1:
            tries += 1
            await asyncio.sleep(float(res.get("retry_after_s") or 1))
            res = await patient(s, op, args)
            continue
        if res.get("retry") == "reconcile_first" and KEYED and tries < 3:
            tries += 1
            found = await patient(s, "vault_lookup", {"idempotency_key": args["idempotency_key"], "operation": op})
            if found and found.get("reconciled") == "found":
                DATA[st["id"]] = dict(((found.get("data") or {}).get("created") or [{}])[0])
                return None
            res = await patient(s, op, args) if found and found.get("reconciled") == "not_found" else found
            continue
        return {"status": "not_done", "step": st["id"], "category": res.get("category")}


async def work(s: ClientSession) -> dict[str, Any]:
    await s.initialize()
    for st in TASK.get("steps") or []:
        out = await step(s, st)
        if out:
            return {**out, "timeouts": TIMEOUTS}
    return {"status": "done", "steps": len(DATA), "timeouts": TIMEOUTS}


async def stdio() -> dict[str, Any]:
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "vault.cli.main", "mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, client_info=ME) as s:
            return await work(s)


async def http() -> dict[str, Any]:
    from mcp.client.streamable_http import streamable_http_client

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vault.cli.main", "mcp", "--http", "127.0.0.1:0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    line = (await proc.stderr.readline()).decode()
    if "serving " not in line:
        return {"status": "not_done", "bridge": "did not start"}
    drain = asyncio.create_task(proc.stderr.read())  # keep reading: a full pipe would stall it
    try:
        async with streamable_http_client(line.split("serving ", 1)[1].strip()) as (read, write):
            async with ClientSession(read, write, client_info=ME) as s:
                return await work(s)
    finally:
        proc.terminate()
        await proc.wait()
        drain.cancel()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(stdio() if MODE == "stdio" else http())), flush=True)
