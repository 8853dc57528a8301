"""Red team 45c: an asyncio agent (Python 3.11+ stdlib), written from docs/agent-contract.md.

Shape: one connection and one session; a reader task matching answers to requests by id
(futures); structured concurrency with asyncio.TaskGroup: each run of consecutive independent
reads (`auto` in the vault's catalog, `mutates: false`, naming no step of the run) goes out as a
task per read under a semaphore, the rest one at a time; the whole task under asyncio.timeout
(cancelled at the deadline's margin, then a final message).

Rules kept (the contract's sections): key RUN:AGENT:STEP on every call and resend (5); a lookup
before anything else after `outcome_unknown`, its category read before its reconciled (6); a
wait resumed until it settles or handed over with its token in state_dir (4, 7); retry_after_s
waited out (4); `never` stops the task, and a batch's siblings are cancelled then (no later step
sent); a restart resumes or looks up what it kept (8); a step naming `${ID.F}` only after ID's
answer (2); the final message last, after every task ended (7).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from typing import Any

REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")
STOPS = {"never", "human_required"}
MAX_ATTEMPTS = 3


class Stop(Exception):
    """The task stops here (not done)."""


class Refused(Exception):
    """A JSON-RPC error: nothing was done."""


def log(s: str) -> None:
    print(f"[rt45c-async] {s}", file=sys.stderr, flush=True)


class Conn:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next = 0

    async def open(self, path: str) -> None:
        pause = 0.05
        while True:
            try:
                self.reader, self.writer = await asyncio.open_unix_connection(path, limit=2 ** 21)
                break
            except BlockingIOError:             # the accept queue is full: back off (3)
                if time.time() + pause > self.deadline - 1:
                    raise
                await asyncio.sleep(pause)
                pause = min(0.5, pause * 2)
        self.pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while line := await self.reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                fut = self.pending.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(Stop("the vault closed the connection"))

    async def rpc(self, method: str, **params: Any) -> dict[str, Any]:
        if time.time() > self.deadline - 0.25:
            raise Stop(f"the deadline came before {method} could be sent")
        self.next += 1
        rid = self.next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self.writer.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
        await self.writer.drain()
        msg = await fut
        if "error" in msg:
            raise Refused(str((msg["error"] or {}).get("message", "error"))[:200])
        res: dict[str, Any] = msg.get("result") or {}
        return res

    async def close(self) -> None:
        self.pump.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


def refs(v: Any) -> set[str]:
    if isinstance(v, str):
        return {m.group(1) for m in REF.finditer(v)}
    if isinstance(v, dict):
        return set().union(set(), *[refs(x) for x in v.values()])
    if isinstance(v, list):
        return set().union(set(), *[refs(x) for x in v])
    return set()


class Agent:
    def __init__(self, task: dict[str, Any]) -> None:
        self.task = task
        self.deadline = float(task["deadline"])
        self.margin = 0.8
        self.state_path = os.path.join(task["state_dir"], "rt45c-async.json")
        os.makedirs(task["state_dir"], exist_ok=True)
        try:
            with open(self.state_path) as f:
                self.state: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            self.state = {}
        self.data: dict[str, dict[str, Any]] = {k: v["data"] for k, v in self.state.items() if "data" in v}
        self.outcome: dict[str, str] = {k: "done" for k in self.data}
        self.waiting: list[str] = []
        self.conn = Conn(self.deadline)
        self.reads = asyncio.Semaphore(4)

    def save(self) -> None:
        tmp = f"{self.state_path}.{os.getpid()}.tmp"        # in state_dir: a rename from /tmp fails (1)
        with open(tmp, "w") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    def left(self) -> float:
        return self.deadline - time.time() - self.margin

    async def nap(self, s: float) -> None:
        await asyncio.sleep(max(0.0, min(s, self.left())))

    def fill(self, v: Any) -> Any:
        if isinstance(v, str):
            def sub(m: re.Match[str]) -> str:
                got = self.data.get(m.group(1), {}).get(m.group(2))
                if got is None:
                    raise Stop(f"step {m.group(1)} gave no {m.group(2)}")
                return str(got)
            return REF.sub(sub, v)
        if isinstance(v, dict):
            return {k: self.fill(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.fill(x) for x in v]
        return v

    async def req(self, method: str, **params: Any) -> dict[str, Any]:
        res = await self.conn.rpc(method, session_id=self.sid, **params)
        log(f"{method} -> {res.get('category')} {res.get('reconciled') or ''}")
        return res

    def wait_s(self) -> float:
        return round(max(0.0, self.left() - 0.3), 2)

    async def lookup(self, ref: dict[str, Any], op: str) -> dict[str, Any]:
        res: dict[str, Any] = {}
        for pause in (0.0, 0.1, 0.2, 0.4):
            if pause:
                if pause > self.left():
                    break
                await self.nap(pause)
            res = await self.req("lookup", operation=op, **ref)
            if res.get("reconciled") in ("found", "not_found") or res.get("resume_token") \
                    or res.get("category") == "rate_limited" or res.get("retry") in STOPS:
                break
        return res

    async def collect(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | str | None:
        token = str(res["resume_token"])
        rec["token"] = token
        self.save()
        while True:
            if self.left() <= 0.4:
                self.waiting.append(f"{step['call']} ({step['id']}) awaits {res.get('owner') or 'its owner'}")
                return "waiting"
            asked, wait = time.time(), self.wait_s()
            try:
                nxt = await self.req("call.resume", resume_token=token, wait_s=wait)
            except Refused:
                rec.pop("token", None)
                self.save()
                return None
            if nxt.get("category") != "approval_pending":
                rec.pop("token", None)
                self.save()
                return nxt
            res = nxt
            if wait > 1 and time.time() - asked < wait / 2:
                await self.nap(0.2)

    def done(self, sid: str, rec: dict[str, Any], data: Any) -> str:
        rec.pop("token", None)
        rec["data"] = data if isinstance(data, dict) else {}
        self.data[sid] = rec["data"]
        self.save()
        return "done"

    async def step(self, step: dict[str, Any]) -> str:
        sid, op = step["id"], step["call"]
        key = f"{self.task['run_id']}:{self.task['agent']}:{sid}"
        rec = self.state.setdefault(sid, {})
        params = self.fill(step.get("params") or {})
        ref: dict[str, Any] = {"idempotency_key": key}
        res: dict[str, Any] | None = None
        if rec.get("token"):
            try:
                res = await self.req("call.resume", resume_token=rec["token"], wait_s=self.wait_s())
            except Refused:
                rec.pop("token", None)
                self.save()
        elif rec.get("sent"):
            res = await self.lookup(ref, op)
        while True:
            if res is None:
                if rec.get("attempts", 0) >= MAX_ATTEMPTS or self.left() <= 0.2:
                    return "failed"
                rec["sent"], rec["attempts"] = True, rec.get("attempts", 0) + 1
                self.save()
                try:
                    res = await self.req("call", operation=op, params=params, idempotency_key=key, wait_s=self.wait_s())
                except Refused as e:
                    log(f"{sid} refused: {e}")
                    return "failed"
            cat, retry, recon = res.get("category"), res.get("retry"), res.get("reconciled")
            nxt: dict[str, Any] | str | None
            if recon is not None and cat == "success":
                if recon == "found":
                    created = (res.get("data") or {}).get("created") or [{}]
                    return self.done(sid, rec, created[0])
                if recon == "not_found":
                    res = None
                    continue
                if res.get("resume_token"):
                    nxt = await self.collect(step, rec, res)
                else:
                    raise Stop(f"{op} ({sid}): outcome unknown; a person must inspect it")
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
                    if after > self.left():
                        raise Stop(f"{op} ({sid}): outcome unknown, no time to look it up again")
                    await self.nap(after)
                    nxt = await self.lookup(ref, op)
                else:
                    if rec.get("attempts", 0) >= MAX_ATTEMPTS or after > self.left() - 0.3:
                        return "failed"
                    await self.nap(after)
                    nxt = None
            elif cat in ("local_failure", "confirmed_failure"):
                if rec.get("attempts", 0) >= MAX_ATTEMPTS:
                    return "failed"
                await self.nap(0.2)
                nxt = None
            elif cat == "vault_locked":
                while (await self.conn.rpc("vault.status")).get("locked", True):
                    if self.left() < 0.5:
                        raise Stop(f"the vault stayed locked; {op} ({sid}) not sent")
                    await self.nap(0.3)
                nxt = None
            else:
                raise Stop(f"{op} ({sid}) answered {cat} ({retry})")
            if isinstance(nxt, str):
                return nxt
            res = nxt

    async def read(self, step: dict[str, Any]) -> None:
        async with self.reads:
            self.outcome[step["id"]] = await self.step(step)

    async def work(self) -> None:
        opened = await self.conn.rpc("session.open", agent=self.task["agent"], run_id=self.task["run_id"],
                                     client={"name": "rt45c-async", "version": "45.0"})
        self.sid = opened["session_id"]
        cat = await self.conn.rpc("catalog")
        ops = {o.get("name"): o for o in cat.get("operations") or [] if isinstance(o, dict)}

        def independent_read(s: dict[str, Any]) -> bool:
            o = ops.get(s["call"]) or {}
            return (o.get("approval") or {}).get("mode") == "auto" and o.get("mutates") is False \
                and not refs(s.get("params")) and not (self.state.get(s["id"]) or {}).get("sent")

        def alike(a: dict[str, Any], b: dict[str, Any]) -> bool:
            return bool(a["call"] == b["call"] and a.get("params") == b.get("params"))

        steps = [s for s in self.task.get("steps") or [] if self.outcome.get(s["id"]) != "done"]
        i = 0
        while i < len(steps) and not self.waiting:
            batch = [steps[i]]
            # two steps alike (one operation, the same parameters): the first is sent first (3)
            while independent_read(batch[0]) and i + len(batch) < len(steps) \
                    and independent_read(steps[i + len(batch)]) \
                    and not any(alike(b, steps[i + len(batch)]) for b in batch):
                batch.append(steps[i + len(batch)])
            i += len(batch)
            if len(batch) == 1:
                s = batch[0]
                if any(self.outcome.get(r) != "done" for r in refs(s.get("params"))):
                    self.outcome[s["id"]] = "failed"
                    continue
                self.outcome[s["id"]] = await self.step(s)
                continue
            async with asyncio.TaskGroup() as tg:   # a Stop in one cancels its siblings
                for s in batch:
                    tg.create_task(self.read(s))

    def message(self) -> str:
        ids = [s["id"] for s in self.task.get("steps") or []]
        if all(self.outcome.get(i) == "done" for i in ids):
            return f"done: {len(ids)} steps"
        if self.waiting:
            return "waiting: " + "; ".join(self.waiting) + " (token kept in state_dir)"
        return "not done: " + ", ".join(i for i in ids if self.outcome.get(i) != "done") + " did not succeed"

    async def main(self) -> str:
        await self.conn.open(os.environ["VAULTSIM_SOCKET"])
        try:
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + self.deadline - time.time() - 0.3):
                await self.work()
            msg = self.message()
        except* TimeoutError:
            msg = "not done: the deadline came first"
        except* Stop as group:
            msg = "not done: " + str(group.exceptions[0])
        except* Refused as group:
            msg = "not done: the vault refused: " + str(group.exceptions[0])
        try:
            if self.left() > -0.5 and hasattr(self, "sid"):
                await asyncio.wait_for(self.conn.rpc("session.close", session_id=self.sid), 0.3)
        except (Exception, asyncio.TimeoutError):
            pass
        await self.conn.close()
        return msg


def main() -> int:
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    print(asyncio.run(Agent(task).main()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
