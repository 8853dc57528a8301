"""Red team 49c: an MCP host built on the `mcp` SDK's client, talking to the vault only through a
`vaultsim mcp` bridge it starts over stdio (README's MCP section, docs/agent-contract.md).

It lists the tools, calls one step at a time with a progress callback (each call's progress token
is the SDK's), collects a pending approval with `vault_resume`, reconciles an unknown outcome with
`vault_lookup` before anything else, and says the truth last. With `--restart` it stops its bridge
and starts a new one between steps, where the contract allows a reconnect: no call waiting for a
person, and no later step of an operation already called (a new bridge is a new process and a new
vault session: it holds no grant of the old one). Run it with the venv's python (it needs `mcp`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

T0 = time.time()
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


class Stop(Exception):
    pass


class Bridge:
    def __init__(self) -> None:
        self.stack = AsyncExitStack()
        self.session: ClientSession | None = None
        self.tools: set[str] = set()

    async def start(self) -> None:
        beside = os.path.join(os.path.dirname(sys.executable), "vaultsim")
        prog = [beside, "mcp"] if os.path.exists(beside) else [sys.executable, "-m", "vault.cli.main", "mcp"]
        params = StdioServerParameters(command=prog[0], args=prog[1:], env=dict(os.environ))
        read, write = await self.stack.enter_async_context(stdio_client(params))
        self.session = await self.stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        self.tools = {t.name for t in (await self.session.list_tools()).tools}
        print(f"bridge up after {time.time() - T0:.2f}s of this process", file=sys.stderr, flush=True)

    async def stop(self) -> None:
        await self.stack.aclose()
        self.session = None

    async def call(self, tool: str, args: dict[str, Any], deadline: float) -> dict[str, Any]:
        assert self.session is not None

        async def progress(p: float, total: float | None, message: str | None) -> None:
            print(f"progress {tool}: {message or p}", file=sys.stderr, flush=True)

        budget = max(1.0, deadline - time.time() + 5)
        out = await self.session.call_tool(tool, args, read_timeout_seconds=budget,  # seconds (SDK 2.x)
                                           progress_callback=progress)
        doc = getattr(out, "structured_content", None) or getattr(out, "structuredContent", None)  # 2.x / 1.x
        if doc:
            return dict(doc)
        return json.loads("".join(getattr(c, "text", "") for c in out.content))


async def run(task: dict[str, Any], restart: bool) -> str:
    deadline = float(task["deadline"])
    run_id, agent = task["run_id"], task["agent"]
    steps = task["steps"]
    state_path = os.path.join(task["state_dir"], "host-state.json")
    try:  # a restart of this agent: skip what its predecessor finished, resume what it waited for
        state = json.load(open(state_path))
    except (OSError, ValueError):
        state = {"done": {}, "pending": {}}
    done: dict[str, Any] = state["done"]
    pending: dict[str, str] = state["pending"]

    def save() -> None:
        with open(state_path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(state_path + ".tmp", state_path)

    bridge = Bridge()
    await bridge.start()
    try:
        missing = {s["call"] for s in steps} - bridge.tools
        if missing:
            return f"not done: the bridge offers no tool for {', '.join(sorted(missing))}"
        for i, step in enumerate(steps):
            sid, op = step["id"], step["call"]
            if sid in done:
                continue
            if set(m[0] for m in REF.findall(json.dumps(step["params"]))) - set(done):
                return f"not done: {op} ({sid}) needs a step that did not succeed"
            params = json.loads(REF.sub(lambda m: str(done[m.group(1)][m.group(2)]), json.dumps(step["params"])))
            key = f"{run_id}:{agent}:{sid}"
            attempts = 0
            r: dict[str, Any] = {"category": "__send__"}
            if sid in pending:
                r = {"category": "approval_pending", "resume_token": pending[sid], "resumed": True}
            while True:
                cat = r.get("category")
                if cat == "__send__":
                    if attempts >= 3:
                        return f"not done: {op} ({sid}) failed {attempts} times"
                    if time.time() > deadline - 1.2:
                        return f"not done: no time left for {op} ({sid})"
                    attempts += 1
                    wait = max(0.0, min(20.0, deadline - time.time() - 1.5))  # the bridge answers earlier still
                    r = await bridge.call(op, {**params, "idempotency_key": key, "wait_s": wait}, deadline)
                elif cat == "success":
                    done[sid] = r.get("data") or {}
                    pending.pop(sid, None)
                    save()
                    break
                elif cat == "approval_pending":
                    left = deadline - time.time()
                    pending[sid] = r["resume_token"]
                    save()
                    if left < 1.5:
                        return f"waiting: {op} ({sid}) awaits approval by {r.get('owner', 'its owner')}"
                    resumed = r.get("resumed")
                    r = await bridge.call("vault_resume", {"resume_token": r["resume_token"],
                                                           "wait_s": max(0.0, min(20.0, left - 1.5))}, deadline)
                    if resumed and r.get("ok") is False and r.get("category") not in NEVER | {
                            "approval_pending", "outcome_unknown", "rate_limited", "local_failure",
                            "confirmed_failure", "vault_locked"}:
                        r = {"category": "__send__"}  # the vault no longer knows the token: send it, its key
                    if r.get("category") != "approval_pending":
                        pending.pop(sid, None)
                        save()
                elif cat == "outcome_unknown":
                    tries = 0
                    while True:
                        lk = await bridge.call("vault_lookup", {"correlation_id": r["correlation_id"],
                                                                "operation": op}, deadline)
                        rec, lcat = lk.get("reconciled"), lk.get("category")
                        if lcat in NEVER:
                            return f"not done: {op} ({sid}) answered {lcat}"
                        if rec == "found" and lcat == "success":
                            r = {"category": "success", "data": ((lk.get("data") or {}).get("created") or [{}])[0]}
                            break
                        if rec in ("found", "not_found") and lcat != "success":
                            r = lk
                            break
                        if rec == "not_found":
                            r = {"category": "__send__"}
                            break
                        if lk.get("resume_token"):
                            r = {**lk, "category": "approval_pending"}
                            break
                        tries += 1
                        if tries > 3 or time.time() > deadline - 1.5:
                            return f"not done: {op} ({sid}) outcome unknown; a person must inspect it"
                        await asyncio.sleep(float(lk.get("retry_after_s") or 0.1 * 2 ** tries))
                elif cat in NEVER:
                    return f"not done: {op} ({sid}) answered {cat}"
                elif cat == "rate_limited":
                    pause = float(r.get("retry_after_s") or 1.0)
                    if attempts >= 3 or time.time() + pause > deadline - 2.5:
                        return f"not done: {op} ({sid}) rate limited past my deadline"
                    await asyncio.sleep(pause)
                    r = {"category": "__send__"}
                elif cat in ("local_failure", "confirmed_failure"):
                    await asyncio.sleep(0.2 * attempts)
                    r = {"category": "__send__"}
                else:  # vault_locked and anything else: no status tool over MCP, so stop (allowed)
                    return f"not done: {op} ({sid}) answered {cat}"
            later = {s["call"] for s in steps[i + 1:]}
            called = {s["call"] for s in steps[: i + 1]}
            if restart and later and not (later & called):
                await bridge.stop()  # between steps, nothing waiting, no grant a later step needs
                bridge = Bridge()
                await bridge.start()
        return f"done: {len(steps)}/{len(steps)} steps"
    finally:
        if bridge.session is not None:
            await bridge.stop()


def main() -> int:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    try:
        final = asyncio.run(run(task, "--restart" in sys.argv))
    except Exception as exc:  # the host's own failure: say so, claim nothing
        import traceback
        traceback.print_exc()
        final = f"not done: the host failed ({type(exc).__name__})"
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
