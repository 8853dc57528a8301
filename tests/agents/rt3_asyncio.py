#!/usr/bin/env python3
"""A careful agent with asyncio, written from docs/agent-contract.md alone.

One connection and one session, many requests in flight at once (answers matched
by id): session.open, catalog and vault.status together; a vault.status heartbeat
beside every waiting call; consecutive read steps (catalog `mutates: false`) that
do not use each other's data sent concurrently. Non-blocking: wait_s 0, then
call.resume with short waits. Final message: `Done.` / `Not done:` / `Waiting:`.
"""
import asyncio
import itertools
import json
import os
import re
import sys
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID") or TASK["run_id"]
AGENT = TASK["agent"]
DEADLINE = float(TASK["deadline"])
STATE = os.path.join(TASK["state_dir"], "asyncio-agent.json")
NEVER = {"authentication_failed", "authorization_denied", "malformed_response",
         "approval_denied", "approval_expired", "approval_unroutable"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def left() -> float:
    return DEADLINE - time.time()


class Stop(Exception):
    def __init__(self, claim, why):
        super().__init__(why)
        self.claim = claim


class Vault:
    def __init__(self, reader, writer):
        self.r, self.w = reader, writer
        self.ids = itertools.count(1)
        self.futs = {}
        self.pump = asyncio.ensure_future(self._pump())
        self.sid = None

    async def _pump(self):
        try:
            while True:
                line = await self.r.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                fut = self.futs.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                if fut and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self.futs.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("vault closed the connection"))

    async def rpc(self, method, **params):
        if left() <= 0:
            raise Stop("not_done", "deadline reached")
        rid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.futs[rid] = fut
        self.w.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
        await self.w.drain()
        msg = await asyncio.wait_for(fut, timeout=max(0.5, left() + 0.5))
        if "error" in msg:
            return {"_error": msg["error"]}
        return msg["result"]


def load():
    try:
        with open(STATE) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save(st):
    with open(STATE + ".tmp", "w") as fh:
        json.dump(st, fh)
    os.replace(STATE + ".tmp", STATE)


def fill(v, done):
    if isinstance(v, str):
        def one(m):
            got = (done.get(m.group(1)) or {}).get(m.group(2))
            if got is None:
                raise Stop("not_done", f"no value for {m.group(0)}")
            return str(got)
        return REF.sub(one, v)
    if isinstance(v, dict):
        return {k: fill(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, done) for x in v]
    return v


async def heartbeat(v):
    while True:
        await asyncio.sleep(0.5)
        if left() < 1:
            return
        await v.rpc("vault.status")


async def step(v, st, s):
    sid, op = s["id"], s["call"]
    params = fill(s.get("params") or {}, st["done"])
    key = f"{RUN_ID}:{AGENT}:{sid}"
    attempts = 0
    token = st["pending"].get(sid)
    while True:
        if token:
            res = await v.rpc("call.resume", session_id=v.sid, resume_token=token,
                              wait_s=max(0.0, min(0.5, left() - 3)))
            if "_error" in res:
                token = None
                st["pending"].pop(sid, None)
                save(st)
                continue
        else:
            if attempts >= 3:
                raise Stop("not_done", f"{sid}: three attempts failed")
            attempts += 1
            res = await v.rpc("call", session_id=v.sid, operation=op, params=params,
                              idempotency_key=key, wait_s=0)
            if "_error" in res:
                raise Stop("not_done", f"{sid}: refused: {res['_error'].get('message')}")
        cat = res["category"]
        print(f"[asyncio-agent] {sid} {op}: {cat}", file=sys.stderr, flush=True)
        if cat == "success":
            st["done"][sid] = res.get("data") or {}
            st["pending"].pop(sid, None)
            save(st)
            return
        if cat in NEVER:
            st["pending"].pop(sid, None)
            save(st)
            raise Stop("not_done", f"{sid}: {cat}")
        token = None
        if cat in ("local_failure", "confirmed_failure"):
            continue
        if cat == "rate_limited":
            d = float(res.get("retry_after_s") or 1)
            if attempts >= 3 or left() < d + 1:
                raise Stop("not_done", f"{sid}: rate limited")
            await asyncio.sleep(d)
            continue
        if cat == "vault_locked":
            while not (await v.rpc("vault.status")).get("locked") is False:
                if left() < 1.5:
                    raise Stop("not_done", f"{sid}: locked")
                await asyncio.sleep(0.2)
            continue
        if cat == "outcome_unknown":
            for pause in (0, 0.1, 0.2, 0.4):
                await asyncio.sleep(pause)
                lk = await v.rpc("lookup", session_id=v.sid, correlation_id=res["correlation_id"])
                rec = lk.get("reconciled", "error")
                if rec != "unknown":
                    break
            if rec == "found":
                st["done"][sid] = ((lk.get("data") or {}).get("created") or [{}])[0]
                save(st)
                return
            if rec != "not_found":
                raise Stop("not_done", f"{sid}: outcome unknown ({rec})")
            continue
        if cat == "approval_pending":
            token = res["resume_token"]
            st["pending"][sid] = token
            save(st)
            if left() < 3.5:
                raise Stop("waiting", f"{sid}: {op} awaits {res.get('owner')} (request {res.get('request_id')})")
            continue
        raise Stop("not_done", f"{sid}: {cat}")


def batches(steps, catalog):
    """Consecutive reads that do not refer to each other, grouped."""
    group = []
    for s in steps:
        entry = catalog.get(s["call"]) or {}
        refs = {m.group(1) for m in REF.finditer(json.dumps(s.get("params") or {}))}
        read = entry.get("mutates") is False
        if group and read and all(g["_read"] for g in group) and not refs & {g["id"] for g in group}:
            group.append({**s, "_read": read})
            continue
        if group:
            yield group
        group = [{**s, "_read": read}]
    if group:
        yield group


async def main():
    st = load()
    r, w = await asyncio.open_unix_connection(os.environ["VAULTSIM_SOCKET"], limit=2 ** 21)
    v = Vault(r, w)
    opened, cat, status = await asyncio.gather(
        v.rpc("session.open", agent=AGENT, run_id=RUN_ID, client={"name": "asyncio-agent"}),
        v.rpc("catalog"), v.rpc("vault.status"))
    if "_error" in opened:
        raise Stop("not_done", "session.open refused")
    v.sid = opened["session_id"]
    hb = asyncio.ensure_future(heartbeat(v))
    try:
        for s in TASK["steps"]:
            if s["call"] not in TASK["operations"]:
                raise Stop("not_done", f"{s['id']}: {s['call']} not allowed")
        todo = [s for s in TASK["steps"] if s["id"] not in st["done"]]
        for group in batches(todo, TASK.get("catalog") or {}):
            results = await asyncio.gather(*(step(v, st, s) for s in group), return_exceptions=True)
            for x in results:
                if isinstance(x, BaseException):
                    raise x
        await v.rpc("session.close", session_id=v.sid)
    finally:
        hb.cancel()
        w.close()
    return f"Done. {len(TASK['steps'])} steps"


try:
    print(asyncio.run(main()), flush=True)
except Stop as e:
    print(("Waiting: " if e.claim == "waiting" else "Not done: ") + str(e), flush=True)
except Exception as e:  # honest about anything unforeseen
    print(f"Not done: {type(e).__name__}: {e}", flush=True)
