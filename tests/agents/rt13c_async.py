#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone (red team, thirteenth pass).

Python asyncio, std only. Habits (environment knobs):
  RT13_CD       1: chdir into state_dir first and work from there (relative state file)
  RT13_PING     s: a second connection (no session) asks `vault.status` every s seconds meanwhile
  RT13_POLL     s: non-blocking approvals: call with wait_s 0, then call.resume every s seconds
                with wait_s s (many small calls) instead of one long wait
  RT13_BY       key: reconcile an outcome_unknown by looking up the idempotency key (section 3
                allows `idempotency_key` in place of `correlation_id`); cid (default)
  RT13_STATUS   1: `vault.status` and `catalog` before every step
  RT13_CHATTY   N: N KiB of debug lines on stderr per step
  RT13_FINAL    word | md_under (`__Done__`) | md_status (`**Status**: done — …`) |
                pascal (`{"Status":"Done","Message":…}`, as .NET's serializer names fields) | heading (`# Done`) | osc8 (a terminal hyperlink
                around the claim) | check (`✔️ done`)
  RT13_WORKER   all | reads: each step (or each step whose catalog entry says mutates: false) is
                done by a child process of ours, which opens its own session (section 3: "a child
                opens its own session"), does that one step and saves it in state_dir
  RT13_LEAVE    1: leaves in state_dir and $TMPDIR what tools leave: a FIFO, a bound Unix socket,
                links to /dev/null and /dev/zero, a dangling link, a link loop, a file and a
                directory of mode 000, a sparse file of 300 MiB (nothing secret in any)
  RT13_DROP     1: at the first approval_pending, the connection is dropped (as a client whose
                read timeout fired would) and a new one opened, with a new session under the same
                name and run id, which resumes the saved token
  RT13_EXIT     normal | exec (the final message printed by printf, exec'd in our place) |
                osexit (flush, then os._exit(0))
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from typing import Any

TASK_PATH = os.environ["VAULTSIM_TASK"]
with open(TASK_PATH, encoding="utf-8") as _f:
    TASK = json.load(_f)
SOCK = os.environ["VAULTSIM_SOCKET"]
RUN_ID = os.environ.get("VAULTSIM_RUN_ID") or TASK["run_id"]
AGENT = TASK["agent"]
DEADLINE = float(TASK["deadline"])
OPS = set(TASK.get("operations", []))
CATALOG = TASK.get("catalog", {})
MARGIN = 0.8
CD = os.environ.get("RT13_CD") == "1"
PING = float(os.environ.get("RT13_PING") or 0)
POLL = float(os.environ.get("RT13_POLL") or 0)
BY = os.environ.get("RT13_BY", "cid")
STATUS = os.environ.get("RT13_STATUS") == "1"
CHATTY = int(os.environ.get("RT13_CHATTY") or 0)
FINAL = os.environ.get("RT13_FINAL", "word")
EXIT = os.environ.get("RT13_EXIT", "normal")
WORKER = os.environ.get("RT13_WORKER", "")
DROP = [os.environ.get("RT13_DROP") == "1"]
ONLY = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--worker" else None
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")

if CD and TASK.get("state_dir"):
    os.chdir(TASK["state_dir"])
    STATE_FILE = "rt13c-async.json"
else:
    STATE_FILE = os.path.join(TASK["state_dir"], "rt13c-async.json") if TASK.get("state_dir") else ""


def left() -> float:
    return DEADLINE - time.time()


def dbg(*a: Any) -> None:
    print("debug:", *a, file=sys.stderr, flush=True)


def load() -> dict[str, Any]:
    try:
        with open(STATE_FILE, encoding="utf-8") as f:
            d = json.load(f)
        return {"done": d.get("done", {}), "pending": d.get("pending", {}), "why": d.get("why")}
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save(st: dict[str, Any]) -> None:
    if not STATE_FILE:
        return
    with open(STATE_FILE + ".new", "w", encoding="utf-8") as f:
        json.dump(st, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(STATE_FILE + ".new", STATE_FILE)


def resolve(v: Any, done: dict[str, Any]) -> Any:
    if isinstance(v, str):
        bad = []

        def sub(m: re.Match[str]) -> str:
            d = done.get(m.group(1))
            if not isinstance(d, dict) or m.group(2) not in d:
                bad.append(m.group(0))
                return ""
            return str(d[m.group(2)])
        out = REF.sub(sub, v)
        if bad:
            raise LookupError(bad[0])
        return out
    if isinstance(v, dict):
        return {k: resolve(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [resolve(x, done) for x in v]
    return v


class Conn:
    def __init__(self) -> None:
        self.r: asyncio.StreamReader
        self.w: asyncio.StreamWriter
        self.n = 0
        self.futs: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.sid = ""

    async def start(self) -> None:
        self.r, self.w = await asyncio.open_unix_connection(SOCK, limit=4 << 20)
        self.task = asyncio.ensure_future(self.pump())

    async def reconnect(self) -> None:
        dbg("dropping the connection")
        self.w.close()
        await self.task
        await self.start()
        ans = await self.rpc("session.open", {"agent": AGENT, "run_id": RUN_ID,
                                              "client": {"name": "rt13c-async", "version": "1"}})
        self.sid = ans["result"]["session_id"]

    async def pump(self) -> None:
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
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self.futs.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("vault closed the connection"))

    async def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.n += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.futs[self.n] = fut
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            msg["params"] = params
        self.w.write(json.dumps(msg).encode() + b"\n")
        await self.w.drain()
        return await asyncio.wait_for(fut, timeout=max(1.0, left() + 2))

    async def call(self, method: str, **p: Any) -> dict[str, Any]:
        ans = await self.rpc(method, {"session_id": self.sid, **p})
        if CHATTY:
            for i in range(CHATTY * 8):
                dbg(f"{method} #{i}", "x" * 120)
        if "error" in ans:
            dbg(method, "error", ans["error"].get("code"), ans["error"].get("message"))
            return {"ok": False, "category": "rpc_error", "error": ans["error"]}
        dbg(method, ans["result"].get("category"), ans["result"].get("reconciled"))
        return ans["result"]


class Stop(Exception):
    pass


class Wait(Exception):
    pass


async def pinger(stop: asyncio.Event) -> None:
    c = Conn()
    await c.start()
    try:
        while not stop.is_set() and left() > MARGIN + 0.3:
            await c.rpc("vault.status")
            try:
                await asyncio.wait_for(stop.wait(), PING)
            except asyncio.TimeoutError:
                pass
    finally:
        c.w.close()


async def unlocked(v: Conn) -> bool:
    while left() > MARGIN + 0.5:
        st = await v.rpc("vault.status")
        if not (st.get("result") or {}).get("locked"):
            return True
        await asyncio.sleep(0.1)
    return False


async def settle(v: Conn, res: dict[str, Any], op: str, key: str, st: dict[str, Any], sid: str) -> dict[str, Any]:
    """Follow an approval_pending to its end; Wait when the deadline comes first."""
    while res.get("category") == "approval_pending":
        token = res["resume_token"]
        st["pending"][sid] = {"token": token, "request_id": res.get("request_id"), "owner": res.get("owner")}
        save(st)
        room = left() - MARGIN - 0.3
        if room <= 0.05:
            raise Wait(f"{op} needs approval from {res.get('owner')} (request {res.get('request_id')})")
        if DROP[0]:
            DROP[0] = False
            await v.reconnect()
        res = await v.call("call.resume", resume_token=token, wait_s=round(min(POLL or room, room), 3))
        if res.get("category") == "rpc_error":
            # the vault no longer knows the token: call the step again, under its key
            st["pending"].pop(sid, None)
            save(st)
            return {"category": "again"}
    st["pending"].pop(sid, None)
    save(st)
    return res


async def step(v: Conn, s: dict[str, Any], st: dict[str, Any], notes: list[str]) -> None:
    sid, op = s["id"], s["call"]
    if sid in st["done"]:
        notes.append(f"{sid}: done before")
        return
    if op not in OPS:
        raise Stop(f"{op} is not among my operations")
    try:
        params = resolve(s.get("params", {}), st["done"])
    except LookupError as e:
        raise Stop(f"{sid}: no value for {e}")
    key = f"{RUN_ID}/{AGENT}/{sid}"
    if STATUS:
        await v.rpc("vault.status")
        await v.rpc("catalog")
    res: dict[str, Any]
    if sid in st["pending"]:
        res = await v.call("call.resume", resume_token=st["pending"][sid]["token"],
                           wait_s=round(max(0.0, min(POLL or 99, left() - MARGIN - 0.3)), 3))
        if res.get("category") == "rpc_error":
            st["pending"].pop(sid, None)
            save(st)
            res = {"category": "again"}
        else:
            res = await settle(v, res, op, key, st, sid)
    else:
        res = {"category": "again"}
    attempts = 0
    while True:
        if res.get("category") == "again":
            if left() < MARGIN + 0.5:
                raise Stop(f"{sid}: no time left to call {op}")
            attempts += 1
            wait = 0.0 if POLL else max(0.0, left() - MARGIN - 0.3)
            res = await v.call("call", operation=op, params=params, idempotency_key=key, wait_s=round(wait, 3))
            res = await settle(v, res, op, key, st, sid)
            continue
        cat = res.get("category")
        if cat == "success":
            data = res.get("data") if isinstance(res.get("data"), dict) else {}
            st["done"][sid] = data
            save(st)
            notes.append(f"{sid}: ok")
            return
        if cat == "rpc_error":
            raise Stop(f"{sid}: the vault refused the request ({res['error'].get('message')})")
        if cat in NEVER:
            raise Stop(f"{sid}: {cat}: {res.get('message')}")
        if cat in ("local_failure", "confirmed_failure"):
            if attempts >= 3:
                raise Stop(f"{sid}: {cat} three times")
            res = {"category": "again"}
            continue
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 1.0)
            if attempts >= 3 or left() - delay < MARGIN + 0.5:
                raise Stop(f"{sid}: rate limited, no room to wait {delay}s")
            await asyncio.sleep(delay)
            res = {"category": "again"}
            continue
        if cat == "vault_locked":
            if attempts >= 3 or not await unlocked(v):
                raise Stop(f"{sid}: the vault stayed locked")
            res = {"category": "again"}
            continue
        if cat == "outcome_unknown":
            cid = res.get("correlation_id")
            pause = 0.1
            while True:
                ask = {"idempotency_key": key} if BY == "key" else {"correlation_id": cid}
                lk = await v.call("lookup", operation=op, **ask)
                said = lk.get("reconciled")
                if said == "found":
                    created = ((lk.get("data") or {}).get("created") or [{}])
                    st["done"][sid] = created[0] if created else {}
                    save(st)
                    notes.append(f"{sid}: found by lookup")
                    return
                if said == "not_found":
                    if attempts >= 3:
                        raise Stop(f"{sid}: not done after three attempts")
                    res = {"category": "again"}
                    break
                if pause > 0.4 or left() < MARGIN + pause + 0.5:
                    raise Stop(f"{sid}: outcome unknown after lookups ({cid}); a person must inspect it")
                await asyncio.sleep(pause)
                pause *= 2
            continue
        raise Stop(f"{sid}: unexpected answer {cat}")


async def main() -> str:
    st = load()
    v = Conn()
    await v.start()
    ans = await v.rpc("session.open", {"agent": AGENT, "run_id": RUN_ID,
                                       "client": {"name": "rt13c-async", "version": "1"}})
    v.sid = ans["result"]["session_id"]
    stop = asyncio.Event()
    pings = asyncio.ensure_future(pinger(stop)) if PING else None
    notes: list[str] = []
    try:
        if not await unlocked(v):
            return "not done: the vault stayed locked"
        for s in TASK["steps"]:
            if ONLY is not None and s["id"] != ONLY:
                continue
            if ONLY is None and (WORKER == "all" or (WORKER == "reads" and not CATALOG.get(s["call"], {}).get("mutates", True))) \
                    and s["id"] not in st["done"]:
                kid = await asyncio.create_subprocess_exec(sys.executable, os.path.abspath(__file__), "--worker", s["id"],
                                                           stdout=asyncio.subprocess.DEVNULL)
                code = await kid.wait()
                st = load()
                if s["id"] in st["done"]:
                    notes.append(f"{s['id']}: ok (worker)")
                    continue
                why = st.get("why") or f"worker exited {code}"
                if code == 4:
                    raise Wait(why)
                raise Stop(why)
            await step(v, s, st, notes)
        return "done: " + "; ".join(notes)
    except Stop as e:
        if ONLY is not None:
            st["why"] = str(e)
            save(st)
            sys.exit(3)
        return f"not done: {e}"
    except Wait as e:
        if ONLY is not None:
            st["why"] = str(e)
            save(st)
            sys.exit(4)
        return f"waiting: {e}"
    finally:
        stop.set()
        if pings is not None:
            await pings
        try:
            await asyncio.wait_for(v.rpc("session.close", {"session_id": v.sid}), 1.0)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
        v.w.close()


def leave() -> None:
    import socket as _s
    for d in (TASK.get("state_dir"), os.environ.get("TMPDIR") or "/tmp"):
        if not d:
            continue
        d = os.path.join(d, "rt13c-left")
        os.makedirs(d, exist_ok=True)
        made = []
        for name, make in (("fifo", lambda p: os.mkfifo(p)),
                           ("sock", lambda p: _s.socket(_s.AF_UNIX).bind(p)),
                           ("null", lambda p: os.symlink("/dev/null", p)),
                           ("zero", lambda p: os.symlink("/dev/zero", p)),
                           ("dangling", lambda p: os.symlink(os.path.join(d, "nowhere"), p)),
                           ("loop", lambda p: os.symlink(p, p)),
                           ("sparse", lambda p: os.truncate(open(p, "wb").name, 300 << 20)),
                           ("closed", lambda p: (open(p, "w").write("nothing secret\n"), os.chmod(p, 0)))):
            try:
                make(os.path.join(d, name))
                made.append(name)
            except OSError as e:
                dbg("leave", name, e)
        try:
            os.makedirs(os.path.join(d, "shut", "in"), exist_ok=True)
            with open(os.path.join(d, "shut", "in", "f.txt"), "w") as f:
                f.write("nothing secret\n")
            os.chmod(os.path.join(d, "shut"), 0)
            made.append("shut")
        except OSError as e:
            dbg("leave shut", e)
        dbg("left", d, made)


def styled(text: str) -> str:
    word, _, rest = text.partition(":")
    if FINAL == "md_under":
        return f"__{word.capitalize()}__:{rest}"
    if FINAL == "pascal":
        return json.dumps({"Status": word.capitalize(), "Message": rest.strip()}, separators=(",", ":"))
    if FINAL == "md_status":
        return f"**Status**: {word} \u2014{rest}"
    if FINAL == "heading":
        return f"# {word.capitalize()}:{rest}"
    if FINAL == "osc8":
        return f"\x1b]8;;https://example.invalid/run\x1b\\{word}\x1b]8;;\x1b\\:{rest}"
    if FINAL == "check":
        return ("\u2714\ufe0f " if word == "done" else "\u2716\ufe0f ") + text
    return text


if __name__ == "__main__":
    final = styled(asyncio.run(main()))
    if os.environ.get("RT13_LEAVE") == "1" and ONLY is None:
        leave()
    if EXIT == "exec":
        sys.stdout.flush()
        os.execvp("printf", ["printf", "%s\\n", final])
    print(final, flush=True)
    if EXIT == "osexit":
        os._exit(0)
