"""Red team 31 (careful, reconciliation): an asyncio agent written from docs/agent-contract.md
alone (stdlib, no project import), doing only what sections 4-6 and 8 allow.

Habits: one asyncio connection and session, answers matched by id in a reader task; a key per
step `RUN:AGENT:STEP` kept on every resend; exponential backoff with full jitter between
attempts (never less than a 429's retry_after_s) and between lookups that answer `unknown`
(about 0.1, 0.2, 0.4 s, then stop); a lookup's category read before its reconciled; a state file
in state_dir written before each call (the step's key) and after each answer (its correlation id,
its data), so a restart carries on. RT31C (an environment variable) picks a habit:

  async       the above
  crash       the first process (agent_index 0) dies (exit 3, no final message) as soon as a call
              is answered anything but success, having kept its correlation id; the restart
              reconciles it: a lookup by that id, then as the lookup says (found: done with
              created[0]; not_found: the step again under its key; unknown with a resume_token:
              call.resume; unknown: a few more lookups, then stop)
  crash_same_key  as crash; after an outcome_unknown of an operation whose catalog says
              idempotent: true, the restart sends the step again under its key, as its
              reconciliation, with no lookup (section 4)
  resume_by_lookup  at approval_pending, keeps only the call's correlation id (not its token); a
              restart learns the token from a lookup (`unknown`, with resume_token) and collects it
              with call.resume
  reconnect   a call first sent with wait_s 0.3; answered approval_pending, its connection is
              closed (its session ends: a client's connection cut) and a new one opened, whose
              session looks the call up (`unknown`, with a resume_token) and collects it with
              call.resume (section 6)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
import time

HABIT = os.environ.get("RT31C", "async")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", TASK["run_id"])
DEADLINE = float(TASK["deadline"])
AGENT = TASK["agent"]
FIRST = int(TASK.get("agent_index", 0)) == 0
STATE = os.path.join(TASK["state_dir"], "rt31c.json")
NEVER = {"never", "human_required"}
ATTEMPTS = 3


def left() -> float:
    return DEADLINE - time.time()


def backoff(n: int, floor: float = 0.0) -> float:
    """Full jitter on 0.1 * 2**n, never under `floor` (a 429's retry_after_s)."""
    return max(floor, random.uniform(0.05, 0.1 * 2 ** n))


class Vault:
    def __init__(self) -> None:
        self.n = 0
        self.waiting: dict[int, asyncio.Future] = {}
        self.sid = ""
        self.cut = False

    async def reopen(self) -> None:
        """A new connection and session; the old connection's end ends its session."""
        self.cut = True
        self.w.close()
        await self.w.wait_closed()
        self.reader.cancel()
        self.sid = ""
        await self.open()

    async def open(self) -> None:
        self.r, self.w = await asyncio.open_unix_connection(os.environ["VAULTSIM_SOCKET"], limit=2 ** 21)
        self.reader = asyncio.create_task(self._read())
        self.sid = (await self.rpc("session.open", agent=AGENT, run_id=RUN_ID))["session_id"]

    async def _read(self) -> None:
        while line := await self.r.readline():
            msg = json.loads(line)
            fut = self.waiting.pop(msg.get("id"), None) if isinstance(msg.get("id"), int) else None
            if fut is not None and not fut.done():
                fut.set_result(msg)
        for fut in self.waiting.values():
            fut.set_result({"error": {"message": "connection closed"}})

    async def rpc(self, method: str, **params: object) -> dict:
        self.n += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.n] = fut
        if self.sid:
            params = {"session_id": self.sid, **params}
        self.w.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n")
        await self.w.drain()
        msg = await fut
        return msg.get("result") or {"ok": False, "category": "rpc_error", "retry": "never",
                                     "message": str((msg.get("error") or {}).get("message"))}


def load() -> dict:
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"done": {}, "open": {}, "stopped": {}}


def save(st: dict) -> None:
    with open(STATE + ".tmp", "w") as f:  # in state_dir itself: a rename from /tmp fails in the jail
        json.dump(st, f)
    os.replace(STATE + ".tmp", STATE)


def fill(v: object, done: dict) -> object:
    if not isinstance(v, str):
        return v
    return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)][m.group(2)]), v)


def wait_s() -> float:
    return max(0.0, min(30.0, left() - 1.5))


class Step:
    def __init__(self, v: Vault, st: dict, step: dict) -> None:
        self.v, self.st, self.step = v, st, step
        self.id, self.op = step["id"], step["call"]
        self.params = {k: fill(p, st["done"]) for k, p in step.get("params", {}).items()}
        self.key = f"{RUN_ID}:{AGENT}:{self.id}"
        self.attempts = 0

    def keep(self, r: dict) -> None:
        """The answer's correlation id, kept before anything else is done with it."""
        if r.get("correlation_id") and r.get("category") != "success":
            self.st["open"][self.id] = {"cid": r["correlation_id"], "category": r.get("category")}
            save(self.st)
            if HABIT.startswith("crash") and FIRST:
                os._exit(3)

    async def send(self) -> dict:
        self.attempts += 1
        cut = HABIT == "reconnect" and not self.v.cut
        r = await self.v.rpc("call", operation=self.op, params=self.params, idempotency_key=self.key,
                             wait_s=min(0.3, wait_s()) if cut else wait_s())
        if cut and r.get("category") == "approval_pending":
            await self.v.reopen()
            lk = await self.v.rpc("lookup", correlation_id=r["correlation_id"])
            if lk.get("resume_token"):
                r = await self.v.rpc("call.resume", resume_token=lk["resume_token"], wait_s=wait_s())
        return await self.collect(r)

    async def collect(self, r: dict) -> dict:
        while r.get("category") == "approval_pending" and left() > 2.0:
            if HABIT != "resume_by_lookup":
                self.st["open"][self.id] = {"cid": r["correlation_id"], "token": r["resume_token"]}
                save(self.st)
            r = await self.v.rpc("call.resume", resume_token=r["resume_token"], wait_s=wait_s())
        if r.get("category") == "approval_pending" and HABIT == "resume_by_lookup":
            self.st["open"][self.id] = {"cid": r["correlation_id"]}
            save(self.st)
            return r
        self.keep(r)
        return r

    async def lookup(self, cid: str) -> dict:
        lk: dict = {}
        for n in range(4):
            lk = await self.v.rpc("lookup", correlation_id=cid)
            if lk.get("reconciled") != "unknown" or lk.get("resume_token") or left() < 2.0:
                return lk
            await asyncio.sleep(backoff(n))
        return lk

    def done(self, data: dict) -> str:
        self.st["done"][self.id] = data
        self.st["open"].pop(self.id, None)
        save(self.st)
        return ""

    async def run(self) -> str:
        """'' when done, else why it stopped ('WAITING …' for a handed-over approval)."""
        kept = self.st["open"].get(self.id)
        if kept and kept.get("token"):
            r = await self.collect(await self.v.rpc("call.resume", resume_token=kept["token"], wait_s=wait_s()))
            if r.get("category") == "rpc_error":  # the vault no longer knows it: the step again, its key
                r = await self.send()
        elif kept and HABIT == "crash_same_key" and kept.get("category") == "outcome_unknown" \
                and TASK["catalog"].get(self.op, {}).get("idempotent"):
            self.attempts = 1
            r = await self.send()
        elif kept:
            self.attempts = 1
            r = {"category": "outcome_unknown", "correlation_id": kept["cid"], "retry": "reconcile_first"}
        else:
            r = await self.send()
        while True:
            cat, retry = r.get("category"), r.get("retry")
            if cat == "success":
                return self.done(r.get("data") or {})
            if cat == "approval_pending":
                return f"WAITING {self.op} needs approval (request {r.get('request_id')})"
            if cat == "outcome_unknown":
                lk = await self.lookup(r["correlation_id"])
                lcat, said = lk.get("category"), lk.get("reconciled")
                if lk.get("retry") in NEVER:  # the lookup tells a refusal first (section 6)
                    return f"{self.id}: {lcat}"
                if said == "unknown" and lk.get("resume_token"):
                    r = await self.collect(await self.v.rpc("call.resume", resume_token=lk["resume_token"],
                                                            wait_s=wait_s()))
                    continue
                if said == "found" and lcat == "success":
                    created = (lk.get("data") or {}).get("created") or [{}]
                    return self.done(created[0])
                if said == "not_found" and self.attempts < ATTEMPTS:
                    pause = backoff(self.attempts, float(lk.get("retry_after_s") or 0.0))
                    if left() > pause + 2.5:
                        await asyncio.sleep(pause)
                        r = await self.send()
                        continue
                return f"{self.id}: outcome {said or 'unknown'}: a person must inspect it"
            if retry in NEVER or cat == "rpc_error":
                self.st["stopped"][self.id] = cat
                save(self.st)
                return f"{self.id}: {cat}"
            if retry not in ("bounded", "after_delay") or self.attempts >= ATTEMPTS:
                return f"{self.id}: {cat} after {self.attempts} attempts"
            pause = backoff(self.attempts, float(r.get("retry_after_s") or 0.0))
            if left() < pause + 2.5:
                return f"{self.id}: {cat}, no time left to send it again"
            await asyncio.sleep(pause)
            r = await self.send()


async def main() -> str:
    st = load()
    if st["stopped"]:
        return f"not done: {next(iter(st['stopped'].items()))} (before the restart)"
    v = Vault()
    await v.open()
    for step in TASK["steps"]:
        if step["id"] in st["done"]:
            continue
        why = await Step(v, st, step).run()
        if why.startswith("WAITING"):
            return "waiting: " + why[8:]
        if why:
            return "not done: " + why
    return f"done: {len(TASK['steps'])} steps"


if __name__ == "__main__":
    print(asyncio.run(main()))
    sys.exit(0)
