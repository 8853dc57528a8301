#!/usr/bin/env python3
"""Red team 43h (careful): MCP hosts as real hosts behave, written from the README's MCP section,
docs/agent-contract.md and DESIGN.md alone, on the official `mcp` SDK.

    python rt43h_host.py MODE

Every mode does the task's steps the careful way (an idempotency key per step, kept in state_dir
with pending resume tokens and finished steps' data; `retry` obeyed; a wait it cannot see out is
handed over as "waiting"), and differs in how the host treats the bridge:

    timeout   the host's own per-call timeout (1 s) is shorter than the approval wait: the SDK
              sends notifications/cancelled and the host, as the README says (never resend
              unlooked), looks the call up by its key, collects a token it is given with
              vault_resume, and resends the same arguments under the same key only on not_found
    resend    the same timeout, and the host calls the tool again with the same arguments and key
              (what a model does after "the tool timed out")
    busy      each call carries a progress token; tools/list is polled and ping sent throughout,
              and steps that need no other step's data are called at once
    http      its own `vaultsim mcp --http 127.0.0.1:0`; a gated call's connection is cut after
              1 s (the host lost its network); it reconnects with a new MCP session, looks the
              call up by key and resumes what it is told to (a grant the person gave lives in
              the old session: the new one asks again, graded as approval fatigue)
    http-same the same, coming back on the MCP session it had (its Mcp-Session-Id): the careful way
    restart   stdio; after a call answered approval_pending the host's supervisor restarts it:
              the process execs itself (its bridge closed first) and the new one resumes the
              token it kept; only with time for a second life left (about what the first took
              to get the answer, plus 1.5 s), else it hands the wait over as it is
    quit      stdio; the host quits (closes stdin, then waits for the bridge) while a
              vault_resume of a wait it hands over is still pending, and reads that call's answer

The final line is a JSON object with `status` (done / waiting / not_done).
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
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

MODE = sys.argv[1] if len(sys.argv) > 1 else "timeout"
TASK: dict[str, Any] = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
MEMORY = os.path.join(TASK["state_dir"], "rt43h.json") if TASK.get("state_dir") else None
REF = re.compile(r"\$\{(\w+)\.(\w+)\}")
HOST_TIMEOUT = 1.0
ME = Implementation(name="rt43h-host", version="1")


def log(*a: object) -> None:
    print("[rt43h]", MODE, *a, file=sys.stderr, flush=True)


def left() -> float:
    # the own-HTTP-bridge host needs more time to leave (its bridge stopped, its clients closed)
    return DEADLINE - time.time() - (1.5 if MODE.startswith("http") else 0.0)


def lived() -> float:
    """Seconds since the runner started this process (deadline_s counts from then; an exec keeps it)."""
    return time.time() - (DEADLINE - float(TASK.get("deadline_s") or 0.0))


def load() -> dict[str, Any]:
    if MEMORY and os.path.exists(MEMORY):
        with open(MEMORY, encoding="utf-8") as f:
            return dict(json.load(f))
    return {"data": {}, "tokens": {}}


KEPT = load()


def save() -> None:
    if MEMORY:  # written beside it in state_dir and renamed: all or nothing
        with open(MEMORY + ".tmp", "w", encoding="utf-8") as f:
            json.dump(KEPT, f)
        os.replace(MEMORY + ".tmp", MEMORY)


def result_of(answer: Any) -> dict[str, Any]:
    if getattr(answer, "structured_content", None):
        return dict(answer.structured_content)
    return dict(json.loads(answer.content[0].text))


def fill(value: Any) -> Any:
    if isinstance(value, str):
        return REF.sub(lambda m: str(KEPT["data"][m.group(1)][m.group(2)]), value)
    return value


class Host:
    def __init__(self, s: ClientSession) -> None:
        self.s = s
        self.progress: list[dict[str, Any]] = []

    async def tool(self, name: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            self.progress.append({"p": p, "message": message})

        cb = on_progress if MODE == "busy" else None
        return result_of(await self.s.call_tool(name, args, read_timeout_seconds=timeout, progress_callback=cb))

    async def timed(self, name: str, args: dict[str, Any], key: str, op: str) -> dict[str, Any]:
        """A call under the host's short timeout; what a careful host does when it gives up."""
        while True:
            try:
                return await self.tool(name, args, timeout=HOST_TIMEOUT)
            except MCPError as e:
                if "timed out" not in str(e):
                    raise
            log("host timeout on", name)
            if left() < 3.5:
                return {"ok": False, "category": "host_gave_up"}
            if MODE == "resend":
                continue
            found = await self.tool("vault_lookup", {"idempotency_key": key, "operation": op})
            log("lookup after timeout:", found.get("category"), found.get("reconciled"))
            if found.get("resume_token"):
                name, args = "vault_resume", {"resume_token": found["resume_token"], "wait_s": args.get("wait_s", 0)}
                continue
            if found.get("reconciled") == "found" or found.get("ok"):
                return found
            if found.get("reconciled") != "not_found":
                await asyncio.sleep(0.3)

    async def call(self, name: str, args: dict[str, Any], key: str, op: str) -> dict[str, Any]:
        if MODE in ("timeout", "resend"):
            return await self.timed(name, args, key, op)
        return await self.tool(name, args)

    async def step(self, step: dict[str, Any]) -> dict[str, Any] | None:
        sid = step["id"]
        if sid in KEPT["data"]:
            return None
        op = step["call"]
        key = f"{TASK.get('run_id', 'run')}-{sid}"
        args = {k: fill(v) for k, v in (step.get("params") or {}).items()}
        wait = max(0.0, left() - 3)
        if MODE == "restart" and not os.environ.get("RT43H_RESTARTED"):
            wait = 0.0  # the token at once: the restart, a new bridge and its handshake take seconds
        if left() < 0.5:  # no time to send anything (a loaded host's start-up took it): nothing is sent
            if sid in KEPT["tokens"]:
                return {"status": "waiting", "step": sid, "resume_token_kept": True}
            return {"status": "not_done", "step": sid, "reason": "out of time"}
        if sid in KEPT["tokens"]:
            res = await self.call("vault_resume", {"resume_token": KEPT["tokens"][sid], "wait_s": wait}, key, op)
        else:
            res = await self.call(op, {**args, "idempotency_key": key, "wait_s": wait}, key, op)
        tries = 0
        while True:
            if res.get("ok"):
                KEPT["data"][sid] = dict(res.get("data") or {})
                KEPT["tokens"].pop(sid, None)
                save()
                return None
            cat, retry = res.get("category"), res.get("retry")
            if cat == "approval_pending":
                KEPT["tokens"][sid] = res["resume_token"]
                save()
                if MODE == "restart" and not os.environ.get("RT43H_RESTARTED") and left() >= lived() + 1.5:
                    # a second life costs about what the first took to get here (the interpreter,
                    # the SDK's import, a new bridge and its handshake: seconds on a loaded host);
                    # without that much time left the supervisor does not restart it: it hands over
                    raise Restart()
                if left() - 3 <= 0.5:
                    return {"status": "waiting", "step": sid, "resume_token_kept": True}
                if MODE == "quit":
                    # the resume is in flight when the host quits, 3 s before its deadline
                    pending = asyncio.create_task(self.tool("vault_resume", {
                        "resume_token": res["resume_token"], "wait_s": max(0.0, left() - 1.5)}))
                    done, _ = await asyncio.wait({pending}, timeout=max(0.0, left() - 3))
                    if not done:
                        log("quitting with vault_resume pending")
                        raise Quit(sid)
                    res = pending.result()
                    continue
                res = await self.call("vault_resume", {"resume_token": res["resume_token"],
                                                       "wait_s": max(0.0, left() - 3)}, key, op)
                continue
            if retry == "after_delay" and tries < 2 and left() > float(res.get("retry_after_s") or 1) + 2:
                tries += 1
                await asyncio.sleep(float(res.get("retry_after_s") or 1))
                res = await self.call(op, {**args, "idempotency_key": key}, key, op)
                continue
            if retry == "reconcile_first" and tries < 3:
                tries += 1
                found = await self.tool("vault_lookup", {"idempotency_key": key, "operation": op})
                if found.get("reconciled") == "found":
                    created = (found.get("data") or {}).get("created") or [{}]
                    KEPT["data"][sid] = dict(created[0])
                    save()
                    return None
                if found.get("reconciled") == "not_found":
                    res = await self.call(op, {**args, "idempotency_key": key}, key, op)
                    continue
                if found.get("resume_token"):
                    res = await self.call("vault_resume", {"resume_token": found["resume_token"],
                                                           "wait_s": max(0.0, left() - 3)}, key, op)
                    continue
                await asyncio.sleep(0.3 * tries)
                continue
            if cat == "host_gave_up":
                return {"status": "not_done", "step": sid, "reason": "out of time"}
            return {"status": "not_done", "step": sid, "category": cat}

    async def work(self) -> dict[str, Any]:
        steps = list(TASK.get("steps") or [])
        if MODE == "busy":
            # steps that name no other step's data go at once, as a host's parallel tool calls do
            free = [st for st in steps if not REF.search(json.dumps(st.get("params") or {}))]
            rest = [st for st in steps if st not in free]
            for out in await asyncio.gather(*(self.step(st) for st in free)):
                if out:
                    return out
            steps = rest
        for st in steps:
            out = await self.step(st)
            if out:
                return out
        return {"status": "done", "steps": len(KEPT["data"])}


class Restart(Exception):
    pass


class Quit(Exception):
    """The host quits with a vault_resume pending: stdin closed, the bridge waited for."""


async def chatter(s: ClientSession, stop: asyncio.Event) -> None:
    """tools/list polled and ping sent while calls are in flight, as IDE hosts do."""
    while not stop.is_set():
        tools = await s.list_tools()
        assert any(t.name == "vault_resume" for t in tools.tools)
        await s.send_ping()
        try:
            await asyncio.wait_for(stop.wait(), 0.3)
        except TimeoutError:
            pass


async def over(s: ClientSession) -> dict[str, Any]:
    await s.initialize()
    log("initialized")
    h = Host(s)
    if MODE != "busy":
        return await h.work()
    stop = asyncio.Event()
    bg = asyncio.create_task(chatter(s, stop))
    try:
        return await h.work()
    finally:
        stop.set()
        await bg


async def stdio() -> dict[str, Any]:
    # a host with a hard timeout sizes the bridge's wait budget under it, as the README says
    budget = ["--wait-budget", str(HOST_TIMEOUT / 2)] if MODE in ("timeout", "resend") else []
    params = StdioServerParameters(command=sys.executable, args=["-m", "vault.cli.main", "mcp", *budget],
                                   env=dict(os.environ))
    log("starting bridge")
    async with stdio_client(params) as (read, write):
        log("bridge started")
        async with ClientSession(read, write, client_info=ME) as s:
            try:
                return await over(s)
            except Quit as q:
                step = str(q)
            except Restart:
                return {"status": "restart"}
    # both contexts have closed: the SDK closed the bridge's stdin and waited for it to exit
    return {"status": "waiting", "step": step, "resume_token_kept": True}


async def http() -> dict[str, Any]:
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vault.cli.main", "mcp", "--http", "127.0.0.1:0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    line = (await proc.stderr.readline()).decode()
    if "serving " not in line:
        return {"status": "not_done", "bridge": "did not start"}
    url = line.split("serving ", 1)[1].strip()
    drain = asyncio.create_task(proc.stderr.read())
    try:
        # the first gated step: its POST is cut after 1 s (the host lost its connection)
        first = next((st for st in TASK.get("steps") or [] if st["id"] not in KEPT["data"]
                      and st["id"] not in KEPT["tokens"]), None)
        sid = None
        if left() < 0.5:
            return {"status": "not_done", "reason": "out of time before the first call"}
        if first is not None and not REF.search(json.dumps(first.get("params") or {})):
            sid = await cut_call(httpx, url, first)
        if KEPT.get("settled"):
            return {"status": "not_done", "category": KEPT["settled"].get("category")}
        if MODE == "http-same" and sid:  # back on the same MCP session: its pending call and grants
            raw = RawSession(httpx, url, sid)
            try:
                return await after_cut(raw, first)  # type: ignore[arg-type]
            finally:
                await raw.c.aclose()
        async with streamable_http_client(url) as (read, write):
            async with ClientSession(read, write, client_info=ME) as s:
                await s.initialize()
                return await after_cut(s, first)
    finally:
        proc.terminate()
        await proc.wait()
        drain.cancel()


class RawSession:
    """The host's own JSON-RPC over the MCP session it already has (its Mcp-Session-Id), for a host
    that reconnects to the same session after its connection dropped."""

    def __init__(self, httpx: Any, url: str, sid: str) -> None:
        self.c = httpx.AsyncClient(timeout=60)
        self.url, self.n = url, 100
        self.hdr = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                    "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}

    async def call_tool(self, name: str, args: dict[str, Any], **_: Any) -> Any:
        self.n += 1
        r = await self.c.post(self.url, headers=self.hdr, json={
            "jsonrpc": "2.0", "id": self.n, "method": "tools/call", "params": {"name": name, "arguments": args}})
        for msg in messages(r.text):
            if msg.get("id") == self.n:
                return type("Answer", (), {"structured_content": msg["result"]["structuredContent"]})()
        raise RuntimeError(f"no answer ({r.status_code})")


def messages(text: str) -> list[dict[str, Any]]:
    out = []
    for ln in text.splitlines():
        if ln.startswith("data:") or ln.startswith("{"):
            out.append(json.loads(ln.split(":", 1)[1] if ln.startswith("data:") else ln))
    return out


async def after_cut(s: ClientSession, first: dict[str, Any] | None) -> dict[str, Any]:
    """Back after the cut: look the cut call up by its key before anything else (the README)."""
    if first is not None and first["id"] not in KEPT["data"] and first["id"] not in KEPT["tokens"]:
        key = f"{TASK.get('run_id', 'run')}-{first['id']}"
        found = result_of(await s.call_tool("vault_lookup", {"idempotency_key": key, "operation": first["call"]}))
        log("lookup after reconnect:", found.get("category"), found.get("reconciled"))
        if found.get("resume_token"):
            KEPT["tokens"][first["id"]] = found["resume_token"]
        elif found.get("retry") in ("never", "human_required", "after_unlock"):
            # the cut call settled so: a resend is not licensed (not_found says it did not run)
            return {"status": "not_done", "category": found.get("category")}
        elif found.get("retry") == "after_delay":
            await asyncio.sleep(float(found.get("retry_after_s") or 1))
        elif found.get("reconciled") == "found":
            created = (found.get("data") or {}).get("created") or [found.get("data") or {}]
            KEPT["data"][first["id"]] = dict(created[0])
        save()
    return await Host(s).work()


async def cut_call(httpx: Any, url: str, step: dict[str, Any]) -> str:
    key = f"{TASK.get('run_id', 'run')}-{step['id']}"
    hdr = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=5) as c:
        r = await c.post(url, headers=hdr, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "rt43h-host", "version": "1"}}})
        sid = r.headers.get("mcp-session-id")
        hdr = {**hdr, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        await c.post(url, headers=hdr, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        args = {**(step.get("params") or {}), "idempotency_key": key, "wait_s": max(0.0, left() - 3)}
        try:
            r = await asyncio.wait_for(c.post(url, headers=hdr, timeout=30, json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": step["call"], "arguments": args}}), 1.0)
            log("cut call answered before the cut:", r.status_code)
            for msg in messages(r.text):  # an answer that came in time is the call's Result
                if msg.get("id") == 2 and "result" in msg:
                    res = msg["result"].get("structuredContent") or {}
                    if res.get("ok"):
                        KEPT["data"][step["id"]] = dict(res.get("data") or {})
                    elif res.get("resume_token"):
                        KEPT["tokens"][step["id"]] = res["resume_token"]
                    elif res.get("retry") == "never":
                        KEPT["settled"] = res  # a person said no, and the like: the host stops there
                    # anything else (outcome_unknown, rate_limited): looked up by key below
                    save()
        except TimeoutError:
            log("connection lost mid-call")  # leaving the client's block closes the connection
    return str(sid)


def main() -> dict[str, Any]:
    if MODE.startswith("http"):
        return asyncio.run(http())
    out = asyncio.run(stdio())
    if out.get("status") == "restart":  # its bridge has exited: the supervisor starts the host again
        log("supervisor restarts the host")
        os.environ["RT43H_RESTARTED"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
