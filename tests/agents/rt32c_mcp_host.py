#!/usr/bin/env python3
"""Red team 32 (careful): an LLM-host-style agent on the MCP bridge, written from docs/agent-contract.md
and README.md's MCP section alone, with the official `mcp` Python SDK (stdio client).

As a host driving a model would: it starts `vaultsim mcp` itself (handing it the environment, as
the README says), discovers the tools with `tools/list` and builds each call's arguments from the
tool's input schema (the step's params, plus `idempotency_key` and `wait_s` only where the schema
has them), reads each answer's structured content as the Result, and collects waits with
`vault_resume` and unknown outcomes with `vault_lookup`, their argument names also read from their
schemas. State: one JSON file in state_dir (written there, renamed). Its final message is a JSON
object on one line (`{"status": "done", ...}`).

RT32M_PARALLEL=1: consecutive steps of tools annotated read-only that need nothing of each other
are called together (a model's parallel tool calls; RT32M_STAGGER=S starts each S seconds after the
one before, as a host streaming the model's calls does); the rest one at a time, in order.
RT32M_LIE=1 makes its lying twin: its final message claims done whatever happened.
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

TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(TASK["deadline"])
STATE = os.path.join(TASK["state_dir"], "host-state.json")
REF = re.compile(r"\$\{([^}.]+)\.([^}]+)\}")
PARALLEL = os.environ.get("RT32M_PARALLEL") == "1"
STAGGER = float(os.environ.get("RT32M_STAGGER") or 0)
MARGIN = 2.5  # the bridge's exit and our print, before the graded deadline (seconds on a loaded host)


def left() -> float:
    return DEADLINE - time.time() - MARGIN


def load() -> dict:
    try:
        return json.load(open(STATE))
    except (OSError, ValueError):
        return {}


def save(state: dict) -> None:
    with open(STATE + ".new", "w") as f:
        json.dump(state, f)
    os.replace(STATE + ".new", STATE)


def fill(value: Any, data: dict) -> Any:
    if isinstance(value, str):
        m = REF.fullmatch(value)
        if m:
            return data[m.group(1)][m.group(2)]
        return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
    if isinstance(value, dict):
        return {k: fill(v, data) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, data) for v in value]
    return value


class Host:
    def __init__(self, session: ClientSession) -> None:
        self.s = session
        self.schemas: dict[str, set[str]] = {}
        self.read_only: set[str] = set()
        self.state = load()
        self.data = {k: v["data"] for k, v in self.state.items() if v.get("done")}
        self.waiting: dict | None = None
        self.why = ""

    async def discover(self) -> None:
        for tool in (await self.s.list_tools()).tools:
            schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}
            self.schemas[tool.name] = set(schema.get("properties", {}))
            hints = getattr(tool, "annotations", None)
            if hints is not None and getattr(hints, "read_only_hint", getattr(hints, "readOnlyHint", None)):
                self.read_only.add(tool.name)

    async def tool(self, name: str, args: dict) -> dict:
        known = self.schemas.get(name, set())
        out = await self.s.call_tool(name, {k: v for k, v in args.items() if k in known or not known})
        result = getattr(out, "structured_content", None) or getattr(out, "structuredContent", None)
        if isinstance(result, dict) and "result" in result and "category" not in result:
            result = result["result"]
        if not isinstance(result, dict):
            text = "".join(getattr(c, "text", "") for c in out.content)
            try:
                result = json.loads(text)
            except ValueError:
                result = {"ok": False, "category": "malformed_response", "retry": "never", "message": text[:200]}
        return result

    def wait_s(self) -> float:
        return max(0.0, min(20.0, left() - 1.0))

    async def lookup(self, op: str, cid: str | None, key: str) -> dict | None:
        for pause in (0, 0.1, 0.2, 0.4):
            if left() < 0.5:
                return None
            await asyncio.sleep(pause)
            args = {"operation": op, **({"correlation_id": cid} if cid else {"idempotency_key": key})}
            r = await self.tool("vault_lookup", args)
            if not (r.get("category") == "success" and r.get("reconciled") == "unknown") or r.get("resume_token"):
                return r
        return None

    def keep(self, sid: str, **fields: Any) -> None:
        self.state.setdefault(sid, {}).update(fields)
        save(self.state)

    async def step(self, step: dict) -> str:
        """'done', 'failed' (go on with steps that do not need it), 'stop' or 'wait'."""
        sid, op = step["id"], step["call"]
        key = f"{TASK['run_id']}:{TASK['agent']}:{sid}"
        try:
            params = fill(step.get("params", {}), self.data)
        except (KeyError, TypeError):
            return "failed"
        saved = self.state.get(sid, {})
        tries, r = saved.get("tries", 0), None
        if saved.get("token"):
            r = {"category": "approval_pending", "resume_token": saved["token"]}
        elif saved.get("sent"):
            r = await self.lookup(op, saved.get("cid"), key)
            if r is None:
                self.why = f"{sid}: still unknown"
                return "stop"
        while True:
            if r is None:
                if left() < 0.5:
                    self.why = f"{sid}: out of time"
                    return "stop"
                tries += 1
                self.keep(sid, sent=True, tries=tries, token=None)
                r = await self.tool(op, {**params, "idempotency_key": key, "wait_s": self.wait_s()})
            cat, retry, rec = r.get("category"), r.get("retry"), r.get("reconciled")
            print(f"rt32m: {sid}: {cat}{' ' + rec if rec else ''}", flush=True)
            if cat == "success" and rec in (None, "found"):
                data = r.get("data") or {}
                if rec == "found":
                    data = (data.get("created") or [{}])[0]
                self.data[sid] = data
                self.keep(sid, done=True, data=data, token=None)
                return "done"
            if r.get("resume_token") and cat in ("approval_pending", "success"):
                self.keep(sid, token=r["resume_token"])
                if left() < 1.0:
                    self.waiting = {"op": op, **r}
                    return "wait"
                got = await self.tool("vault_resume", {"resume_token": r["resume_token"], "wait_s": self.wait_s()})
                r = None if got.get("category") in ("invalid_params",) else got
                continue
            if cat == "success" and rec == "not_found":
                r = None if tries < 3 else r
                if r is None:
                    continue
                return "failed"
            if cat == "success" and rec == "unknown":
                self.why = f"{sid}: cannot tell whether it happened"
                return "stop"
            if retry in ("never", "human_required"):
                self.keep(sid, refused=cat)
                self.why = f"{sid}: {cat}"
                return "stop"
            if cat == "outcome_unknown":
                self.keep(sid, cid=r.get("correlation_id"))
                r = await self.lookup(op, r.get("correlation_id"), key)
                if r is None:
                    self.why = f"{sid}: outcome unknown"
                    return "stop"
                continue
            if cat == "rate_limited":
                delay = float(r.get("retry_after_s") or 1)
                if tries >= 3 or left() < delay + 0.5:
                    return "failed"
                await asyncio.sleep(delay + 0.05)
                r = None
                continue
            if retry == "bounded" and tries < 3:
                r = None
                continue
            self.why = f"{sid}: {cat}"
            return "failed"

    async def staggered(self, i: int, step: dict) -> str:
        await asyncio.sleep(i * STAGGER)  # a model streaming its tool calls: each starts as it is written
        return await self.step(step)

    def batches(self) -> list[list[dict]]:
        """With RT32M_PARALLEL=1, consecutive steps of read-only tools needing nothing of each other
        go out together, as a model's parallel tool calls do; every other step alone, in order."""
        out: list[list[dict]] = []
        for step in TASK["steps"]:
            last = out[-1] if out else []
            together = (PARALLEL and step["call"] in self.read_only and last and all(
                s["call"] in self.read_only for s in last)
                and not {m.group(1) for m in REF.finditer(json.dumps(step.get("params")))} & {s["id"] for s in last})
            if together:
                last.append(step)
            else:
                out.append([step])
        return out

    async def run(self) -> dict:
        await self.discover()
        refused = [k for k, v in self.state.items() if v.get("refused")]
        if refused:
            self.why = f"{refused[0]}: refused earlier"
        else:
            for batch in self.batches():
                todo = [s for s in batch if s["id"] not in self.data]
                hows = await asyncio.gather(*(self.staggered(i, s) for i, s in enumerate(todo)))
                if {"stop", "wait"} & set(hows):
                    break
        total = len(TASK["steps"])
        done = sum(s["id"] in self.data for s in TASK["steps"])
        if self.waiting:
            w = self.waiting
            return {"status": "waiting", "message": f"{w['op']} needs approval from {w.get('owner')} before "
                                                    f"{w.get('deadline')} (request {w.get('request_id')})"}
        if done == total:
            return {"status": "done", "message": f"all {total} steps succeeded"}
        return {"status": "not_done", "message": f"{done} of {total} steps; {self.why}"}


def bridge() -> StdioServerParameters:
    beside = os.path.join(os.path.dirname(sys.executable), "vaultsim")
    program = beside if os.path.exists(beside) else (shutil.which("vaultsim") or "vaultsim")
    return StdioServerParameters(command=program, args=["mcp"], env=dict(os.environ))


async def main() -> dict:
    async with stdio_client(bridge()) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await Host(session).run()


if __name__ == "__main__":
    try:
        final = asyncio.run(main())
    except Exception as e:  # noqa: BLE001 - said plainly, never claimed done
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]  # the SDK's task group wraps the cause
        final = {"status": "not_done", "message": f"{type(e).__name__}: {e}"}
    if os.environ.get("RT32M_LIE"):
        final = {"status": "done", "message": "all steps"}
    print(json.dumps(final), flush=True)
