"""Red team 45c: a careful MCP host over Streamable HTTP (the official `mcp` SDK's
`streamable_http_client` and `ClientSession`), written from the README's MCP section and
docs/agent-contract.md.

As the README says an agent under `vaultsim run --agent` reaches it: it starts its own bridge,
`vaultsim mcp --http 127.0.0.1:0`, with its whole environment (VAULTSIM_SOCKET, _TASK, _RUN_ID),
reads the URL from the bridge's "serving http://..." stderr line (and keeps draining stderr), and
holds ONE MCP session (one vault session) for all its steps. Every tool call carries the step's
key RUN:AGENT:STEP and a `wait_s` ending 3 s before the deadline; `approval_pending` is collected
with `vault_resume` (never the tool again), or handed over with its token kept in state_dir; an
`outcome_unknown` is looked up (`vault_lookup` by correlation id) before anything else, its
category read before its reconciled; `retry_after_s` is waited out; a `never` answer stops the
task; a restart resumes kept tokens or looks up a step it sent. The bridge is its child: ended
(SIGTERM, then SIGKILL) before it exits, which leaves time before the deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

TASK = json.loads(Path(os.environ["VAULTSIM_TASK"]).read_text())
DEADLINE = float(TASK["deadline"])
# the end: close the MCP session, stop the bridge, exit. A wait is collected until 2.8 s before the
# deadline (section 7: an approval given 3 s or more before it is the process's to collect)
KEEP = 2.5
STATE = Path(TASK["state_dir"]) / "rt45c-mcp.json"
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")
STOPS = {"never", "human_required"}


def left() -> float:
    return DEADLINE - time.time() - KEEP


def log(s: str) -> None:
    print(f"[rt45c-mcp] {s}", file=sys.stderr, flush=True)


def load() -> dict[str, Any]:
    try:
        doc = json.loads(STATE.read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def save(state: dict[str, Any]) -> None:
    STATE.parent.mkdir(parents=True, exist_ok=True)
    tmp = STATE.with_name(STATE.name + f".{os.getpid()}.tmp")   # in state_dir: /tmp is another mount (1)
    tmp.write_text(json.dumps(state))
    tmp.replace(STATE)


def fill(v: Any, data: dict[str, Any]) -> Any:
    if isinstance(v, str):
        def one(m: re.Match[str]) -> str:
            got = (data.get(m.group(1)) or {}).get(m.group(2))
            if got is None:
                raise LookupError(m.group(1))
            return str(got)
        return REF.sub(one, v)
    if isinstance(v, dict):
        return {k: fill(x, data) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, data) for x in v]
    return v


def result_of(res: Any) -> dict[str, Any]:
    if getattr(res, "structuredContent", None):
        return dict(res.structuredContent)
    for c in getattr(res, "content", []) or []:
        try:
            got = json.loads(c.text)
            if isinstance(got, dict):
                return got
        except (AttributeError, ValueError):
            continue
    return {"ok": False, "category": "malformed_response", "retry": "never"}


def wait_s() -> float:
    return round(max(0.0, min(40.0, left() - 0.3)), 2)


class Stop(Exception):
    pass


class Host:
    def __init__(self, session: Any, state: dict[str, Any]) -> None:
        self.s, self.state = session, state
        self.waiting: list[str] = []

    async def tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if time.time() > DEADLINE - 0.5:
            raise Stop(f"the deadline came before {name}")
        r = result_of(await self.s.call_tool(name, args))
        log(f"{name} -> {r.get('category')} {r.get('reconciled') or ''}")
        return r

    async def nap(self, s: float) -> None:
        await asyncio.sleep(max(0.0, min(s, left())))

    async def lookup(self, ref: dict[str, Any], op: str) -> dict[str, Any]:
        r: dict[str, Any] = {}
        for pause in (0.0, 0.1, 0.2, 0.4):
            if pause:
                if pause > left():
                    break
                await self.nap(pause)
            r = await self.tool("vault_lookup", {**ref, "operation": op})
            if r.get("reconciled") in ("found", "not_found") or r.get("resume_token") \
                    or r.get("category") == "rate_limited" or r.get("retry") in STOPS:
                break
        return r

    async def collect(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | str | None:
        token = str(res["resume_token"])
        rec["token"] = token
        save(self.state)
        while True:
            if left() <= 0.3:
                self.waiting.append(f"{step['call']} ({step['id']}) awaits {res.get('owner') or 'its owner'}")
                return "waiting"
            asked, w = time.time(), wait_s()
            nxt = await self.tool("vault_resume", {"resume_token": token, "wait_s": w})
            if nxt.get("category") != "approval_pending":
                rec.pop("token", None)
                save(self.state)
                return nxt
            res = nxt
            if w > 1 and time.time() - asked < w / 2:
                await self.nap(0.3)        # the bridge answered early: no resume storm

    def done(self, sid: str, rec: dict[str, Any], data: Any) -> str:
        rec.pop("token", None)
        rec["data"] = data if isinstance(data, dict) else {}
        save(self.state)
        return "done"

    async def step(self, step: dict[str, Any]) -> str:
        sid, op = step["id"], step["call"]
        key = f"{TASK['run_id']}:{TASK['agent']}:{sid}"
        rec = self.state.setdefault(sid, {})
        data = {k: v["data"] for k, v in self.state.items() if isinstance(v, dict) and "data" in v}
        try:
            params = fill(step.get("params") or {}, data)
        except LookupError as e:
            raise Stop(f"step {e} gave no value for {sid}")
        ref: dict[str, Any] = {"idempotency_key": key}
        res: dict[str, Any] | None = None
        if rec.get("token"):
            res = await self.tool("vault_resume", {"resume_token": rec["token"], "wait_s": wait_s()})
            if res.get("category") == "approval_pending" and not res.get("resume_token"):
                res = None
        elif rec.get("sent"):
            res = await self.lookup(ref, op)
        while True:
            if res is None:
                if rec.get("attempts", 0) >= 3 or left() <= 0.2:
                    return "failed"
                rec["sent"], rec["attempts"] = True, rec.get("attempts", 0) + 1
                save(self.state)
                res = await self.tool(op, {**params, "idempotency_key": key, "wait_s": wait_s()})
            cat, retry, recon = res.get("category"), res.get("retry"), res.get("reconciled")
            nxt: dict[str, Any] | str | None
            if recon is not None and cat == "success":
                if recon == "found":
                    created = (res.get("data") or {}).get("created") or [{}]
                    return self.done(sid, rec, created[0])
                if recon == "not_found":
                    res = None
                    continue
                if not res.get("resume_token"):
                    raise Stop(f"{op} ({sid}): outcome unknown; a person must inspect it")
                nxt = await self.collect(step, rec, res)
            elif recon == "unknown" and cat not in ("rate_limited", "approval_pending") and retry not in STOPS:
                if not res.get("resume_token"):
                    raise Stop(f"{op} ({sid}): the lookup failed ({cat}); a person must inspect it")
                nxt = await self.collect(step, rec, res)
            elif cat == "success":
                return self.done(sid, rec, res.get("data"))
            elif cat == "approval_pending":
                nxt = await self.collect(step, rec, res)
            elif retry in STOPS:
                raise Stop(f"{op} ({sid}) answered {cat} (retry: {retry})")
            elif cat == "outcome_unknown":
                ref = {"correlation_id": res.get("correlation_id")}
                nxt = await self.lookup(ref, op)
            elif cat == "rate_limited":
                after = float(res.get("retry_after_s") or 1.0)
                if recon == "unknown":
                    if after > left():
                        raise Stop(f"{op} ({sid}): outcome unknown, no time to look it up again")
                    await self.nap(after)
                    nxt = await self.lookup(ref, op)
                else:
                    if rec.get("attempts", 0) >= 3 or after > left() - 0.3:
                        return "failed"
                    await self.nap(after)
                    nxt = None
            elif cat in ("local_failure", "confirmed_failure"):
                if rec.get("attempts", 0) >= 3:
                    return "failed"
                await self.nap(0.2)
                nxt = None
            else:
                # vault_locked and anything else: a host without vault.status stops (4: "else stop")
                raise Stop(f"{op} ({sid}) answered {cat} ({retry})")
            if isinstance(nxt, str):
                return nxt
            res = nxt


FINAL: dict[str, str] = {}       # the claim, set once the steps are settled (before the teardown)


async def work(url: str) -> str:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import Implementation
    state = load()
    steps = TASK.get("steps") or []
    outcome: dict[str, str] = {s["id"]: "done" for s in steps if "data" in (state.get(s["id"]) or {})}
    async with AsyncExitStack() as stack:
        streams = await stack.enter_async_context(streamable_http_client(url))
        s = await stack.enter_async_context(ClientSession(streams[0], streams[1],
                                            client_info=Implementation(name="rt45c-mcp-host", version="45.0")))
        await s.initialize()
        host = Host(s, state)
        try:
            for st in steps:
                if outcome.get(st["id"]) == "done":
                    continue
                if host.waiting:
                    break
                if any(outcome.get(m.group(1)) != "done" for m in REF.finditer(json.dumps(st.get("params") or {}))):
                    outcome[st["id"]] = "failed"
                    continue
                outcome[st["id"]] = await host.step(st)
        except Stop as e:
            FINAL["final"] = f"not done: {e}"
            return FINAL["final"]
        ids = [st["id"] for st in steps]
        if all(outcome.get(i) == "done" for i in ids):
            FINAL["final"] = f"done: {len(ids)} steps"
        elif host.waiting:
            FINAL["final"] = "waiting: " + "; ".join(host.waiting) + " (token kept in state_dir)"
        else:
            FINAL["final"] = "not done: " + ", ".join(i for i in ids if outcome.get(i) != "done") + " did not succeed"
    return FINAL["final"]


def start_bridge() -> tuple[subprocess.Popen[bytes], str | None]:
    exe = shutil.which("vaultsim") or str(Path(sys.executable).with_name("vaultsim"))
    proc = subprocess.Popen([exe, "mcp", "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:            # read its URL, then keep its stderr flowing (README)
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            m = re.search(r"serving (http://\S+/mcp)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()
    threading.Thread(target=drain, daemon=True).start()
    ready.wait(timeout=max(0.1, left()))
    return proc, (found[0] if found else None)


def end_bridge(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=max(0.2, DEADLINE - time.time() - 1.2))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    try:
        bridge, url = start_bridge()
    except OSError as e:            # no vaultsim to start: still a claim it can stand behind
        print(f"not done: cannot start the MCP bridge ({type(e).__name__})", flush=True)
        os._exit(0)

    def run() -> None:
        try:
            FINAL.setdefault("final", asyncio.run(work(url or "")))
        except Exception as e:   # still a claim it can stand behind
            FINAL.setdefault("final", f"not done: {type(e).__name__}")

    # the work runs in a thread the main one waits on with the deadline: a teardown the SDK
    # shields from cancellation (its closing DELETE) cannot keep the host past its deadline
    final = "not done: the MCP bridge did not start in time"
    if url is not None:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=max(0.5, DEADLINE - time.time() - 1.8))
        final = FINAL.get("final", "not done: the deadline came first")
    end_bridge(bridge)
    print(final, flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
