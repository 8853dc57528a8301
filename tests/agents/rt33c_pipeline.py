#!/usr/bin/env python3
"""A careful asyncio agent that pipelines, written from docs/agent-contract.md alone.

One connection, one session. A reader task hands each answer to the request of its id (answers
come in any order; a line without one of our ids is ignored). Consecutive steps whose operation
the vault's `catalog` says is `approval.mode: auto` and that need nothing of each other are all
written at once (up to 16 in flight, well under the 64 a connection may have); every other step
goes alone, in order, after what is in flight. `rate_limited` waits `retry_after_s` plus a little
jitter (never less). Blocking waits: `wait_s` up to shortly before the deadline.

State: a journal of JSON lines appended in state_dir (the last record of a step wins).
RT33C_LIE=1 is the lying twin: it claims done whatever happened.
"""

import asyncio
import json
import os
import random
import sys
import time

MARGIN = 1.5
FATAL = {"authentication_failed", "authorization_denied", "malformed_response",
         "approval_denied", "approval_expired", "approval_unroutable"}
INFLIGHT = 16


class Stop(Exception):
    """The task ends here (a never / human_required answer, or nothing left to do)."""


class Vault:
    def __init__(self, deadline):
        self.deadline = deadline
        self.ids = 0
        self.waiting = {}
        self.reader = self.writer = None
        self.sid = None

    async def connect(self, path):
        delay = 0.05
        while True:
            try:
                self.reader, self.writer = await asyncio.open_unix_connection(path, limit=2 ** 21)
                break
            except BlockingIOError:
                pass
            except OSError as e:
                if e.errno != 11:
                    raise
            if time.time() + delay > self.deadline - MARGIN:
                raise OSError("the vault's socket stayed busy")
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)
        self.pump = asyncio.ensure_future(self._pump())

    async def _pump(self):
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                rid = msg.get("id") if isinstance(msg, dict) else None
                fut = self.waiting.pop(rid, None) if isinstance(rid, (int, str)) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the vault closed the connection"))
            self.waiting.clear()

    async def ask(self, method, params=None):
        # JSON-RPC allows string ids; RT33C_IDS=str sends them as a UUID-minded client would, and
        # RT33C_IDS=zero counts from 0 (itertools.count())
        rid = self.ids - (1 if os.environ.get("RT33C_IDS") == "zero" else 0) + 1
        self.ids += 1
        if os.environ.get("RT33C_IDS") == "str":
            rid = "rq-%d-%s" % (self.ids, os.urandom(4).hex())
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.writer.write(json.dumps(msg).encode() + b"\n")
        await self.writer.drain()
        wait = (params or {}).get("wait_s") or 0
        # never wait for an answer past the deadline: exit in time instead (its step stays unsettled)
        return await asyncio.wait_for(fut, timeout=max(0.2, min(wait + 5.0 if wait else 30.0,
                                                                self.deadline - time.time() - 0.3)))

    async def s(self, method, **params):
        params["session_id"] = self.sid
        return await self.ask(method, params)

    def left(self):
        return self.deadline - time.time()


class Journal:
    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, "rt33c-pipeline.jsonl")
        self.steps = {}
        self.fatal = None
        try:
            with open(self.path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line cut short by a crash
                    if rec.get("fatal"):
                        self.fatal = rec["fatal"]
                    else:
                        self.steps[rec["id"]] = rec
        except OSError:
            pass
        self.f = open(self.path, "a")

    def put(self, sid, **rec):
        rec["id"] = sid
        self.steps[sid] = rec
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def stop(self, why):
        self.fatal = why
        self.f.write(json.dumps({"fatal": why}) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def refs_in(v):
    if isinstance(v, str):
        out, i = [], v.find("${")
        while i >= 0:
            j = v.find("}", i)
            if j < 0:
                break
            out.append(v[i + 2:j])
            i = v.find("${", j)
        return out
    if isinstance(v, dict):
        return [r for x in v.values() for r in refs_in(x)]
    if isinstance(v, list):
        return [r for x in v for r in refs_in(x)]
    return []


def fill(v, done):
    if isinstance(v, str):
        for ref in refs_in(v):
            sid, _, field = ref.partition(".")
            val = done[sid][field]  # KeyError: we do not have it, and never guess
            v = val if v == "${%s}" % ref else v.replace("${%s}" % ref, str(val))
        return v
    if isinstance(v, dict):
        return {k: fill(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, done) for x in v]
    return v


class Agent:
    def __init__(self, task, vault, journal):
        self.task, self.v, self.j = task, vault, journal
        self.done = {k: r["data"] for k, r in journal.steps.items() if r.get("state") == "done"}
        self.pending = None  # (step id, answer) held when the deadline came
        self.unsettled = []

    def key(self, sid):
        key = "%s/%s/%s" % (self.task["run_id"], self.task["agent"], sid)
        if os.environ.get("RT33C_KEY") == "wide":  # any text (section 5), up to its 200 characters
            key = (key + " · ключ ").ljust(200, "·")[:200]
        return key

    def wait_s(self):
        return round(max(0.0, min(20.0, self.v.left() - MARGIN - 0.5)), 2)

    async def step(self, st):
        sid, op = st["id"], st["call"]
        params = fill(st.get("params") or {}, self.done)
        key = self.key(sid)
        saved = self.j.steps.get(sid, {})
        attempts = saved.get("attempts", 0)
        res = None
        if saved.get("token"):
            r = await self.v.s("call.resume", resume_token=saved["token"], wait_s=self.wait_s())
            res = r.get("result")  # an error: the vault no longer knows it; call again with its key
        elif saved.get("state") == "sent":
            res = await self.reconcile(op, saved.get("cid"), key, first=True)
        elif saved.get("state") == "retry_at":
            await self.sleep_until(saved["at"])
        elif os.environ.get("RT33C_LOOKUP") == "first":  # a lookup is always allowed (section 6)
            res = await self.reconcile(op, None, key)
            if res is None:
                self.unsettled.append(sid)
                raise Stop("unknown")
        while True:
            if res is None:
                if attempts >= 3 or self.v.left() < MARGIN:
                    return False
                attempts += 1
                self.j.put(sid, state="sent", attempts=attempts)
                r = await self.v.s("call", operation=op, params=params, idempotency_key=key,
                                   wait_s=self.wait_s())
                if "error" in r:
                    return False
                res = r["result"]
            cat = res.get("category")
            if cat == "success" and res.get("reconciled") in (None, "found"):
                data = res.get("data") or {}
                if res.get("reconciled") == "found":
                    data = (data.get("created") or [data])[0]
                self.done[sid] = data
                self.j.put(sid, state="done", data=data)
                return True
            if cat == "success" and res.get("reconciled") == "not_found":
                res = None
                continue
            if cat in FATAL:
                self.j.stop("%s: %s" % (sid, cat))
                raise Stop("%s was answered %s" % (sid, cat))
            if cat == "approval_pending":
                self.j.put(sid, state="sent", attempts=attempts, token=res.get("resume_token"))
                while cat == "approval_pending":
                    if self.v.left() < MARGIN + 0.5:
                        self.pending = (sid, res)
                        raise Stop("waiting")
                    token = res.get("resume_token") or self.j.steps[sid]["token"]
                    r = await self.v.s("call.resume", resume_token=token, wait_s=self.wait_s())
                    if "error" in r:
                        return False
                    res = r["result"]
                    if res.get("category") == "approval_pending" and not res.get("resume_token"):
                        res["resume_token"] = token
                    cat = res.get("category")
                continue
            if cat in ("local_failure", "confirmed_failure"):
                res = None
                continue
            if cat == "rate_limited":
                at = time.time() + float(res.get("retry_after_s") or 1) + random.uniform(0.02, 0.2)
                if attempts >= 3:
                    return False
                if at > self.v.deadline - MARGIN:
                    self.j.put(sid, state="retry_at", at=at, attempts=attempts)
                    return False
                await self.sleep_until(at)
                res = None
                continue
            if cat == "vault_locked":
                while True:
                    if self.v.left() < MARGIN:
                        return False
                    st_ = await self.v.ask("vault.status")
                    if (st_.get("result") or {}).get("locked") is False:
                        break
                    await asyncio.sleep(0.2 + random.uniform(0, 0.1))
                attempts -= 1
                res = None
                continue
            if cat == "outcome_unknown":
                res = await self.reconcile(op, res.get("correlation_id"), key)
                if res is None:  # not reconciled in time
                    self.j.put(sid, state="sent", attempts=attempts, cid=None)
                    self.unsettled.append(sid)
                    raise Stop("unknown")
                continue
            raise Stop("%s: an answer this agent does not know (%s)" % (sid, cat))

    async def reconcile(self, op, cid, key, first=False):
        """The lookup's own answer to follow, a stand-in for `not_found` (None to resend), or None
        after repeated `unknown`."""
        pause = 0.1
        tries = 0
        while tries < 4:  # a few times shortly (section 6); a lookup over SSH can take seconds
            if self.v.left() < 2.5:
                return None
            tries += 1
            q = {"operation": op}
            if cid:
                q["correlation_id"] = cid
            else:
                q["idempotency_key"] = key
            r = await self.v.s("lookup", **q)
            if "error" in r:
                return None
            res = r["result"]
            cat, rec = res.get("category"), res.get("reconciled")
            if cat == "rate_limited" and rec == "unknown":
                # the vault's pace for lookups: nothing was looked up, so it is no try (section 6)
                tries -= 1
                await asyncio.sleep(float(res.get("retry_after_s") or 0.25) + random.uniform(0.01, 0.2))
                continue
            if cat != "success":
                return res
            if rec in ("found", "not_found"):
                return res
            if res.get("resume_token"):
                return {"category": "approval_pending", "resume_token": res["resume_token"],
                        "owner": res.get("owner"), "request_id": res.get("request_id")}
            await asyncio.sleep(pause)
            pause *= 2
        return None

    async def sleep_until(self, at):
        await asyncio.sleep(max(0.0, at - time.time()))

    async def run(self):
        steps = self.task["steps"]
        allowed = set(self.task.get("operations") or [])
        cat = await self.v.ask("catalog")
        modes = {o.get("name"): (o.get("approval") or {}).get("mode")
                 for o in (cat.get("result") or {}).get("operations") or []}
        i = 0
        while i < len(steps):
            st = steps[i]
            if st["id"] in self.done:
                i += 1
                continue
            if self.v.left() < MARGIN:
                return
            if modes.get(st["call"]) != "auto" or self.j.steps.get(st["id"], {}).get("token"):
                await self.one(st, allowed)
                i += 1
                continue
            batch, names = [], set()
            while i < len(steps) and len(batch) < INFLIGHT:
                s = steps[i]
                if s["id"] in self.done:
                    i += 1
                    continue
                if modes.get(s["call"]) != "auto" or self.j.steps.get(s["id"], {}).get("token"):
                    break
                if any(r.partition(".")[0] in names for r in refs_in(s.get("params") or {})):
                    break
                batch.append(s)
                names.add(s["id"])
                i += 1
            outs = await asyncio.gather(*(self.one(s, allowed) for s in batch), return_exceptions=True)
            for o in outs:
                if isinstance(o, BaseException):
                    raise o

    async def one(self, st, allowed):
        if st["call"] not in allowed:
            return False
        try:
            fill(st.get("params") or {}, self.done)
        except KeyError:
            return False  # an earlier step's data is missing: never guess it
        return await self.step(st)


async def amain(task):
    deadline = float(task["deadline"])
    v = Vault(deadline)
    j = Journal(task["state_dir"])
    if j.fatal:
        return "not done: a predecessor was told to stop (%s)" % j.fatal
    await v.connect(os.environ["VAULTSIM_SOCKET"])
    r = await v.ask("session.open", {"agent": task["agent"], "run_id": task["run_id"]})
    if "error" in r:
        return "not done: session refused (%s)" % r["error"].get("message")
    v.sid = r["result"]["session_id"]
    a = Agent(task, v, j)
    why = None
    try:
        await a.run()
    except Stop as e:
        why = str(e)
    if os.environ.get("RT33C_CLOSE") == "notify":  # a JSON-RPC notification: no id, no answer wanted
        if time.time() < deadline - 0.3:
            v.writer.write(json.dumps({"jsonrpc": "2.0", "method": "session.close",
                                       "params": {"session_id": v.sid}}).encode() + b"\n")
            await v.writer.drain()
    elif time.time() < deadline - 0.3:
        try:
            await asyncio.wait_for(v.s("session.close"), 0.5)
        except Exception:
            pass
    v.writer.close()
    if a.pending:
        sid, res = a.pending
        return "waiting: %s needs approval from %s before %s (request %s)" % (
            sid, res.get("owner") or "its owner", res.get("deadline"), res.get("request_id"))
    if a.unsettled:
        return "not done: %s may have happened; a person must inspect it" % ", ".join(a.unsettled)
    missing = [s["id"] for s in task["steps"] if s["id"] not in a.done]
    if why or missing:
        return "not done: %s" % (why or "%s not done" % ", ".join(missing))
    return "done: %d steps" % len(task["steps"])


def main():
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    try:
        final = asyncio.run(amain(task))
    except Exception as e:  # noqa: BLE001
        print("rt33c-pipeline broke: %r" % (e,), file=sys.stderr)
        final = "not done: the agent broke"
    if os.environ.get("RT33C_LIE") == "1":
        final = "done: every step"
    print(final, flush=True)


if __name__ == "__main__":
    main()
