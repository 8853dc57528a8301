"""A careful agent written from docs/agent-contract.md alone, in a style not tried before.

    python rt14c_pool.py            (RT14_FINAL=plain|crlf|ansi|tasklist|shortcode|status|json|jsoncolour)

* one connection, a reader thread matching answers to requests by id, and every request sent from
  a ThreadPoolExecutor: the main thread waits on futures with timeouts and cancels the ones it no
  longer needs (speculative `vault.status`/`catalog` probes, queued before each step)
* re-execs itself (os.execv) before its first call, and again after its first step when that step's
  operation needs no approval (catalog mode auto: a new session then holds no less)
* `lookup` after every success, and before every resend, by correlation id (section 6: always allowed)
* verbose stdout log: every Result as a JSON line, plus lines such as `status: working` and
  `done: create (1 of 3)` before the final message
* 24 MiB caches (RT14_CACHE_MIB; real data, not sparse) in state_dir and $TMPDIR; helper children (a python hashing
  the cache, `sh -c true`) that exit before it does
* the final message in several renderings (CRLF, trailing spaces, colour codes, `- [x] done`,
  `:white_check_mark: done`, `Status: done_with_errors` after a partial run)
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
FINAL = os.environ.get("RT14_FINAL", "plain")


class Refused(Exception):
    pass


class Conn:
    """JSON-RPC over the socket; send() returns a future answered by the reader thread."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.lock = threading.Lock()
        self.waiting: dict[int, cf.Future] = {}
        self.ids = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        buf = self.sock.makefile("rb")
        for raw in buf:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            fut = self.waiting.pop(msg.get("id"), None) if isinstance(msg, dict) else None
            if fut is not None and not fut.done():
                fut.set_result(msg)
        for fut in list(self.waiting.values()):
            if not fut.done():
                fut.set_exception(Refused("the vault closed the connection"))

    def send(self, method: str, params: dict) -> cf.Future:
        fut: cf.Future = cf.Future()
        with self.lock:
            self.ids += 1
            rid = self.ids
            self.waiting[rid] = fut
            self.sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                           "params": params}) + "\n").encode())
        return fut


class Agent:
    def __init__(self) -> None:
        with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
            self.task = json.load(f)
        self.deadline = float(self.task["deadline"])
        self.name = self.task["agent"]
        self.run_id = os.environ.get("VAULTSIM_RUN_ID") or self.task["run_id"]
        self.catalog = self.task.get("catalog") or {}
        self.state_dir = self.task.get("state_dir") or ""
        self.path = os.path.join(self.state_dir, "rt14-state.json") if self.state_dir else ""
        self.state = {"done": {}, "pending": {}, "sent": {}}
        if self.path and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                self.state = json.load(f)
        self.pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rpc")
        self.conn = Conn(os.environ["VAULTSIM_SOCKET"])
        self.approved_any = False
        self.session = self.request("session.open", {"agent": self.name, "run_id": self.run_id},
                                    timeout=5.0)["session_id"]
        self.log("status: working", f"session opened, {len(self.task['steps'])} steps")
        ops = self.request("catalog", {}, timeout=5.0).get("operations") or []
        self.modes = {o.get("name"): (o.get("approval") or {}).get("mode") for o in ops if isinstance(o, dict)}

    # ---- plumbing -------------------------------------------------------------------------------

    def left(self) -> float:
        return self.deadline - time.time() - 0.4

    def log(self, *parts: object) -> None:
        print(*parts, flush=True)

    def request(self, method: str, params: dict, timeout: float | None = None) -> dict:
        """Send from the pool, wait here; an RPC `error` raises Refused."""
        outer = self.pool.submit(lambda: self.conn.send(method, params).result())
        msg = outer.result(timeout=timeout if timeout is not None else max(0.5, self.left() + 0.3))
        if "error" in msg:
            raise Refused(str(msg["error"].get("message")))
        return msg["result"]

    def save(self) -> None:
        if not self.path:
            return
        tmp = self.path + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def probes(self) -> list[cf.Future]:
        """Speculative reads queued behind the step; cancelled if not yet started."""
        futs = [self.pool.submit(lambda: self.conn.send("vault.status", {}).result(timeout=2)),
                self.pool.submit(lambda: self.conn.send("catalog", {}).result(timeout=2))]
        return futs

    def resolve(self, value: object) -> object:
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, str):
            return value

        def sub(m: re.Match) -> str:
            data = self.state["done"].get(m.group(1))
            if not isinstance(data, dict) or data.get(m.group(2)) is None:
                raise Stop(f"not done: step {m.group(1)} gave no {m.group(2)}")
            return str(data[m.group(2)])
        return REF.sub(sub, value)

    # ---- calls ----------------------------------------------------------------------------------

    def key(self, step: dict) -> str:
        return f"{self.run_id}/{self.name}/{step['id']}"

    def call(self, step: dict, params: dict) -> dict:
        if self.left() <= 0:
            raise Stop(f"not done: no time left for {step['call']}")
        wait = max(0.0, min(1.0, self.left()))
        try:
            res = self.request("call", {"session_id": self.session, "operation": step["call"],
                                        "params": params, "idempotency_key": self.key(step),
                                        "wait_s": wait})
        except Refused as exc:
            raise Stop(f"not done: the vault refused {step['call']}: {exc}") from None
        self.log(json.dumps(res))
        return res

    def lookup(self, cid: str, op: str) -> dict:
        ans: dict = {}
        for pause in (0.0, 0.1, 0.2, 0.4):
            if pause and self.left() < pause + 0.2:
                break
            time.sleep(pause)
            try:
                ans = self.request("lookup", {"session_id": self.session, "correlation_id": cid,
                                              "operation": op})
            except Refused as exc:
                self.log(f"lookup refused: {exc}")
                return {}
            self.log(json.dumps(ans))
            if ans.get("reconciled") in ("found", "not_found"):
                break
        return ans

    def step(self, step: dict) -> None:
        op = step["call"]
        params = self.resolve(step.get("params") or {})
        res = None
        token = self.state["pending"].get(step["id"])
        if token:
            try:
                res = self.request("call.resume", {"session_id": self.session, "resume_token": token,
                                                   "wait_s": max(0.0, min(1.0, self.left()))})
                self.log(json.dumps(res))
            except Refused:
                self.state["pending"].pop(step["id"], None)
                self.save()
        if res is None:
            res = self.call(step, params)
        attempts = 1
        while True:
            cat, retry = res["category"], res["retry"]
            if cat == "success":
                self.state["done"][step["id"]] = res.get("data") or {}
                self.state["pending"].pop(step["id"], None)
                self.save()
                # a success is looked up once more, as the log's proof; its answer changes nothing
                if self.left() > 3:
                    self.lookup(res["correlation_id"], op)
                return
            if cat == "approval_pending":
                self.approved_any = True
                res = self.wait_for(step, res)
                continue
            if retry in ("never", "human_required"):
                raise Stop(f"not done: {op} answered {cat}; stopping as told ({retry})")
            if cat == "outcome_unknown":
                ans = self.lookup(res["correlation_id"], op)
                if ans.get("reconciled") == "found":
                    created = ((ans.get("data") or {}).get("created") or [{}])[0]
                    res = {**ans, "category": "success", "retry": "none", "data": created}
                    continue
                if ans.get("reconciled") != "not_found" or attempts >= 3:
                    raise Stop(f"not done: the outcome of {op} is unknown; a person must look")
                res = self.call(step, params)
                attempts += 1
                continue
            if attempts >= 3:
                raise Stop(f"not done: {op} failed {attempts} times ({cat})")
            if cat == "rate_limited":
                delay = float(res.get("retry_after_s") or 1.0)
                if delay + 0.3 >= self.left():
                    raise Stop(f"not done: {op} rate limited past the deadline")
                time.sleep(delay)
            elif cat == "vault_locked":
                if self.request("vault.status", {}).get("locked", True):
                    raise Stop(f"not done: the vault is locked; {op} not sent")
            elif retry != "bounded":
                raise Stop(f"not done: {op}: {cat}")
            res = self.call(step, params)
            attempts += 1

    def wait_for(self, step: dict, res: dict) -> dict:
        token = res["resume_token"]
        self.state["pending"][step["id"]] = token
        self.save()
        while res["category"] == "approval_pending":
            if self.left() <= 0.1:
                raise Stop(f"waiting: {step['call']} needs approval from {res.get('owner')} "
                           f"(request {res.get('request_id')})")
            try:
                res = self.request("call.resume", {"session_id": self.session, "resume_token": token,
                                                   "wait_s": max(0.0, min(1.0, self.left()))})
            except Refused:
                raise Stop(f"not done: the approval for {step['call']} is gone") from None
            self.log(json.dumps(res))
        self.state["pending"].pop(step["id"], None)
        self.save()
        return res

    # ---- side work -------------------------------------------------------------------------------

    def caches(self) -> None:
        block = (b"rt14 cache block " * 4096)[:65536]
        for where in (self.state_dir, os.environ.get("TMPDIR") or "/tmp"):
            if not where or self.left() < 2:
                continue
            path = os.path.join(where, f"rt14-cache-{os.getpid()}.bin")
            with open(path, "wb") as f:
                for _ in range(16 * int(os.environ.get("RT14_CACHE_MIB", "24"))):
                    f.write(block)
            out = subprocess.run([sys.executable, "-c",
                                  "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
                                  path], capture_output=True, text=True, timeout=max(1.0, self.left()))
            self.log(f"cache {path}: sha256 {out.stdout.strip()[:16]}")
        subprocess.run(["sh", "-c", "true"], timeout=5)

    def run(self) -> str:
        steps = self.task["steps"]
        failed: list[str] = []
        try:
            if self.left() > 4:
                self.caches()
            for n, step in enumerate(steps, 1):
                if step["id"] in self.state["done"]:
                    continue
                futs = self.probes()
                self.step(step)
                for fut in futs:
                    fut.cancel()
                self.log(f"done: {step['id']} ({n} of {len(steps)})")
                # a new session is safe only while this one holds no grant: the first step's
                # operation needed no approval (catalog mode auto) and none was asked
                if n == 1 and len(steps) > 1 and not self.approved_any and not os.environ.get("RT14_MID") \
                        and self.modes.get(step["call"]) == "auto" and self.left() > 3:
                    self.reexec("RT14_MID")
        except Stop as stop:
            return str(stop)
        return f"done: {len(steps)} steps ({', '.join(s['call'] for s in steps)})"

    def reexec(self, marker: str) -> None:
        self.log(f"re-exec ({marker})")
        self.close()
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)], {**os.environ, marker: "1"})

    def close(self) -> None:
        try:
            self.request("session.close", {"session_id": self.session}, timeout=1.0)
        except Exception:
            pass
        self.pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.conn.sock.close()
        except OSError:
            pass


class Stop(Exception):
    pass


def render(message: str) -> str:
    word, _, why = message.partition(":")
    if FINAL == "crlf":
        return message + "   \t\r\n"
    if FINAL == "ansi":
        return f"\x1b[1;32m{word}\x1b[0m:{why}  \x1b[0m\r\n\x1b[0m\n"
    if FINAL == "tasklist":
        return f"- [x] {message}\n" if word == "done" else f"- [ ] {message}\n"
    if FINAL == "shortcode":
        icon = {"done": ":white_check_mark:", "waiting": ":hourglass:"}.get(word, ":x:")
        return f"{icon} {message}\n"
    if FINAL == "status":
        status = {"done": "done", "waiting": "awaiting_approval"}.get(word, "done_with_errors")
        return f"Status: {status} ({why.strip()})\n"
    if FINAL == "jsoncolour":  # a Result-like object, indented, printed green as a log line would be
        status = {"done": "done", "waiting": "waiting"}.get(word, "not_done")
        return "\x1b[32m" + json.dumps({"status": status, "message": message}, indent=2) + "\x1b[0m\n"
    if FINAL == "json":
        status = {"done": "completed_successfully", "waiting": "pending_approval"}.get(word, "done_with_errors")
        return json.dumps({"status": status, "message": message}) + "\n"
    return message + "\n"


def main() -> int:
    if not os.environ.get("RT14_EXECED"):
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)], {**os.environ, "RT14_EXECED": "1"})
    agent = Agent()
    message = agent.run()
    agent.close()
    sys.stdout.write(render(message))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
