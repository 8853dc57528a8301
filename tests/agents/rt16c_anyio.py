#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone (red team, sixteenth pass, c).

anyio (asyncio backend) and a process worker pool; nothing of the project imported. Habits:

* one connection; `session.open`, `vault.status` and `catalog` written at once before any
  answer is read (pipelined), a reader task matching answers to requests by id;
* approvals collected without blocking: `call` with a short `wait_s`, then `call.resume`
  again and again; at the deadline the token saved in state_dir and a `waiting` message;
* `lookup` after every outcome_unknown by correlation id, 0.1/0.2/0.4 s apart;
* RT16C_POOL=1 | fork | forkserver: each step whose operation the catalog answer says is never asked about
  (approval mode `auto`) and does not mutate is done by a worker of anyio's process pool
  (`anyio.to_process`; fork or forkserver: a multiprocessing ProcessPoolExecutor of two made
  after the session opened, so a forked worker inherits the session's connection unused); a worker opens its own session once and keeps it for its life
  (section 3: a child opens its own session); the pool is ended before the final message;
* RT16C_SPIN=s: a pending approval polled with `call.resume` and `wait_s` 0 every s seconds;
* RT16C_CANCEL=1: at the deadline a pending call is withdrawn (`call.cancel`) and the agent
  finishes `not done` (section 4: not a wait);
* RT16C_FILES=N: N scratch files in $TMPDIR and N in state_dir written and read back, the
  $TMPDIR ones removed at the end;
* RT16C_DUMP=1: a hex dump and base64 of each step's result data and of the state file on
  stdout (harmless data: a final message is still the last line); all: also every line the
  vault sent, as base64 and hex;
* RT16C_LATE=s: the final message printed s seconds before the deadline; RT16C_TRAIL=s: a
  helper in a session of its own (stdout inherited) started last, ending s seconds later (the
  contract allows 2 s); RT16C_EXIT_LAG=s: s seconds more between the final message and the exit
  (a loaded host's slow interpreter teardown, on request);
* RT16C_FINAL: word (default) | bom (a UTF-8 BOM written before the final message) | crlf
  (every stdout line ends in CRLF, two blank lines after the final message) | long (3.5 MiB
  of detail after the word, on its one line) | buffered (stdout kept in a 1 MiB buffer that
  reaches the pipe only at exit) | bomjson (a BOM, then a JSON object with `status`).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
import sys
import time
from typing import Any

import anyio
import anyio.to_process

MARGIN = 0.8
FINAL = os.environ.get("RT16C_FINAL", "word")
SPIN = float(os.environ["RT16C_SPIN"]) if os.environ.get("RT16C_SPIN") else None
DUMP_ALL = os.environ.get("RT16C_DUMP") == "all"
CANCEL = os.environ.get("RT16C_CANCEL") == "1"
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


class Stop(Exception):
    pass


class Conn:
    """One connection to the vault; requests in flight at once, answers matched by id."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.waiters: dict[int, tuple[anyio.Event, list[Any]]] = {}
        self.next_id = 100
        self.closed = False
        self.lock = anyio.Lock()

    async def reader(self) -> None:
        buf = b""
        try:
            while True:
                chunk = await self.stream.receive(65536)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        doc = json.loads(line)
                    except ValueError:
                        continue
                    if DUMP_ALL:  # every line the vault sent, logged encoded (harmless: it is mine)
                        sys.stdout.write("rx b64 " + base64.b64encode(line).decode() + "\n")
                        sys.stdout.write("rx hex " + line.hex() + "\n")
                    if isinstance(doc, dict) and doc.get("id") in self.waiters:
                        ev, box = self.waiters.pop(doc["id"])
                        box.append(doc)
                        ev.set()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        self.closed = True
        for ev, _box in list(self.waiters.values()):
            ev.set()

    async def send(self, method: str, params: dict[str, Any]) -> tuple[anyio.Event, list[Any]]:
        self.next_id += 1
        rid = self.next_id
        ev, box = anyio.Event(), []
        self.waiters[rid] = (ev, box)
        msg = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        async with self.lock:
            await self.stream.send(msg.encode() + b"\n")
        return ev, box

    async def answer(self, pending: tuple[anyio.Event, list[Any]], method: str, timeout: float) -> Any:
        ev, box = pending
        with anyio.fail_after(max(timeout, 1.0)):
            await ev.wait()
        if not box:
            raise Stop(f"{method}: the vault closed the connection")
        doc = box[0]
        if "error" in doc:
            raise Stop(f"{method}: refused: {doc['error'].get('message', 'error')}")
        return doc.get("result")

    async def rpc(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        return await self.answer(await self.send(method, params), method, timeout)


def fill(value: Any, done: dict[str, Any], sid: str) -> Any:
    if isinstance(value, str):
        def one(m: re.Match[str]) -> str:
            data = done.get(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data:
                raise Stop(f"step {sid} needs {m.group(0)}, which no step of mine produced")
            return str(data[m.group(2)])
        return REF.sub(one, value)
    if isinstance(value, dict):
        return {k: fill(v, done, sid) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, done, sid) for v in value]
    return value


class Stepper:
    """Runs one step to its end over one session: ('done', data) | ('wait', why, token) | raises Stop."""

    def __init__(self, conn: Conn, sid: str, deadline: float, say: Any) -> None:
        self.conn, self.sid, self.deadline, self.say = conn, sid, deadline, say

    def left(self) -> float:
        return self.deadline - time.time() - MARGIN

    async def rpc(self, method: str, params: dict[str, Any], slack: float = 2.0) -> dict[str, Any]:
        res = await self.conn.rpc(method, {"session_id": self.sid, **params}, self.left() + slack)
        if not isinstance(res, dict):
            raise Stop(f"{method}: an answer that is not a Result")
        return res

    async def run(self, op: str, params: dict[str, Any], key: str, token: str | None,
                  on_token: Any = None) -> tuple[Any, ...]:
        attempts = 0
        while True:
            if self.left() <= 0:
                if token:
                    return ("wait", f"{op} still waits for a person's decision", token)
                raise Stop(f"{op}: my deadline came before it settled")
            wait = max(0.0, min(self.left() - 0.3, 1.5))
            if SPIN is not None and token:  # poll: an answer at once, then a short pause
                wait = 0.0
                await anyio.sleep(SPIN)
            if token:
                try:
                    res = await self.rpc("call.resume", {"resume_token": token, "wait_s": wait}, wait + 5)
                except Stop as e:  # the vault no longer knows the token: call the step again, same key
                    self.say(f"{op}: {e}; calling it again")
                    token = None
                    if on_token:
                        on_token(None)
                    continue
                if res.get("category") == "approval_pending" and res.get("resume_token"):
                    token = res["resume_token"]
            else:
                attempts += 1
                res = await self.rpc("call", {"operation": op, "params": params, "idempotency_key": key,
                                              "wait_s": wait}, wait + 5)
            cat = res.get("category")
            self.say(f"{op}: {cat} ({res.get('correlation_id')})")
            if cat == "success":
                return ("done", res.get("data") if isinstance(res.get("data"), dict) else {})
            if cat == "approval_pending":
                token = res.get("resume_token") or token
                if on_token and token:
                    on_token(token)
                if not token:
                    raise Stop(f"{op}: pending without a resume token")
                if self.left() <= 0.6:
                    if CANCEL:  # withdrawn at the deadline: nothing to hand over (section 4)
                        got = await self.rpc("call.cancel", {"resume_token": token}, 3)
                        if on_token:
                            on_token(None)
                        raise Stop(f"{op}: withdrew my pending call at my deadline ({got.get('state')})")
                    return ("wait", f"{op} needs approval from {res.get('owner')} before "
                                    f"{res.get('deadline')} (request {res.get('request_id')})", token)
                continue
            if token and on_token:
                on_token(None)
            token = None
            if cat == "outcome_unknown":
                found = await self.reconcile(op, res.get("correlation_id"))
                if found is not None:
                    return ("done", found)
            elif cat == "rate_limited":
                delay = float(res.get("retry_after_s") or 0)
                if attempts >= 3 or delay > self.left() - 0.5:
                    raise Stop(f"{op}: rate limited; no attempt left before my deadline")
                await anyio.sleep(delay)
                continue
            elif cat in ("local_failure", "confirmed_failure"):
                pass
            elif cat == "vault_locked":
                while (await self.conn.rpc("vault.status", {}, 5)).get("locked"):
                    if self.left() <= 0.5:
                        raise Stop(f"{op}: the vault stayed locked until my deadline")
                    await anyio.sleep(0.2)
            else:
                raise Stop(f"{op}: {cat}: {res.get('message', '')}")
            if attempts >= 3:
                raise Stop(f"{op}: {cat} after {attempts} attempts")

    async def reconcile(self, op: str, cid: Any) -> dict[str, Any] | None:
        for pause in (0.0, 0.1, 0.2, 0.4):
            if self.left() < pause + 0.3:
                break
            await anyio.sleep(pause)
            res = await self.rpc("lookup", {"correlation_id": cid, "operation": op}, 10)
            found = res.get("reconciled")
            if found == "found":
                created = (res.get("data") or {}).get("created") or [{}]
                return dict(created[0]) if isinstance(created[0], dict) else {}
            if found == "not_found":
                return None
        raise Stop(f"{op}: outcome still unknown (correlation id {cid}): a person must inspect it")


# ---- the pool worker: a process of its own, with its own connection and session ----------------

_WORKER: dict[str, Any] = {}


def worker_step(sock: str, agent: str, run_id: str, deadline: float, op: str, params: dict[str, Any],
                key: str) -> tuple[Any, ...]:
    """Runs in an anyio process worker; keeps its session between steps (one per process)."""
    import socket as pysocket

    def rpc(method: str, p: dict[str, Any]) -> Any:
        s = _WORKER["sock"]
        _WORKER["id"] += 1
        rid = _WORKER["id"]
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": p}).encode() + b"\n")
        s.settimeout(max(deadline - time.time() + 2, 1))
        while True:
            while b"\n" not in _WORKER["buf"]:
                chunk = s.recv(65536)
                if not chunk:
                    raise Stop("the vault closed my worker's connection")
                _WORKER["buf"] += chunk
            line, _WORKER["buf"] = _WORKER["buf"].split(b"\n", 1)
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("id") == rid:
                if "error" in doc:
                    raise Stop(f"{method}: refused: {doc['error'].get('message')}")
                return doc.get("result")

    try:
        if "sid" not in _WORKER:
            s = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
            s.connect(sock)
            _WORKER.update(sock=s, buf=b"", id=0)
            _WORKER["sid"] = rpc("session.open", {"agent": agent, "run_id": run_id,
                                                  "client": {"name": "rt16c-worker", "via": "anyio.to_process"}})["session_id"]
        attempts = 0
        while True:
            attempts += 1
            left = deadline - time.time() - MARGIN
            if left <= 0:
                return ("stop", f"{op}: my deadline came first")
            res = rpc("call", {"session_id": _WORKER["sid"], "operation": op, "params": params,
                               "idempotency_key": key, "wait_s": max(0.0, min(left - 0.3, 1.0))})
            cat = res.get("category")
            if cat == "success":
                return ("done", res.get("data") if isinstance(res.get("data"), dict) else {})
            if cat == "approval_pending":  # not expected for an `auto` operation: hand it back
                return ("pending", res.get("resume_token"), res.get("owner"))
            if cat == "outcome_unknown":
                cid = res.get("correlation_id")
                for pause in (0.0, 0.1, 0.2, 0.4):
                    time.sleep(pause)
                    look = rpc("lookup", {"session_id": _WORKER["sid"], "correlation_id": cid, "operation": op})
                    if look.get("reconciled") == "found":
                        created = (look.get("data") or {}).get("created") or [{}]
                        return ("done", dict(created[0]))
                    if look.get("reconciled") == "not_found":
                        break
                else:
                    return ("stop", f"{op}: outcome unknown (correlation id {cid})")
            elif cat == "rate_limited":
                delay = float(res.get("retry_after_s") or 0)
                if delay > deadline - time.time() - MARGIN - 0.5:
                    return ("stop", f"{op}: rate limited past my deadline")
                time.sleep(delay)
            elif cat not in ("local_failure", "confirmed_failure"):
                return ("stop", f"{op}: {cat}: {res.get('message', '')}")
            if attempts >= 3:
                return ("stop", f"{op}: {cat} after {attempts} attempts")
    except (Stop, OSError, KeyError, TypeError, ValueError) as e:
        return ("stop", f"{op}: worker: {e}")


# ---- the agent ------------------------------------------------------------------------------


class Agent:
    def __init__(self, out: Any) -> None:
        with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
            self.task = json.load(f)
        self.deadline = float(self.task["deadline"])
        self.state_dir = self.task.get("state_dir") or ""
        self.state_path = os.path.join(self.state_dir, "rt16c-anyio.json") if self.state_dir else ""
        self.state: dict[str, Any] = {"done": {}, "pending": {}}
        if self.state_path and os.path.exists(self.state_path):
            try:
                with open(self.state_path, encoding="utf-8") as f:
                    self.state = json.load(f)
            except (OSError, ValueError):
                pass
        self.out = out
        self.scratch: list[str] = []

    def say(self, text: str) -> None:
        self.out.write(text + "\n")

    def left(self) -> float:
        return self.deadline - time.time() - MARGIN

    def save(self) -> None:
        if not self.state_path:
            return
        tmp = self.state_path + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)
        if os.environ.get("RT16C_DUMP") in ("1", "all"):
            with open(self.state_path, "rb") as f:
                raw = f.read()
            self.say("state base64: " + base64.b64encode(raw).decode())

    def dump(self, sid: str, data: Any) -> None:
        if os.environ.get("RT16C_DUMP") not in ("1", "all"):
            return
        raw = json.dumps(data, sort_keys=True).encode()
        for off in range(0, len(raw), 16):
            chunk = raw[off:off + 16]
            text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
            self.say(f"{sid} {off:08x}  {binascii.hexlify(chunk, ' ').decode():<47}  |{text}|")
        self.say(f"{sid} b64 {base64.b64encode(raw).decode()}")

    def scratch_files(self) -> None:
        n = int(os.environ.get("RT16C_FILES", "0") or 0)
        if not n:
            return
        tmp = os.environ.get("TMPDIR") or "/tmp"
        base = os.path.join(tmp, f"rt16c-{os.getpid()}")
        os.makedirs(base, exist_ok=True)
        self.scratch.append(base)
        for root in (base, os.path.join(self.state_dir, "cache") if self.state_dir else ""):
            if not root:
                continue
            os.makedirs(root, exist_ok=True)
            for i in range(n):
                p = os.path.join(root, f"entry-{i:05d}.txt")
                with open(p, "w") as f:
                    f.write(f"scratch entry {i} of step cache\n" * 4)
            got = sum(1 for _ in os.scandir(root))
            self.say(f"scratch: {got} files in {os.path.basename(root)}")

    def cleanup(self) -> None:
        import shutil
        pool = getattr(self, "pool", None)
        if pool is not None:  # every worker ended and reaped before the final message
            pool.shutdown(wait=True, cancel_futures=True)
        for d in self.scratch:
            shutil.rmtree(d, ignore_errors=True)

    async def main(self) -> tuple[str, str]:
        sock = os.environ["VAULTSIM_SOCKET"]
        steps = self.task["steps"]
        done = self.state["done"]
        self.scratch_files()
        stream = await anyio.connect_unix(sock)
        conn = Conn(stream)
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.reader)
            try:
                return await self.work(conn, steps, done)
            finally:
                await stream.aclose()
                tg.cancel_scope.cancel()
        return ("not done", "unreachable")

    async def work(self, conn: Conn, steps: list[dict[str, Any]], done: dict[str, Any]) -> tuple[str, str]:
        pooled = os.environ.get("RT16C_POOL") in ("1", "fork", "forkserver")
        self.pool = None
        try:
            # three requests written before any answer is read
            p_open = await conn.send("session.open", {"agent": self.task["agent"], "run_id": self.task["run_id"],
                                                      "client": {"name": "rt16c-anyio", "version": "1"}})
            p_status = await conn.send("vault.status", {})
            p_cat = await conn.send("catalog", {})
            cat = await conn.answer(p_cat, "catalog", 10)
            status = await conn.answer(p_status, "vault.status", 10)
            sid = (await conn.answer(p_open, "session.open", 10))["session_id"]
            modes = {o.get("name"): o for o in (cat or {}).get("operations", []) if isinstance(o, dict)}
            while isinstance(status, dict) and status.get("locked"):
                if self.left() <= 0.5:
                    return ("not done", "the vault stayed locked until my deadline; nothing sent")
                await anyio.sleep(0.2)
                status = await conn.rpc("vault.status", {}, 5)
            stepper = Stepper(conn, sid, self.deadline, self.say)
            n = 0
            for step in steps:
                sid_ = step["id"]
                if sid_ in done:
                    n += 1
                    continue
                op = step["call"]
                params = fill(step.get("params", {}), done, sid_)
                key = f"{self.task['run_id']}:{self.task['agent']}:{sid_}"
                entry = modes.get(op, {})
                auto = (entry.get("approval") or {}).get("mode") == "auto" and entry.get("mutates") is False
                if pooled and auto and sid_ not in self.state["pending"]:
                    args = (os.environ["VAULTSIM_SOCKET"], self.task["agent"], self.task["run_id"],
                            self.deadline, op, params, key)
                    if os.environ["RT16C_POOL"] == "1":
                        got = await anyio.to_process.run_sync(worker_step, *args)
                    else:  # a multiprocessing pool made after my session opened (fork: it inherits my connection)
                        if self.pool is None:
                            import concurrent.futures
                            import multiprocessing
                            ctx = multiprocessing.get_context(os.environ["RT16C_POOL"])
                            self.pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx)
                        fut = self.pool.submit(worker_step, *args)
                        got = await anyio.to_thread.run_sync(fut.result, max(self.left() + 1, 1))
                    self.say(f"{op}: worker says {got[0]}")
                    if got[0] == "pending" and got[1]:  # the worker's session would have to collect it
                        return ("not done", f"{op} was gated after all, in a worker's session")
                    if got[0] != "done":
                        return ("not done", str(got[1]))
                    data = got[1]
                else:
                    def keep(token: str | None, s: str = sid_) -> None:
                        if token:
                            self.state["pending"][s] = token
                        else:
                            self.state["pending"].pop(s, None)
                        self.save()
                    got = await stepper.run(op, params, key, self.state["pending"].get(sid_), keep)
                    if got[0] == "wait":
                        self.state["pending"][sid_] = got[2]
                        self.save()
                        return ("waiting", got[1])
                    data = got[1]
                self.state["pending"].pop(sid_, None)
                done[sid_] = data
                self.save()
                self.dump(sid_, data)
                n += 1
            try:
                await conn.rpc("session.close", {"session_id": sid}, 3)
            except (Stop, TimeoutError):
                pass
            return ("done", f"all {n} steps succeeded")
        except Stop as e:
            return ("not done", str(e))
        except TimeoutError:
            return ("not done", "the vault did not answer in time")


def final_line(word: str, why: str) -> str:
    if FINAL == "bomjson":
        return "\ufeff" + json.dumps({"status": word.replace(" ", "_"), "message": why})
    line = f"{word}: {why}"
    if FINAL == "bom":
        return "\ufeff" + line
    if FINAL == "long":
        return line + " | detail: " + ("step log entry ok; " * ((3 * 1024 * 1024 + 512 * 1024) // 19))
    return line


def main() -> int:
    raw = sys.stdout.buffer
    if FINAL == "buffered":  # nothing reaches the pipe before exit (a 1 MiB buffer)
        out = io.TextIOWrapper(io.BufferedWriter(raw, buffer_size=1 << 20), encoding="utf-8")
    else:
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="\r\n" if FINAL == "crlf" else None,
                               line_buffering=True)
    sys.stdout = out
    try:
        agent = Agent(out)
    except (OSError, ValueError, KeyError) as e:
        out.write(f"not done: cannot start: {e}\n")
        out.flush()
        return 0
    try:
        word, why = anyio.run(agent.main)
    finally:
        agent.cleanup()
    late = os.environ.get("RT16C_LATE")
    if late:  # stay until that long before the deadline (work that fills the budget)
        time.sleep(max(0.0, agent.deadline - time.time() - float(late)))
    trail = os.environ.get("RT16C_TRAIL")
    if trail:  # a helper in a session of its own, holding my stdout, ends that long after I exit
        import subprocess
        hold = os.environ.get("RT16C_HOLD", "stdout")  # what of mine it keeps open: stdout | stderr | none
        subprocess.Popen(["sleep", trail], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=None if hold == "stdout" else subprocess.DEVNULL,
                         stderr=None if hold in ("stdout", "stderr") else subprocess.DEVNULL)
    out.write(final_line(word, why) + "\n")
    if FINAL == "crlf":
        out.write("\n\n")
    out.flush()
    time.sleep(float(os.environ.get("RT16C_EXIT_LAG", "0")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
