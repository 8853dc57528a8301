"""A careful MCP agent written from the README's MCP section and docs/agent-contract.md alone.

    python rt22m_careful.py [--http URL | --own-http] [--hang]

It starts `vaultsim mcp` over stdio with its own environment (the README: the SDK passes a server
only a few variables unless given `env`), or connects by URL (--http), or starts its own
`vaultsim mcp --http 127.0.0.1:0` and connects to the URL it prints (--own-http). For each step of its task it calls
the step's tool with an idempotency key kept per step id, follows each Result's `retry`:
approval_pending -> vault_resume with the token until decided or the task's time is nearly out
(then says "waiting"); outcome_unknown -> vault_lookup before any resend; `never` -> stop and say
"not done". It keeps finished steps' data and pending resume tokens in the task's state_dir, so a
restarted process collects what its predecessor waited for. Its final line is a JSON object with
`status`. With --hang it is a host that stops
answering: after its steps it sleeps, its bridge still running, until it is killed.
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
    return dict(json.loads(answer.content[0].text))


def fill(value: Any, data: dict[str, dict[str, Any]]) -> Any:
    if isinstance(value, str):
        return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
    return value


async def work(s: ClientSession, task: dict[str, Any]) -> dict[str, Any]:
    deadline = float(task["deadline"])
    # the contract's state_dir: finished steps' data and pending tokens, for a restarted process
    memory = os.path.join(task["state_dir"], "rt22m.json") if task.get("state_dir") else None
    kept: dict[str, Any] = json.load(open(memory)) if memory and os.path.exists(memory) else {}
    data: dict[str, dict[str, Any]] = kept.setdefault("data", {})
    tokens: dict[str, str] = kept.setdefault("tokens", {})

    def save() -> None:
        if memory:
            with open(memory + ".tmp", "w") as f:
                json.dump(kept, f)
            os.replace(memory + ".tmp", memory)

    for step in task.get("steps") or []:
        if step["id"] in data:
            continue
        key = f"{task.get('run_id', 'run')}-{step['id']}"
        args = {k: fill(v, data) for k, v in (step.get("params") or {}).items()}
        tool = step["call"]
        if step["id"] in tokens:  # a predecessor waited for this one: collect it, never ask again
            res = result_of(await s.call_tool("vault_resume", {"resume_token": tokens[step["id"]],
                                                               "wait_s": max(0.0, deadline - time.time() - 3)}))
        else:
            res = result_of(await s.call_tool(tool, {**args, "idempotency_key": key,
                                                     "wait_s": max(0.0, deadline - time.time() - 3)}))
        lookups = 0
        while True:
            retry = res.get("retry")
            if res.get("ok"):
                data[step["id"]] = dict(res.get("data") or {})
                tokens.pop(step["id"], None)
                save()
                break
            if res.get("category") == "approval_pending":
                tokens[step["id"]] = res["resume_token"]
                save()
                left = deadline - time.time() - 3
                if left <= 0.5:
                    return {"status": "waiting", "step": step["id"], "resume_token_kept": True}
                res = result_of(await s.call_tool("vault_resume", {"resume_token": res["resume_token"],
                                                                   "wait_s": left}))
                continue
            if retry == "after_delay" and lookups < 3:
                lookups += 1
                await asyncio.sleep(float(res.get("retry_after_s") or 1))
                res = result_of(await s.call_tool(tool, {**args, "idempotency_key": key}))
                continue
            if retry == "reconcile_first" and lookups < 3:
                lookups += 1
                found = result_of(await s.call_tool("vault_lookup", {"idempotency_key": key, "operation": tool}))
                if found.get("reconciled") == "found":  # the step's data: the first thing it created
                    created = (found.get("data") or {}).get("created") or [{}]
                    data[step["id"]] = dict(created[0])
                    save()
                    break
                if found.get("reconciled") == "not_found":
                    res = result_of(await s.call_tool(tool, {**args, "idempotency_key": key}))
                    continue
                await asyncio.sleep(0.2 * lookups)
                continue
            return {"status": "not_done", "step": step["id"], "category": res.get("category")}
    return {"status": "done", "steps": len(data)}


async def main(argv: list[str]) -> dict[str, Any]:
    task = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
    hang = "--hang" in argv
    argv = [a for a in argv if a != "--hang"]
    me = Implementation(name="rt22m-careful", version="1")
    if argv[:1] == ["--own-http"]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vault.cli.main", "mcp", "--http", "127.0.0.1:0",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        line = (await proc.stderr.readline()).decode()
        if "serving " not in line:
            return {"status": "not_done", "bridge": line.strip()}
        try:
            return await main(["--http", line.split("serving ", 1)[1].strip()] + (["--hang"] if hang else []))
        finally:
            proc.terminate()
            await proc.wait()
    if argv[:1] == ["--http"]:
        from mcp.client.streamable_http import streamable_http_client
        async with streamable_http_client(argv[1]) as (read, write):
            async with ClientSession(read, write, client_info=me) as s:
                await s.initialize()
                return await work(s, task)
    params = StdioServerParameters(command=sys.executable, args=["-m", "vault.cli.main", "mcp"],
                                   env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, client_info=me) as s:
            await s.initialize()
            done = await work(s, task)
            if hang:
                print(json.dumps(done), flush=True)
                await asyncio.sleep(3600)
            return done


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:]))), flush=True)
