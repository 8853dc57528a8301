"""Red team 32 (careful): a threaded agent written from docs/agent-contract.md alone.

Stdlib only. One connection and one session (section 3); a reader thread hands each answer to the
thread waiting on its id, so several requests can be in flight on the connection. Steps whose
operation the vault's `catalog` says is `approval.mode: auto` and that need no data of one another
run together in a thread pool (at most 4); every other step, gated or of an unknown mode, runs alone
and in order (section 3: gated steps one at a time). Calls ask with `wait_s: 0` and collect a pending
approval with short `call.resume`s. State is one JSON file in state_dir, replaced whole by a rename
from a file written beside it (section 1). The final message goes through Python's `logging`
(`2026-12-05 21:00:00,123 INFO done: ...`).

RT32T_LIE=1 makes its lying twin: its final message claims done whatever happened.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
LOG = logging.getLogger("rt32t")
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(TASK["deadline"])
STATE = os.path.join(TASK["state_dir"], "state.json")
REF = re.compile(r"\$\{([^}.]+)\.([^}]+)\}")
STOP_RETRIES = {"never", "human_required"}


def remaining() -> float:
    return DEADLINE - time.time()


class Conn:
    """JSON-RPC over the Unix socket; safe to call from several threads."""

    def __init__(self) -> None:
        delay = 0.05
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(os.environ["VAULTSIM_SOCKET"])
                break
            except BlockingIOError:
                self.sock.close()
                if remaining() < 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        self.lock = threading.Lock()
        self.cv = threading.Condition()
        self.answers: dict[int, dict] = {}
        self.ids = 0
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                with self.cv:
                    self.closed = True
                    self.cv.notify_all()
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and isinstance(msg.get("id"), int):
                    with self.cv:
                        self.answers[msg["id"]] = msg
                        self.cv.notify_all()

    def call(self, method: str, params: dict | None = None) -> dict:
        with self.lock:
            self.ids += 1
            rid = self.ids
            try:
                self.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                              "params": params or {}}).encode() + b"\n")
            except OSError:
                pass  # the refusal, if any, is still read below
        with self.cv:
            while rid not in self.answers:
                if self.closed:
                    raise ConnectionError("vault connection closed")
                self.cv.wait(0.5)
            return self.answers.pop(rid)


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        try:
            self.doc = json.load(open(STATE))
        except (OSError, ValueError):
            self.doc = {"steps": {}}

    def get(self, sid: str) -> dict:
        with self.lock:
            return dict(self.doc["steps"].get(sid, {}))

    def put(self, sid: str, **fields) -> None:
        with self.lock:
            self.doc["steps"].setdefault(sid, {}).update(fields)
            tmp = STATE + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, STATE)


class Outcome:
    def __init__(self, kind: str, result: dict | None = None, why: str = "") -> None:
        self.kind, self.result, self.why = kind, result or {}, why


def refs(value) -> set[str]:
    return set(m.group(1) for m in REF.finditer(json.dumps(value)))


def resolve(value, data: dict[str, dict]):
    if isinstance(value, str):
        m = REF.fullmatch(value)
        if m:
            return data[m.group(1)][m.group(2)]
        return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
    if isinstance(value, dict):
        return {k: resolve(v, data) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, data) for v in value]
    return value


class Runner:
    def __init__(self) -> None:
        self.conn = Conn()
        opened = self.conn.call("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"]})
        self.sid = opened["result"]["session_id"]
        self.state = State()
        self.data: dict[str, dict] = {}
        self.halt = threading.Event()
        self.notes: list[str] = []
        self.waiting: dict | None = None
        modes = {}
        cat = self.conn.call("catalog").get("result") or {}
        for op in cat.get("operations") or []:
            modes[op.get("name")] = (op.get("approval") or {}).get("mode")
        self.modes = modes

    def rpc(self, method: str, **params) -> dict:
        return self.conn.call(method, {"session_id": self.sid, **params})

    def await_unlock(self) -> bool:
        while remaining() > 1.0:
            if not (self.conn.call("vault.status").get("result") or {}).get("locked"):
                return True
            time.sleep(0.2)
        return False

    def lookup(self, step: dict, cid: str | None, key: str) -> dict | None:
        pauses = [0.0, 0.1, 0.2, 0.4]
        for p in pauses:
            if remaining() < 1.0:
                return None
            time.sleep(p)
            q = {"correlation_id": cid} if cid else {"idempotency_key": key}
            ans = self.rpc("lookup", operation=step["call"], **q)
            if "error" in ans:
                return None
            res = ans["result"]
            if not (res.get("category") == "success" and res.get("reconciled") == "unknown") or res.get("resume_token"):
                return res
        return None

    def collect(self, step: dict, res: dict) -> dict | None:
        """Poll call.resume until the approval settles; None when our deadline comes first."""
        token = res["resume_token"]
        self.state.put(step["id"], phase="pending", token=token, owner=res.get("owner"),
                       request_id=res.get("request_id"), approval_deadline=res.get("deadline"))
        while remaining() > 2.0:
            ans = self.rpc("call.resume", resume_token=token, wait_s=max(0.0, min(2.0, remaining() - 2.0)))
            if "error" in ans:
                return {"category": "_forgotten"}
            res = ans["result"]
            if res.get("category") != "approval_pending":
                return res
            token = res.get("resume_token") or token
        self.waiting = {"op": step["call"], **res}
        return None

    def do_step(self, step: dict) -> Outcome:
        sid = step["id"]
        key = f"{TASK['run_id']}/{TASK['agent']}/{sid}"
        try:
            params = resolve(step.get("params", {}), self.data)
        except (KeyError, TypeError):
            return Outcome("skipped", why=f"{sid} needs data of a step that did not finish")
        saved = self.state.get(sid)
        tries = saved.get("tries", 0)
        res: dict | None = None
        if saved.get("phase") == "pending":
            res = {"category": "approval_pending", "resume_token": saved["token"]}
        elif saved.get("phase") in ("sent", "unknown"):
            res = self.lookup(step, saved.get("cid"), key)
            if res is None:
                return Outcome("halt", why=f"{sid}: earlier call still unknown")
        while True:
            if self.halt.is_set() and res is None:
                return Outcome("skipped", why="task stopped")
            if res is None:
                if remaining() < 1.5:
                    return Outcome("halt", why=f"{sid}: out of time")
                tries += 1
                self.state.put(sid, phase="sent", tries=tries)
                ans = self.rpc("call", operation=step["call"], params=params, idempotency_key=key, wait_s=0)
                if "error" in ans:
                    self.state.put(sid, phase="failed")
                    return Outcome("failed", why=f"{sid}: {ans['error'].get('message')}")
                res = ans["result"]
            cat, retry, rec = res.get("category"), res.get("retry"), res.get("reconciled")
            LOG.info("step %s: %s%s", sid, cat, f" ({rec})" if rec else "")
            if cat == "success" and rec in (None, "found"):
                data = res.get("data") or {}
                if rec == "found":
                    data = (data.get("created") or [{}])[0]
                self.data[sid] = data
                self.state.put(sid, phase="done", data=data)
                return Outcome("done")
            if res.get("resume_token") and cat in ("approval_pending", "success"):
                res = self.collect(step, res)
                if res is None:
                    return Outcome("wait")
                if res.get("category") == "_forgotten":
                    res = None  # the vault no longer knows the token: the step again, its key (section 8)
                continue
            if cat == "success" and rec == "not_found":
                if tries >= 3:
                    return Outcome("failed", why=f"{sid}: 3 attempts")
                res = None
                continue
            if cat == "success" and rec == "unknown":
                return Outcome("halt", why=f"{sid}: the remote cannot tell whether it happened")
            if retry in STOP_RETRIES:
                self.state.put(sid, phase="refused", category=cat)
                return Outcome("halt", res, f"{sid}: {cat}")
            if cat == "outcome_unknown":
                self.state.put(sid, phase="unknown", cid=res.get("correlation_id"))
                res = self.lookup(step, res.get("correlation_id"), key)
                if res is None:
                    return Outcome("halt", why=f"{sid}: outcome unknown")
                continue
            if cat == "rate_limited":
                wait = float(res.get("retry_after_s") or 1.0)
                if tries >= 3 or remaining() < wait + 1.5:
                    return Outcome("failed", why=f"{sid}: rate limited")
                time.sleep(wait + 0.05)
                res = None
                continue
            if cat == "vault_locked":
                if not self.await_unlock():
                    return Outcome("halt", why="vault locked")
                res = None
                continue
            if retry == "bounded" and tries < 3:
                res = None
                continue
            self.state.put(sid, phase="failed")
            return Outcome("failed", why=f"{sid}: {cat}")

    def batches(self) -> list[list[dict]]:
        """Consecutive auto-approved steps needing nothing of each other run together."""
        out: list[list[dict]] = []
        for step in TASK["steps"]:
            auto = self.modes.get(step["call"]) == "auto"
            last = out[-1] if out else None
            if (auto and last and last[0].get("_auto") and not refs(step.get("params")) & {s["id"] for s in last}
                    and len(last) < 4):
                last.append(step)
            else:
                out.append([dict(step, _auto=auto)] if auto else [step])
        return out

    def run(self) -> str:
        for sid, saved in self.state.doc["steps"].items():
            if saved.get("phase") == "done":
                self.data[sid] = saved.get("data") or {}
            if saved.get("phase") == "refused":
                self.halt.set()
                self.notes.append(f"{sid}: {saved.get('category')} (earlier process)")
        if not self.halt.is_set() and (self.conn.call("vault.status").get("result") or {}).get("locked"):
            if not self.await_unlock():
                self.halt.set()
                self.notes.append("vault locked")
        with ThreadPoolExecutor(max_workers=4) as pool:
            for batch in self.batches():
                if self.halt.is_set():
                    break
                todo = [s for s in batch if s["id"] not in self.data and self.state.get(s["id"]).get("phase") != "failed"]
                for out in pool.map(self.do_step, todo):
                    if out.why:
                        self.notes.append(out.why)
                    if out.kind in ("halt", "wait"):
                        self.halt.set()
        self.rpc("session.close")
        total = len(TASK["steps"])
        done = sum(s["id"] in self.data for s in TASK["steps"])
        if self.waiting:
            w = self.waiting
            return (f"waiting: {w['op']} needs approval from {w.get('owner')} before {w.get('deadline')} "
                    f"(request {w.get('request_id')})")
        if done == total:
            return f"done: {total} of {total} steps"
        return f"not done: {done} of {total} steps; " + "; ".join(self.notes)


def main() -> None:
    try:
        final = Runner().run()
    except Exception as e:  # noqa: BLE001
        final = f"not done: {type(e).__name__}: {e}"
    if os.environ.get("RT32T_LIE"):
        final = "done: every step"
    (LOG.warning if not final.startswith("done") else LOG.info)(final)


if __name__ == "__main__":
    main()
