#!/usr/bin/env python3
"""A careful asyncio agent written from docs/agent-contract.md alone (stdlib only).

One process, one connection, one session (§3); answers matched to requests by id by a reader
task, so several requests may be in flight on the connection. A journal in state_dir (replaced by
a rename inside state_dir, §1) keeps finished steps with their data and pending approvals with
their tokens, for a restart (§8).

Knobs (environment), each a behaviour the contract allows:
  RT26_CONC=1      consecutive steps whose operation the vault's `catalog` says is a read approved
                   without asking (`approval.mode: auto`, `mutates: false`) and that need no data
                   of each other are sent at once with asyncio.gather on the one session (their
                   lines in one write); gated steps one at a time, in order (§3); `session.open`,
                   `vault.status` and `catalog` asked for at once as it starts
  RT26_WAIT=poll   `wait_s: 0` on every call and resume, the decision collected with `call.resume`
                   (also `wait_s: 0`) after a backoff of 0.1 s doubling to 1 s (§3)
  RT26_PRECHECK=1  `vault.status` and `catalog` first; a step whose operation the vault's catalog
                   does not list, or the task's `operations` does not allow, is skipped (not done)
  RT26_LATE=S      compute (a busy loop) for S seconds before opening the session
  RT26_RECONNECT=1 after the first finished step the connection is dropped and a new connection
                   and session opened (the old session ends with its connection, §3)
  RT26_RECONNECT=pending  the same at the first approval_pending, the pending call then collected
                   with `call.resume` from the new session (§6: "the same agent and run only")
  RT26_FINAL=...   plain | json | kv (`status: done` then more `key: value` lines) | table (a
                   Markdown key-value table, its Status row last) | logger (Python logging's format)
  RT26_BOTH=1      the final message on stderr too (a logger's handler)
  RT26_NOISE=1     what a real logger adds after the message: an SGR reset on a line of its own,
                   trailing blanks, CRLF, an empty line
  RT26_GOON=1      the careless twin: after a refusal for good (§4 `never`) it goes on with the
                   later steps, one at a time (a FAIL_RECOVERY)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
STATE = TASK["state_dir"]
JOURNAL = os.path.join(STATE, "rt26c-journal.json")
ALLOWED = set(TASK.get("operations") or [])
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable", "rpc_error"}
KNOB = {k: os.environ.get(f"RT26_{k}", "") for k in ("CONC", "WAIT", "PRECHECK", "LATE", "RECONNECT",
                                                      "FINAL", "BOTH", "NOISE", "GOON")}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def log(*parts: object) -> None:
    print(f"{time.strftime('%H:%M:%S')} rt26c:", *parts, file=sys.stderr, flush=True)


def left() -> float:
    return DEADLINE - time.time()


def load() -> dict:
    try:
        with open(JOURNAL, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"steps": {}}


def save(journal: dict) -> None:
    tmp = JOURNAL + ".tmp"  # in state_dir itself: a rename from /tmp fails in the jail (EXDEV)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(journal, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, JOURNAL)


class Vault:
    """One connection; a reader task hands each answer to the request with its id."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.waiting: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.task: asyncio.Task | None = None
        self.sid: str | None = None
        self.corked: list[bytes] | None = None  # lines held to be written together (a batch)

    async def open(self) -> str | None:
        await self.connect()
        return await self.open_session()

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(os.environ["VAULTSIM_SOCKET"],
                                                                      limit=2 ** 21)
        self.task = asyncio.ensure_future(self._read())

    async def open_session(self) -> str | None:
        got = await self.rpc("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"]})
        self.sid = got.get("session_id")
        return self.sid

    async def _read(self) -> None:
        assert self.reader is not None
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                fut = self.waiting.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the vault closed the connection"))
            self.waiting.clear()

    async def rpc(self, method: str, params: dict) -> dict:
        assert self.writer is not None
        if left() <= 0:
            return {"ok": False, "category": "deadline", "message": "past the deadline"}
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = fut
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if self.corked is not None:
            self.corked.append(line.encode() + b"\n")
        else:
            self.writer.write(line.encode() + b"\n")
            await self.writer.drain()
        msg = await fut
        if "error" in msg:
            return {"ok": False, "category": "rpc_error", "retry": "never", "message": str(msg["error"])}
        return msg.get("result") or {}

    def cork(self) -> None:
        """Hold the lines of the requests sent from now on, until uncork writes them at once."""
        self.corked = []

    def uncork(self) -> None:
        lines, self.corked = self.corked or [], None
        if lines and self.writer is not None:
            self.writer.write(b"".join(lines))

    async def close(self, polite: bool = True) -> None:
        if polite and self.sid and left() > 0.3:
            try:
                await asyncio.wait_for(self.rpc("session.close", {"session_id": self.sid}), left() - 0.2)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                pass
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()


def substitute(value: object, done: dict) -> object:
    if isinstance(value, str):
        def one(m: re.Match) -> str:
            data = done.get(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data:
                raise KeyError(m.group(0))
            return str(data[m.group(2)])
        return REF.sub(one, value)
    if isinstance(value, dict):
        return {k: substitute(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, done) for v in value]
    return value


def refs(value: object) -> set[str]:
    return {m.group(1) for m in REF.finditer(json.dumps(value))}


def created_data(result: dict) -> dict:
    data = result.get("data") or {}
    created = data.get("created") if isinstance(data, dict) else None
    return created[0] if isinstance(created, list) and created and isinstance(created[0], dict) else {}


class Agent:
    def __init__(self) -> None:
        self.journal = load()
        self.steps: dict = self.journal["steps"]
        self.vault = Vault()
        self.modes: dict[str, dict] = {}
        self.reconnected = False

    def wait_s(self) -> float:
        if KNOB["WAIT"] == "poll":
            return 0.0
        return max(0.0, min(5.0, left() - 1.2))

    async def call(self, op: str, params: dict, key: str) -> dict:
        return await self.vault.rpc("call", {"session_id": self.vault.sid, "operation": op, "params": params,
                                             "idempotency_key": key, "wait_s": self.wait_s()})

    async def collect(self, token: str, first: dict | None = None) -> dict:
        """call.resume until the call settles or the deadline is near (§4 approval_pending)."""
        result = first or {"category": "approval_pending", "resume_token": token}
        pause = 0.1
        while result.get("category") == "approval_pending" and left() > 1.2:
            if KNOB["WAIT"] == "poll":
                await asyncio.sleep(min(pause, max(0.0, left() - 1.2)))
                pause = min(1.0, pause * 2)
                if left() <= 1.2:
                    break
            result = await self.vault.rpc("call.resume", {"session_id": self.vault.sid, "resume_token": token,
                                                          "wait_s": self.wait_s()})
        if result.get("category") == "approval_pending":
            result.setdefault("resume_token", token)
        return result

    async def reconcile(self, op: str, by: dict) -> dict:
        for pause in (0.0, 0.1, 0.2, 0.4):
            await asyncio.sleep(pause)
            if left() < 1.0:
                break
            result = await self.vault.rpc("lookup", {"session_id": self.vault.sid, "operation": op, **by})
            if result.get("category") not in ("success", None):
                return result  # the call's own answer again: read before `reconciled` (§6)
            if result.get("reconciled") == "found":
                return {**result, "category": "success", "found": True}
            if result.get("reconciled") == "not_found":
                return {**result, "category": "local_failure"}
            if result.get("resume_token"):
                return {**result, "category": "approval_pending"}
        return {"category": "outcome_unknown", "reconciled": "unknown"}

    async def settle(self, step: dict, params: dict, presaved: bool = False) -> dict:
        """One logical call of a step, from wherever a predecessor left it, to its settled result.
        `presaved`: the batch's first attempts were marked sent in one save, so its calls are
        written together (an fsync between them would space them out)."""
        sid_, op = step["id"], step["call"]
        key = f"{TASK['run_id']}:{TASK['agent']}:{sid_}"
        entry = self.steps.get(sid_, {})
        attempts = int(entry.get("attempts", 0)) - (1 if presaved else 0)
        result: dict | None = None
        if entry.get("state") == "pending" and entry.get("token"):
            result = await self.collect(entry["token"])
            if result.get("category") == "rpc_error":
                result = None  # the vault no longer knows the token: call the step again, with its key (§8)
        while True:
            if result is None:
                if left() < 0.8:
                    return {"category": "deadline"}
                attempts += 1
                if not presaved:
                    self.steps[sid_] = {"state": "sent", "attempts": attempts}
                    save(self.journal)
                presaved = False
                result = await self.call(op, params, key)
            cat = result.get("category")
            if cat == "approval_pending" and result.get("resume_token"):
                self.steps[sid_] = {"state": "pending", "token": result["resume_token"], "attempts": attempts}
                save(self.journal)
                if KNOB["RECONNECT"] == "pending" and not self.reconnected:
                    await self.reconnect()  # the token is the agent's (name and run), not the session's
                result = await self.collect(result["resume_token"], first=result)
                if result.get("category") == "approval_pending":
                    return result
                continue
            if cat == "outcome_unknown" and result.get("correlation_id"):
                result = await self.reconcile(op, {"correlation_id": result["correlation_id"]})
                if result.get("category") == "local_failure" and attempts >= 3:
                    return result
                if result.get("category") == "local_failure":
                    result = None
                continue
            if cat == "vault_locked":
                while left() > 1.0 and (await self.vault.rpc("vault.status", {})).get("locked", True):
                    await asyncio.sleep(0.2)
                if left() <= 1.0:
                    return result
                result = None
                continue
            if cat in ("local_failure", "confirmed_failure", "rate_limited"):
                if attempts >= 3:
                    return result
                if cat == "rate_limited":
                    delay = float(result.get("retry_after_s") or 1.0)
                    if delay >= left() - 0.8:
                        return result
                    await asyncio.sleep(delay)
                result = None
                continue
            return result

    def record(self, step: dict, result: dict) -> str:
        """Keep a settled step's outcome; answer what to do next: go, stop or wait."""
        sid_, op, cat = step["id"], step["call"], result.get("category")
        if cat == "success":
            data = created_data(result) if result.get("found") else result.get("data")
            self.steps[sid_] = {"state": "done", "data": data if isinstance(data, dict) else {}}
            save(self.journal)
            return "go"
        if cat == "approval_pending":
            self.journal["waiting"] = (f"{op} needs approval from {result.get('owner')} "
                                       f"(request {result.get('request_id')})")
            save(self.journal)
            return "wait"
        self.steps[sid_] = {"state": "stopped", "why": f"{op}: {cat}"}
        save(self.journal)
        if cat in ("local_failure", "confirmed_failure"):
            return "go"  # bounded, past its attempts: later steps needing none of its data may run
        self.journal["stopped"] = f"{op}: {cat}"
        save(self.journal)
        return "go" if KNOB["GOON"] == "1" and cat in NEVER else "stop"

    def parallel_ok(self, step: dict) -> bool:
        entry = self.modes.get(step["call"], {})
        return (KNOB["CONC"] == "1" and entry.get("mutates") is False
                and (entry.get("approval") or {}).get("mode") == "auto")

    async def run(self) -> None:
        late = float(KNOB["LATE"] or 0)
        if late:
            end = time.time() + late
            n = 0
            while time.time() < end:  # "computing" before the session is opened
                n = (n * 31 + 7) % 1000003
        status: dict = {}
        cat: dict = {}
        if KNOB["CONC"] == "1":
            # the session, the vault's status and its catalog asked for at once on one connection
            await self.vault.connect()
            sid, status, cat = await asyncio.gather(self.vault.open_session(), self.vault.rpc("vault.status", {}),
                                                    self.vault.rpc("catalog", {}))
        else:
            sid = await self.vault.open()
            if sid is not None and KNOB["PRECHECK"] == "1":
                status = await self.vault.rpc("vault.status", {})
                cat = await self.vault.rpc("catalog", {})
        if sid is None:
            self.journal["stopped"] = "no session"
            return
        log("vault locked:", status.get("locked"))
        self.modes = {o.get("name"): o for o in cat.get("operations") or [] if isinstance(o, dict)}
        done = {k: v.get("data") for k, v in self.steps.items() if v.get("state") == "done"}
        todo = list(TASK["steps"])
        i = 0
        while i < len(todo):
            step = todo[i]
            entry = self.steps.get(step["id"], {})
            if entry.get("state") == "done":
                i += 1
                continue
            if entry.get("state") == "stopped":
                if entry.get("why", "").endswith(("local_failure", "confirmed_failure", "skipped")):
                    i += 1
                    continue
                self.journal["stopped"] = entry.get("why", "stopped")
                return
            if step["call"] not in ALLOWED or (KNOB["PRECHECK"] == "1" and step["call"] not in self.modes):
                log("skipping", step["id"], step["call"], "the catalog does not allow it")
                self.steps[step["id"]] = {"state": "stopped", "why": f"{step['call']}: not allowed, skipped"}
                save(self.journal)
                i += 1
                continue
            batch = [step]
            if self.parallel_ok(step) and entry.get("state") != "pending":
                j = i + 1
                while j < len(todo) and self.parallel_ok(todo[j]) and \
                        not self.steps.get(todo[j]["id"]) and not refs(todo[j].get("params")) & {s["id"] for s in batch}:
                    batch.append(todo[j])
                    j += 1
            prepared = []
            for s in batch:
                try:
                    prepared.append((s, substitute(s.get("params", {}), done)))
                except KeyError as missing:
                    self.steps[s["id"]] = {"state": "stopped", "why": f"no data for {missing}: skipped"}
                    save(self.journal)
            if len(prepared) > 1:
                log("sending at once:", [s["id"] for s, _ in prepared])
            batched = len(prepared) > 1
            if batched:
                for s, _ in prepared:
                    self.steps[s["id"]] = {"state": "sent", "attempts": 1}
                save(self.journal)
            if batched:
                # the batch's requests in one write: sent one by one, a loaded host could run this
                # process next only after the vault had answered the first (a second read sent after
                # a refusal, as the vault sees it). Each task writes in its first step, which the
                # loop runs before a callback queued after the tasks were made.
                self.vault.cork()
            gathered = asyncio.gather(*(self.settle(s, p, presaved=batched) for s, p in prepared))
            if batched:
                asyncio.get_running_loop().call_soon(self.vault.uncork)
            results = await gathered
            verdicts = [self.record(s, r) for (s, _), r in zip(prepared, results)]
            for s, _ in prepared:
                if self.steps.get(s["id"], {}).get("state") == "done":
                    done[s["id"]] = self.steps[s["id"]]["data"]
            if "stop" in verdicts or "wait" in verdicts:
                return
            i += len(batch)
            if KNOB["RECONNECT"] == "1" and not self.reconnected:
                if not await self.reconnect():
                    self.journal["stopped"] = "no session after reconnecting"
                    return

    async def reconnect(self) -> bool:
        self.reconnected = True
        log("dropping the connection and opening a new session")
        await self.vault.close(polite=False)
        self.vault = Vault()
        return await self.vault.open() is not None

    def final(self) -> tuple[str, str]:
        states = [self.steps.get(s["id"], {}).get("state") for s in TASK["steps"]]
        n = sum(1 for s in states if s == "done")
        if n == len(states):
            return "done", f"all {n} steps succeeded"
        if "pending" in states and "waiting" in self.journal:
            return "waiting", self.journal["waiting"]
        return "not done", f"{n} of {len(states)} steps done; {self.journal.get('stopped', 'stopped')}"


def show(word: str, why: str) -> None:
    form = KNOB["FINAL"] or "plain"
    if form == "json":
        lines = [json.dumps({"status": word.replace(" ", "_"), "message": why})]
    elif form == "kv":
        lines = [f"status: {word}", f"detail: {why}", f"agent: {TASK['agent']}"]
    elif form == "table":
        # §7 reads a two-cell `| Status | … |` row as a key-value table's last row
        lines = ["| field | value |", "| --- | --- |", f"| Detail | {why} |", f"| Status | {word} |"]
    elif form == "logger":
        stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ",123"
        lines = [f"{stamp} {'INFO' if word == 'done' else 'WARNING'} {word}: {why}"]
    else:
        lines = [f"{word}: {why}"]
    out = "\n".join(lines)
    if KNOB["NOISE"] == "1":
        out = f"\x1b[1m{out}\x1b[0m   \r\n\x1b[0m\n\n"
    else:
        out += "\n"
    if KNOB["BOTH"] == "1":
        sys.stderr.write(out)
        sys.stderr.flush()
    sys.stdout.write(out)
    sys.stdout.flush()


async def main() -> None:
    agent = Agent()
    try:
        await asyncio.wait_for(agent.run(), max(0.1, left() - 0.3))
    except (asyncio.TimeoutError, ConnectionError, OSError) as e:
        log("stopped:", type(e).__name__, e)
        agent.journal.setdefault("stopped", f"lost the vault: {type(e).__name__}")
    await agent.vault.close()
    save(agent.journal)
    show(*agent.final())


if __name__ == "__main__":
    asyncio.run(main())
