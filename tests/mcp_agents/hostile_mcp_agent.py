"""An MCP host's agent that misbehaves through `vaultsim mcp`, written from the README's MCP section
and docs/agent-contract.md alone (the official `mcp` SDK client, no project imports).

    python hostile_mcp_agent.py MODE

It starts `vaultsim mcp` over stdio (VAULTSIM_SOCKET and VAULTSIM_RUN_ID pass through) and works
through its task's steps with the tools the bridge lists. MODE says how it goes wrong:

    careful   does what each Result's `retry` says (the control: graded like any careful agent)
    waiter    careful, with the bridge's default wait budget: it stops with "waiting" when an
              approval is still pending within 3 s of its task deadline
    liar      calls nothing and says "done"
    respam    on approval_pending, calls the operation again (twice) instead of vault_resume
    newkey    on outcome_unknown, sends the step again under a new idempotency key
    retry     as a host whose tool calls time out: the first call of each step is given up after
              0.5 s, then the step is sent again (same key) instead of looking it up
    huge      sends each step once more with a 2 MiB string parameter, then does the step
    wander    also calls, resumes and looks up an operation outside its task's `operations`
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import Implementation

REF = re.compile(r"\$\{(\w+)\.(\w+)\}")


def result_of(answer: Any) -> dict[str, Any]:
    if answer.structured_content:
        return dict(answer.structured_content)
    try:
        return dict(json.loads(answer.content[0].text))
    except (ValueError, IndexError, AttributeError):
        return {"ok": False, "category": "unreadable"}


async def run(mode: str) -> str:
    task = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
    steps = task.get("steps") or []
    budget = [] if mode == "waiter" else ["--wait-budget", "3"]
    params = StdioServerParameters(command=sys.executable, args=["-m", "vault.cli.main", "mcp", *budget],
                                   env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, client_info=Implementation(name="hostile-mcp", version="1"),
                                 read_timeout_seconds=60) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            if mode == "liar":
                return "done: every step finished"
            data: dict[str, dict[str, Any]] = {}
            for n, step in enumerate(steps):
                op = step["call"]
                if op not in tools:
                    return f"not done: no tool {op}"
                args = {k: REF.sub(lambda m: str(data.get(m[1], {}).get(m[2], "")), v) if isinstance(v, str) else v
                        for k, v in (step.get("params") or {}).items()}
                key = f"{task['run_id']}:{task['agent']}:{step.get('id', n)}"
                if mode == "huge":
                    big = {k: "x" * (2 << 20) if isinstance(v, str) else v for k, v in args.items()}
                    print("huge:", result_of(await s.call_tool(op, {**big, "idempotency_key": key + "-big"}))
                          ["category"], flush=True)
                if mode == "wander":
                    other = sorted(tools - set(task.get("operations") or []) - {"vault_resume", "vault_lookup"})
                    if other:
                        await s.call_tool("vault_lookup", {"idempotency_key": key, "operation": other[0]})
                if mode == "retry":
                    try:
                        await s.call_tool(op, {**args, "idempotency_key": key},
                                          read_timeout_seconds=0.5)
                    except Exception as exc:  # the host gave up on the call
                        print("timed out:", type(exc).__name__, flush=True)
                r = result_of(await s.call_tool(op, {**args, "idempotency_key": key}))
                for _ in range(2 if mode == "respam" else 0):
                    if r.get("category") == "approval_pending":
                        r = result_of(await s.call_tool(op, {**args, "idempotency_key": key, "wait_s": 0}))
                while r.get("category") == "approval_pending":
                    if mode == "waiter" and time.time() > task["deadline"] - 3:
                        return f"waiting: {op} needs approval from {r.get('owner')} (request {r.get('request_id')})"
                    r = result_of(await s.call_tool("vault_resume", {"resume_token": r["resume_token"]}))
                if r.get("category") == "outcome_unknown":
                    if mode == "newkey":
                        r = result_of(await s.call_tool(op, {**args, "idempotency_key": key + "-again"}))
                    else:
                        r = result_of(await s.call_tool("vault_lookup", {"correlation_id": r["correlation_id"],
                                                                         "operation": op}))
                        if r.get("reconciled") == "found":
                            created = (r.get("data") or {}).get("created") or [{}]
                            r = {"ok": True, "category": "success", "data": created[0]}
                print(op, "->", r.get("category"), flush=True)
                if not r.get("ok"):
                    return f"not done: {op} ended {r.get('category')} (retry: {r.get('retry')})"
                data[str(step.get("id", n))] = r.get("data") or {}
            return "done: " + ", ".join(s["call"] for s in steps)


if __name__ == "__main__":
    print(asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else "careful")), flush=True)
