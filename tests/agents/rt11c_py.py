#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone (red team, eleventh pass).

Python std only. Knobs (environment):
  RT11_MODE    seq (one connection, one request at a time), async1 (asyncio, one connection,
               status/catalog/lookups in flight beside every call), asyncN (asyncio, three
               connections to the process's one session, calls spread over them), fork (every
               step done by a forked worker process that opens its own session; the parent
               waits for it and keeps the state: a session per step, so a step of an operation
               already granted is asked again), fork1 (one forked worker does all the steps)
  RT11_LOOKUP  1: lookup by idempotency key before every mutating call, and by correlation id
               after every approval_pending answer (a wait_s that ran out)
  RT11_LINGER  1: after the work, stay until shortly before the deadline, then finish
  RT11_FINAL   word (default) | json | indent | result | md | emoji | ansi | upper | pending
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import sys
import time
from typing import Any

MODE = os.environ.get("RT11_MODE", "seq")
LOOKUP_FIRST = os.environ.get("RT11_LOOKUP") == "1"
LINGER = os.environ.get("RT11_LINGER") == "1"
FINAL = os.environ.get("RT11_FINAL", "word")

TASK = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
SOCK = os.environ["VAULTSIM_SOCKET"]
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", ""))
AGENT = TASK["agent"]
DEADLINE = float(TASK["deadline"])
STATE_DIR = TASK.get("state_dir")
STATE_FILE = os.path.join(STATE_DIR, "rt11c-state.json") if STATE_DIR else None
CATALOG = TASK.get("catalog", {})
MARGIN = 0.8  # stop this long before the deadline: the answer and the exit must fit
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def log(*a: Any) -> None:
    print("log:", *a, flush=True)


def left() -> float:
    return DEADLINE - time.time()


def load_state() -> dict[str, Any]:
    try:
        with open(STATE_FILE or "", encoding="utf-8") as f:
            doc = json.load(f)
        return {"done": dict(doc.get("done", {})), "pending": dict(doc.get("pending", {}))}
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save_state(state: dict[str, Any]) -> None:
    if not STATE_FILE:
        return
    tmp = STATE_FILE + ".tmp"  # in state_dir itself: a rename from /tmp fails in the jail
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, STATE_FILE)


REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def resolve(value: Any, done: dict[str, Any]) -> Any:
    """Fill ${ID.FIELD} from the data of earlier steps; None when a needed value is missing."""
    if isinstance(value, str):
        missing = False

        def sub(m: re.Match[str]) -> str:
            nonlocal missing
            data = done.get(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data:
                missing = True
                return ""
            return str(data[m.group(2)])
        out = REF.sub(sub, value)
        return None if missing else out
    if isinstance(value, dict):
        res = {}
        for k, v in value.items():
            r = resolve(v, done)
            if r is None and v is not None:
                return None
            res[k] = r
        return res
    if isinstance(value, list):
        items = [resolve(v, done) for v in value]
        return None if any(r is None and v is not None for r, v in zip(items, value)) else items
    return value


# ---- transport: JSON-RPC over the Unix socket, asyncio ------------------------------------

class Conn:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.lock = asyncio.Lock()

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(SOCK, limit=2 ** 21)
        self.task = asyncio.create_task(self.pump())

    async def pump(self) -> None:
        assert self.reader
        while True:
            line = await self.reader.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            fut = self.waiting.pop(msg.get("id"), None) if isinstance(msg, dict) else None
            if fut and not fut.done():
                fut.set_result(msg)
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("vault closed the connection"))

    async def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.writer
        rid = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        async with self.lock:
            self.writer.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                          "params": params}).encode() + b"\n")
            await self.writer.drain()
        return await fut

    async def close(self) -> None:
        if self.writer:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


class Vault:
    """The process's one session; requests spread over `n` connections (the first opened it)."""

    def __init__(self, n: int) -> None:
        self.conns = [Conn() for _ in range(n)]
        self.rr = itertools.cycle(range(n))
        self.sid = ""

    async def open(self) -> None:
        for c in self.conns:
            await c.open()
        ans = await self.conns[0].rpc("session.open", {"agent": AGENT, "run_id": RUN_ID,
                                                      "client": {"name": "rt11c-py"}})
        self.sid = ans["result"]["session_id"]

    async def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        conn = self.conns[next(self.rr)]
        p = dict(params)
        if method not in ("catalog", "vault.status"):
            p["session_id"] = self.sid
        if MODE in ("async1", "asyncN") and method in ("call", "call.resume"):
            # something else in flight beside every call: the status and the catalog
            side = asyncio.gather(self.conns[-1].rpc("vault.status", {}), conn.rpc("catalog", {}))
            ans, _ = await asyncio.gather(conn.rpc(method, p), side)
            return ans
        return await conn.rpc(method, p)

    async def close(self) -> None:
        try:
            await self.conns[0].rpc("session.close", {"session_id": self.sid})
        except (ConnectionError, OSError):
            pass
        for c in reversed(self.conns):
            await c.close()


# ---- the work -----------------------------------------------------------------------------

class Stop(Exception):
    """The task stops here (a `never`, a locked vault past the deadline, an unresolved unknown)."""


class Waiting(Exception):
    """The deadline came while an approval is pending: its token is saved."""


async def lookup_settles(v: Vault, op: str, **by: str) -> tuple[str, dict[str, Any]]:
    """Ask a few times while the remote cannot tell; `unknown` when it still cannot."""
    delay = 0.1
    res: dict[str, Any] = {}
    for _ in range(4):
        if left() < MARGIN + 0.5:
            break
        ans = await v.rpc("lookup", {"operation": op, **by})
        if "error" in ans:
            return "error", {}
        res = ans["result"]
        rec = res.get("reconciled", "unknown")
        if rec in ("found", "not_found"):
            return rec, res
        await asyncio.sleep(delay)
        delay *= 2
    return "unknown", res


def settled_data(res: dict[str, Any]) -> dict[str, Any]:
    created = (res.get("data") or {}).get("created") or []
    return created[0] if created and isinstance(created[0], dict) else {}


async def do_step(v: Vault, step: dict[str, Any], params: dict[str, Any],
                  state: dict[str, Any]) -> dict[str, Any] | None:
    """One logical operation, done at most once: its data, None when it failed (bounded)."""
    sid, op = step["id"], step["call"]
    key = f"{RUN_ID}:{AGENT}:{sid}"
    mutates = CATALOG.get(op, {}).get("mutates", True)
    if LOOKUP_FIRST and mutates and sid not in state["pending"]:
        rec, res = await lookup_settles(v, op, idempotency_key=key)
        log("lookup-before-write", sid, rec)
        if rec == "found":
            return settled_data(res) or dict(res.get("data") or {})
    attempts = 0
    while True:
        if left() < MARGIN + 0.3:
            raise Stop(f"no time left for {sid}")
        wait_s = max(0.0, min(30.0, left() - MARGIN - 0.3))
        pend = state["pending"].get(sid)
        if pend:
            ans = await v.rpc("call.resume", {"resume_token": pend["token"], "wait_s": wait_s})
            if "error" in ans:  # the vault no longer knows it: call the step again, with its key
                state["pending"].pop(sid, None)
                save_state(state)
                continue
        else:
            attempts += 1
            ans = await v.rpc("call", {"operation": op, "params": params, "idempotency_key": key,
                                       "wait_s": wait_s})
            if "error" in ans:
                raise Stop(f"{sid}: error {ans['error'].get('code')}")
        res = ans["result"]
        cat = res.get("category")
        log(sid, cat)
        if cat == "success":
            state["pending"].pop(sid, None)
            return dict(res.get("data") or {})
        if cat == "approval_pending":
            state["pending"][sid] = {"token": res["resume_token"], "op": op}
            save_state(state)
            if LOOKUP_FIRST:
                rec, _ = await lookup_settles(v, op, correlation_id=res["correlation_id"])
                log("lookup-after-wait", sid, rec)
            if left() < MARGIN + 0.5:
                raise Waiting(f"{op} needs approval from {res.get('owner')}")
            continue
        state["pending"].pop(sid, None)
        save_state(state)
        if cat in NEVER:
            raise Stop(f"{sid}: {cat}")
        if cat == "outcome_unknown":
            rec, lres = await lookup_settles(v, op, correlation_id=res["correlation_id"])
            log("lookup", sid, rec)
            if rec == "found":
                return settled_data(lres)
            if rec == "not_found" and attempts < 3:
                continue
            raise Stop(f"{sid}: outcome unknown ({rec})")
        if cat in ("local_failure", "confirmed_failure"):
            if attempts < 3:
                continue
            return None
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 1.0)
            if attempts < 3 and left() > delay + MARGIN + 0.5:
                await asyncio.sleep(delay)
                continue
            raise Stop(f"{sid}: rate limited")
        if cat == "vault_locked":
            while left() > MARGIN + 0.5:
                st = await v.rpc("vault.status", {})
                if not st.get("result", {}).get("locked", True):
                    break
                await asyncio.sleep(0.2)
            else:
                raise Stop(f"{sid}: vault locked")
            continue
        raise Stop(f"{sid}: {cat}")


async def run_steps(state: dict[str, Any], only: str | None = None) -> str:
    """Run the task's steps (or just `only`); the claim: done, not done or waiting."""
    v = Vault(3 if MODE == "asyncN" else 1)
    await v.open()
    failed = False
    try:
        if LOOKUP_FIRST and MODE in ("async1", "asyncN"):
            # every mutating step's key looked up at once, before any write
            keys = [(s["call"], f"{RUN_ID}:{AGENT}:{s['id']}") for s in TASK["steps"]
                    if CATALOG.get(s["call"], {}).get("mutates", True) and s["id"] not in state["done"]]
            found = await asyncio.gather(*(lookup_settles(v, op, idempotency_key=k) for op, k in keys))
            log("lookups", [r for r, _ in found])
        for step in TASK["steps"]:
            if only is not None and step["id"] != only:
                continue
            if step["id"] in state["done"]:
                continue
            params = resolve(step.get("params", {}), state["done"])
            if params is None:
                log("skip", step["id"], "(needs data a failed step did not give)")
                failed = True
                continue
            data = await do_step(v, step, params, state)
            if data is None:
                failed = True
                continue
            state["done"][step["id"]] = data
            save_state(state)
        return "not done" if failed else "done"
    except Waiting as w:
        save_state(state)
        return f"waiting: {w}"
    except Stop as s:
        save_state(state)
        return f"not done: {s}"
    finally:
        await v.close()


def fork_steps(state: dict[str, Any]) -> str:
    """Each step in a forked worker that opens its own session; the parent waits for it."""
    for step in TASK["steps"] if MODE == "fork" else [{"id": None}]:
        if step["id"] in state["done"]:
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                claim = asyncio.run(run_steps(state, only=step["id"]))
                out = json.dumps({"claim": claim, "state": state}).encode()
            except BaseException as e:  # noqa: BLE001 - the parent must hear something
                out = json.dumps({"claim": f"not done: worker {type(e).__name__}", "state": state}).encode()
            os.write(w, out)
            os.close(w)
            os._exit(0)
        os.close(w)
        buf = b""
        while chunk := os.read(r, 65536):
            buf += chunk
        os.close(r)
        os.waitpid(pid, 0)
        got = json.loads(buf or b'{"claim": "not done: worker died"}')
        state.update(got.get("state", state))
        if got["claim"] == "not done":  # that step failed (bounded): later steps may still run
            continue
        if got["claim"] != "done":
            return got["claim"]
    missing = [s["id"] for s in TASK["steps"] if s["id"] not in state["done"]]
    return "not done" if missing else "done"


def final(claim: str) -> None:
    word = claim.split(":")[0].strip()
    status = {"done": "done", "waiting": "waiting"}.get(word, "not_done")
    if FINAL == "json":
        print(json.dumps({"status": status, "message": claim}))
    elif FINAL == "indent":
        print(json.dumps({"status": status, "message": claim, "agent": AGENT}, indent=2))
    elif FINAL == "result":  # a Result-like object: ok decides
        print(json.dumps({"ok": status == "done", "category": "approval_pending" if status == "waiting" else
                          ("success" if status == "done" else "stopped"), "message": claim}))
    elif FINAL == "md":
        print(f"**{word}** — {claim}")
    elif FINAL == "emoji":
        print(f"✅ {claim}" if status == "done" else f"⏳ {claim}" if status == "waiting" else f"❌ {claim}")
    elif FINAL == "ansi":
        print(f"\x1b[1;32m{claim}\x1b[0m")
    elif FINAL == "upper":
        print(claim.upper())
    elif FINAL == "pending":
        print({"done": "Completed.", "waiting": "Awaiting approval.", "not_done": "Stopped."}[status], claim)
    else:
        print(claim)
    sys.stdout.flush()


def main() -> None:
    state = load_state()
    if MODE in ("fork", "fork1"):
        claim = fork_steps(state)
    else:
        claim = asyncio.run(run_steps(state))
    if LINGER:
        rest = left() - 0.4
        if rest > 0:
            time.sleep(rest)
    final(claim)


if __name__ == "__main__":
    main()
