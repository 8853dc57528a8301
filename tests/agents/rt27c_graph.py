#!/usr/bin/env python3
"""A careful framework-style agent, written from docs/agent-contract.md alone (stdlib only).

Shaped the way LangGraph or an OpenAI function-calling loop is written: a graph of nodes
(`discover` -> `plan` -> `call_tool` -> `observe` -> back to `plan` ... -> `finish`), a state
object the nodes return updates to, and a checkpointer that writes that state to a JSON file in
state_dir after every node (written in state_dir itself, fsync'd, renamed over the old one: a
rename from /tmp fails in the jail, §1). Every vault call goes through the one `call_tool` node.

The planner knows nothing of scenarios: it reads the task's steps and `catalog`, and the vault's
`catalog` method (§3), and decides which steps are ready. Reads the vault approves without asking
(`mutates: false`, `approval.mode: auto`) that need no data of each other go out together, each in
a worker thread on the one session (§3 allows 64 requests in flight); every other step is a gated
step sent alone, the next one once it settled (§3).

Logs: JSON lines on stderr. Final answer: one JSON object on stdout with `status` (§7).

Knobs:
  RT27_WAIT=poll                  `wait_s: 0` and `call.resume` polled (§3); else blocking waits
  RT27_CRASH=after_first_success  the process exits hard (os._exit) right after the checkpoint of
                                  its first successful step; a supervisor (this same file, the
                                  parent) starts it again, and it resumes from the checkpoint
  RT27_CRASH=lost_answer          the same, but as the first success arrives, before it is kept:
                                  the restart finds the step `sent` and looks it up by its key
  RT27_FINAL=state                the final answer as a graph's final state dumped whole: `status` first,
                                  then each step with its own `status` and data, indented
  RT27_CRASH=pending              the same, as its first call is answered approval_pending (the token
                                  kept): the restart collects it with call.resume in its new session
  RT27_LOOKFIRST=1                a write the catalog says is not idempotent is looked up by its
                                  key before its first call too (a predecessor may have sent it)
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

TASK_PATH = os.environ["VAULTSIM_TASK"]
TASK = json.load(open(TASK_PATH, encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
CKPT = os.path.join(TASK["state_dir"], "rt27c-graph.ckpt.json")
MARGIN = 1.0  # seconds kept before the deadline to hand over and exit
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable", "rpc_error"}
BOUNDED = {"local_failure", "confirmed_failure", "rate_limited"}
CRASH = os.environ.get("RT27_CRASH", "")
LOOKFIRST = os.environ.get("RT27_LOOKFIRST") == "1"
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def log(event: str, **fields: object) -> None:
    rec = {"ts": round(time.time(), 3), "level": "info", "event": event, "pid": os.getpid(), **fields}
    sys.stderr.write(json.dumps(rec) + "\n")
    sys.stderr.flush()


def left() -> float:
    return DEADLINE - time.time()


# ---------------------------------------------------------------- checkpointer

class Checkpointer:
    """The graph's state, persisted after every node (a restart reads it back)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        try:
            with open(CKPT, encoding="utf-8") as f:
                self.state = json.load(f)
        except (OSError, ValueError):
            self.state = {"steps": {}, "node": "start", "crashed": False}

    def put(self, node: str, sid: str | None = None, entry: dict | None = None) -> None:
        with self.lock:  # worker threads checkpoint too: one writer at a time
            if sid is not None:
                self.state["steps"][sid] = entry
            self.state["node"] = node
            self._write()

    def _write(self) -> None:
        tmp = CKPT + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, CKPT)
        dfd = os.open(os.path.dirname(CKPT), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# ---------------------------------------------------------------- the vault client

class Vault:
    """One connection for the process's one session; a reader thread matches answers by id."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["VAULTSIM_SOCKET"])
        self.lock = threading.Lock()
        self.waiters: dict[int, tuple[threading.Event, list[dict]]] = {}
        self.next_id = 0
        self.sid: str | None = None
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                with self.lock:
                    w = self.waiters.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                if w is not None:
                    w[1].append(msg)
                    w[0].set()
        with self.lock:
            for ev, box in self.waiters.values():
                box.append({"error": {"code": -1, "message": "connection closed"}})
                ev.set()
            self.waiters.clear()

    def rpc(self, method: str, params: dict) -> dict:
        if left() <= 0.2:
            return {"ok": False, "category": "deadline", "message": "no time left"}
        ev, box = threading.Event(), []
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            self.waiters[rid] = (ev, box)
        line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n"
        try:
            with self.lock:
                self.sock.sendall(line.encode())
        except OSError as exc:
            return {"ok": False, "category": "rpc_error", "message": f"send failed: {exc}"}
        # the vault answers a held call by its wait_s, which ends before the deadline
        if not ev.wait(max(0.1, left() - 0.1)):
            return {"ok": False, "category": "deadline", "message": "no answer before the deadline"}
        msg = box[0]
        if "error" in msg:
            return {"ok": False, "category": "rpc_error", "retry": "never", "message": str(msg["error"])}
        return msg.get("result") or {}


# ---------------------------------------------------------------- tools (the only door to the vault)

class Tools:
    def __init__(self, vault: Vault, catalog: dict) -> None:
        self.vault = vault
        self.catalog = catalog
        self.poll = os.environ.get("RT27_WAIT") == "poll"

    def wait_s(self) -> float:
        return 0.0 if self.poll else max(0.0, min(10.0, left() - MARGIN - 0.3))

    def call_tool(self, name: str, args: dict) -> dict:
        """The one node that speaks to the vault: name is a JSON-RPC method, args its params."""
        params = dict(args)
        if name in ("call", "call.resume", "lookup", "call.cancel", "session.close"):
            params["session_id"] = self.vault.sid
        if name in ("call", "call.resume"):
            params["wait_s"] = self.wait_s()
        started = time.time()
        out = self.vault.rpc(name, params)
        log("tool", method=name, operation=args.get("operation"), category=out.get("category"),
            reconciled=out.get("reconciled"), took=round(time.time() - started, 3))
        return out


# ---------------------------------------------------------------- nodes

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


def needs(step: dict) -> set[str]:
    return {m.group(1) for m in REF.finditer(json.dumps(step.get("params", {})))}


class Graph:
    def __init__(self, ckpt: Checkpointer) -> None:
        self.ckpt = ckpt
        self.st = ckpt.state
        self.steps: dict = self.st["steps"]
        self.tools: Tools | None = None
        self.info: dict[str, dict] = {}
        self.stop_reason: str | None = None
        self.wait_reason: str | None = None
        self.presaved: set[str] = set()
        self.barrier = threading.Barrier(1)

    # discover: the session, the gate's state and the vault's catalog
    def discover(self) -> str:
        vault = Vault()
        got = vault.rpc("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"],
                                         "client": {"name": "rt27c-graph", "version": "1"}})
        vault.sid = got.get("session_id")
        if not vault.sid:
            self.stop_reason = f"no session: {got.get('message')}"
            return "finish"
        self.tools = Tools(vault, {})
        cat = self.tools.call_tool("catalog", {})
        for entry in cat.get("operations") or []:
            if isinstance(entry, dict) and entry.get("name"):
                self.info[entry["name"]] = entry
        for name, entry in (TASK.get("catalog") or {}).items():
            self.info.setdefault(name, {**entry, "name": name})
        log("discovered", operations=sorted(self.info))
        return "plan"

    def ungated_read(self, op: str) -> bool:
        e = self.info.get(op, {})
        return e.get("mutates") is False and (e.get("approval") or {}).get("mode") == "auto"

    def done_data(self) -> dict:
        return {k: v.get("data") for k, v in self.steps.items() if v.get("state") == "done"}

    # plan: which steps go next (a batch of ungated reads, or one step)
    def plan(self) -> tuple[str, list[dict]]:
        if self.stop_reason or self.wait_reason:
            return "finish", []
        batch: list[dict] = []
        for step in TASK["steps"]:
            entry = self.steps.get(step["id"], {})
            state = entry.get("state")
            if state in ("done", "skipped", "gave_up"):
                continue
            if state == "stopped":
                self.stop_reason = entry.get("why", "stopped")
                return "finish", []
            if step["call"] not in (TASK.get("operations") or []):
                self.steps[step["id"]] = {"state": "skipped", "why": f"{step['call']} is not allowed"}
                continue
            missing = needs(step) - set(self.done_data())
            if missing:
                self.steps[step["id"]] = {"state": "skipped", "why": f"no data of {sorted(missing)}"}
                continue
            if batch and (not self.ungated_read(step["call"]) or state or needs(step) & {b["id"] for b in batch}):
                break
            batch.append(step)
            if not self.ungated_read(step["call"]) or state:
                break  # a gated step, or one a predecessor left half-done, goes alone
        return ("call_tool", batch) if batch else ("finish", [])

    # call_tool + observe for one step: from wherever a predecessor left it to a settled answer
    def run_step(self, step: dict) -> dict:
        assert self.tools is not None
        sid, op = step["id"], step["call"]
        key = f"{TASK['run_id']}:{TASK['agent']}:{sid}"
        params = substitute(step.get("params", {}), self.done_data())
        entry = dict(self.steps.get(sid, {}))
        attempts = int(entry.get("attempts", 0))
        res: dict | None = None
        looked = False  # a lookup just answered: the next send needs no other
        mutating = self.info.get(op, {}).get("mutates", True) is not False
        idempotent = self.info.get(op, {}).get("idempotent") is True
        presaved = sid in self.presaved  # marked sent with its batch, in one save
        self.presaved.discard(sid)
        if presaved:
            pass
        elif entry.get("state") == "pending" and entry.get("token"):
            res = self.collect(entry["token"], None)
            if res.get("category") == "rpc_error":
                res = None  # the vault no longer knows the token: call the step again, with its key (§8)
        elif entry.get("state") == "sent" or (LOOKFIRST and mutating and not idempotent):
            # a predecessor's answer was lost (or, LOOKFIRST, might have been): ask before sending
            res = self.reconcile(op, {"idempotency_key": key})
            looked = True
            if res.get("category") == "local_failure" and res.get("reconciled") == "not_found":
                res = None
        while True:
            if res is None:
                if left() < MARGIN:
                    return {"category": "deadline", "message": "no time left to send it"}
                if attempts and mutating and not idempotent and not looked:
                    look = self.reconcile(op, {"idempotency_key": key})  # §6: before any resend
                    if look.get("category") != "local_failure":
                        res = look
                        continue
                looked = False
                if presaved:
                    presaved = False  # the batch's save holds this first attempt
                    try:
                        self.barrier.wait(timeout=max(0.1, left() - MARGIN))  # the batch goes out together
                    except threading.BrokenBarrierError:
                        pass
                else:
                    attempts += 1
                    self.save_step(sid, {"state": "sent", "attempts": attempts})
                res = self.tools.call_tool("call", {"operation": op, "params": params, "idempotency_key": key})
                if CRASH == "lost_answer" and res.get("category") == "success" and not self.st.get("crashed"):
                    self.st["crashed"] = True  # the answer came, and the process dies before keeping it
                    self.ckpt.put("crash")
                    log("crash", why="RT27_CRASH=lost_answer")
                    os._exit(70)
            cat = res.get("category")
            if cat == "approval_pending" and res.get("resume_token"):
                self.save_step(sid, {"state": "pending", "attempts": attempts, "token": res["resume_token"],
                                     "owner": res.get("owner"), "request_id": res.get("request_id")})
                if CRASH == "pending" and not self.st.get("crashed"):
                    self.st["crashed"] = True  # dies while a person decides: the restart resumes the token
                    self.ckpt.put("crash")
                    log("crash", why="RT27_CRASH=pending")
                    os._exit(70)
                res = self.collect(res["resume_token"], res)
                if res.get("category") == "approval_pending":
                    return res
                continue
            if cat == "outcome_unknown":
                res = self.reconcile(op, {"correlation_id": res.get("correlation_id")} if res.get("correlation_id")
                                     else {"idempotency_key": key})
                if res.get("category") == "local_failure" and attempts >= 3:
                    return res
                if res.get("category") == "local_failure":
                    res, looked = None, True
                continue
            if cat == "vault_locked":
                while left() > MARGIN and self.tools.call_tool("vault.status", {}).get("locked", True):
                    time.sleep(min(0.25, max(0.0, left() - MARGIN)))
                if left() <= MARGIN:
                    return res
                res = None
                continue
            if cat in BOUNDED:
                if attempts >= 3:
                    return res
                if cat == "rate_limited":
                    delay = float(res.get("retry_after_s") or 1.0)
                    if delay > left() - MARGIN - 0.2:
                        return res
                    time.sleep(delay)
                res = None
                continue
            return res

    def collect(self, token: str, first: dict | None) -> dict:
        """call.resume until it settles or the deadline is near (§4 approval_pending)."""
        assert self.tools is not None
        res = first or {"category": "approval_pending", "resume_token": token}
        pause = 0.1
        while res.get("category") == "approval_pending" and left() > MARGIN + 0.3:
            if self.tools.poll:
                time.sleep(min(pause, max(0.0, left() - MARGIN - 0.3)))
                pause = min(1.0, pause * 2)
                if left() <= MARGIN + 0.3:
                    break
            res = self.tools.call_tool("call.resume", {"resume_token": token})
        if res.get("category") == "approval_pending":
            res.setdefault("resume_token", token)
        return res

    def reconcile(self, op: str, by: dict) -> dict:
        """lookup (§6), a few times while it says `unknown`; answers a result to act on."""
        assert self.tools is not None
        last: dict = {}
        for pause in (0.0, 0.1, 0.2, 0.4):
            time.sleep(pause)
            if left() < MARGIN + 0.5:
                break
            last = self.tools.call_tool("lookup", {"operation": op, **by})
            cat = last.get("category")
            if cat not in ("success", None):
                if cat == "rate_limited":  # still waiting out its Retry-After: not sent again yet
                    return last
                return last  # the call's own answer again: read before `reconciled` (§6)
            if last.get("reconciled") == "found":
                data = last.get("data") or {}
                created = data.get("created") if isinstance(data, dict) else None
                first = created[0] if isinstance(created, list) and created and isinstance(created[0], dict) else {}
                return {**last, "category": "success", "data": first}
            if last.get("reconciled") == "not_found":
                return {**last, "category": "local_failure"}
            if last.get("resume_token"):
                return self.collect(last["resume_token"], {**last, "category": "approval_pending"})
        # still unknown: a person must inspect it (§6); a category of our own ends the step
        return {"category": "unresolved", "reconciled": "unknown",
                "message": last.get("message", "no answer to the lookup")}

    def save_step(self, sid: str, entry: dict) -> None:
        self.ckpt.put(f"call_tool:{sid}", sid, entry)

    def observe(self, step: dict, res: dict) -> None:
        sid, op, cat = step["id"], step["call"], res.get("category")
        if cat == "success":
            data = res.get("data")
            self.steps[sid] = {"state": "done", "data": data if isinstance(data, dict) else {}}
        elif cat == "approval_pending":
            self.wait_reason = (f"{op} needs approval from {res.get('owner')} before {res.get('deadline')} "
                                f"(request {res.get('request_id')})")
        elif cat in ("local_failure", "confirmed_failure"):
            self.steps[sid] = {"state": "gave_up", "why": f"{op}: {cat} after 3 attempts"}
        else:
            self.steps[sid] = {"state": "stopped", "why": f"{op}: {cat}"}
            self.stop_reason = f"{op}: {cat}"

    def finish(self) -> dict:
        answer = self._claim()
        answer["steps"] = [{"id": s["id"], "call": s["call"],
                            "status": self.steps.get(s["id"], {}).get("state", "not_started"),
                            "data": self.steps.get(s["id"], {}).get("data")} for s in TASK["steps"]]
        return answer

    def _claim(self) -> dict:
        n = sum(1 for s in TASK["steps"] if self.steps.get(s["id"], {}).get("state") == "done")
        total = len(TASK["steps"])
        if self.wait_reason:
            return {"status": "waiting", "message": self.wait_reason}
        if n == total and not self.stop_reason:
            return {"status": "done", "message": f"all {total} steps succeeded"}
        why = self.stop_reason or "; ".join(v.get("why", "") for v in self.steps.values() if v.get("why"))
        return {"status": "not_done", "message": f"{n} of {total} steps done; {why or 'stopped'}"}

    def run(self) -> dict:
        crash = CRASH == "after_first_success" and not self.st.get("crashed")
        node = self.discover()
        self.ckpt.put("discover")
        pool = ThreadPoolExecutor(max_workers=8)
        while node != "finish":
            node, batch = self.plan()
            self.ckpt.put("plan")
            if node == "finish":
                break
            log("call_tool", steps=[s["id"] for s in batch])
            if len(batch) == 1:
                results = [self.run_step(batch[0])]
            else:
                for s in batch:  # marked sent in one save, so the reads go out together
                    self.steps[s["id"]] = {"state": "sent", "attempts": 1}
                self.ckpt.put("call_tool")
                self.presaved = {s["id"] for s in batch}
                self.barrier = threading.Barrier(len(batch))
                results = list(pool.map(self.run_step, batch))
            for step, res in zip(batch, results):
                self.observe(step, res)
            self.ckpt.put("observe")
            if crash and any(self.steps.get(s["id"], {}).get("state") == "done" for s in batch):
                self.st["crashed"] = True
                self.ckpt.put("observe")
                log("crash", why="RT27_CRASH=after_first_success")
                os._exit(70)
            node = "plan"
        pool.shutdown(wait=False)
        answer = self.finish()
        if self.tools is not None and self.tools.vault.sid and left() > 0.5:
            self.tools.call_tool("session.close", {})
        return answer


def supervise() -> int:
    """The supervisor: starts the graph process and starts it again after a hard exit."""
    env = dict(os.environ, RT27_SUPERVISED="1")
    for attempt in range(3):
        code = subprocess.call([sys.executable, os.path.abspath(__file__)], env=env)
        log("supervisor", child_exit=code, attempt=attempt)
        if code != 70 or left() < MARGIN + 0.5:
            return 0
    return 0


def main() -> int:
    if os.environ.get("RT27_CRASH") and not os.environ.get("RT27_SUPERVISED"):
        return supervise()
    answer = Graph(Checkpointer()).run()
    log("final", **answer)
    if os.environ.get("RT27_FINAL") == "state":
        print(json.dumps(answer, indent=2), flush=True)
    else:
        print(json.dumps({k: answer[k] for k in ("status", "message")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
