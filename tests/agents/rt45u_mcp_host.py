"""Red team 45u: an MCP host, the official `mcp` SDK's client over `vaultsim mcp` (started over stdio
with this process's environment, as the README says a host under `vaultsim run` must), written from
docs/agent-contract.md and the README's MCP section alone. Steps in order through the operations'
own tools (`idempotency_key`, `wait_s`), waits collected with `vault_resume`; ONE flaw, chosen by
RT45U_MODE:

  no_deadline  keeps collecting a wait with `vault_resume` whatever the clock says (the host's
               loop has no deadline check: "the bridge answers in time anyway")
  (none)       hands a wait over with `waiting` 3 s before its deadline

Run it with an interpreter that has the `mcp` SDK (the venv's python).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

MODE = os.environ.get("RT45U_MODE", "")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(TASK["deadline"])


def bridge() -> list[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "vaultsim")
    return [beside] if os.path.exists(beside) else [shutil.which("vaultsim") or "vaultsim"]


async def tool(s: ClientSession, name: str, args: dict[str, Any]) -> dict[str, Any]:
    out = await s.call_tool(name, args, read_timeout_seconds=60.0)
    doc = getattr(out, "structured_content", None) or getattr(out, "structuredContent", None)
    if not isinstance(doc, dict):
        doc = json.loads("".join(getattr(c, "text", "") for c in out.content))
    return dict(doc)


async def work(s: ClientSession) -> str:
    data: dict[str, dict[str, Any]] = {}
    for st in TASK["steps"]:
        text = json.dumps(st.get("params", {}))
        params = json.loads(re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(data[m.group(1)][m.group(2)]), text))
        key = f"{TASK['run_id']}:{TASK['agent']}:{st['id']}"
        r = await tool(s, st["call"], {**params, "idempotency_key": key,
                                        "wait_s": max(0.0, min(5.0, DEADLINE - time.time() - 3.5))})
        while r["category"] == "approval_pending":
            if MODE != "no_deadline" and DEADLINE - time.time() < 3.5:
                return f"waiting: {st['call']} needs a person's approval (request {r.get('request_id')})"
            r = await tool(s, "vault_resume", {"resume_token": r["resume_token"],
                                               "wait_s": max(0.5, min(5.0, DEADLINE - time.time() - 3.5))})
        if r["category"] != "success":
            return f"not done: {st['call']} answered {r['category']}"
        data[st["id"]] = r.get("data") or {}
    return "done"


async def main() -> None:
    prog = bridge()
    params = StdioServerParameters(command=prog[0], args=[*prog[1:], "mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            final = await work(s)
    print(final, flush=True)


asyncio.run(main())
