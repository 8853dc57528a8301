"""Red team 43c: what every rt43c agent shares, written from docs/agent-contract.md alone (stdlib).

A step is a generator (`step_flow`) that yields what it needs done: ("send", method, params) for a
request, ("sleep", s) for a pause, ("save", record) to keep the step's state in state_dir. Each
agent drives it its own way (asyncio, threads, worker processes, one at a time), so the contract's
rules are written once: the key RUN:AGENT:STEP on every call and resend, a lookup before anything
else after `outcome_unknown`, a pending approval resumed until settled or the deadline is near,
`retry_after_s` waited out from the answer, at most 3 attempts, `never` answers stop the task.
`Plan` says which steps may start: a step once the steps it names (`${ID.FIELD}`) are done; gated
steps (approval mode session/per_call) one at a time and in order (contract section 3); two steps
alike (one operation, the same parameters) in order (section 9: the one done first is the earlier).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Generator
from typing import Any

NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
MARGIN = 1.2                  # seconds kept before the deadline: stop sending, hand over, exit
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")

Op = tuple[Any, ...]
Flow = Generator[Op, Any, tuple[str, Any]]


def log(*parts: object) -> None:
    print("rt43c:", *parts, file=sys.stderr, flush=True)


class RpcError(Exception):
    """The vault answered with a JSON-RPC error: nothing was done."""


class TooLate(Exception):
    """The deadline is too near to send anything more."""


def load_task() -> dict[str, Any]:
    with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
        task: dict[str, Any] = json.load(f)
    return task


def left(task: dict[str, Any]) -> float:
    return float(task["deadline"]) - time.time() - MARGIN


def key_of(task: dict[str, Any], sid: str) -> str:
    return f"{task['run_id']}:{task['agent']}:{sid}"


def refs(value: Any) -> set[str]:
    if isinstance(value, str):
        return {m.group(1) for m in REF.finditer(value)}
    if isinstance(value, dict):
        return set().union(*(refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(refs(v) for v in value)) if value else set()
    return set()


def fill(value: Any, done: dict[str, Any]) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            return str(done[m.group(1)][m.group(2)])
        return REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: fill(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, done) for v in value]
    return value


class Store:
    """One file per step in state_dir, each replaced all at once (written in state_dir itself:
    a rename from /tmp fails across the jail's mounts), so several processes can keep steps."""

    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir
        os.makedirs(state_dir, exist_ok=True)

    def _path(self, sid: str) -> str:
        return os.path.join(self.dir, "step-" + hashlib.sha256(sid.encode()).hexdigest()[:24] + ".json")

    def get(self, sid: str) -> dict[str, Any]:
        try:
            with open(self._path(sid), encoding="utf-8") as f:
                rec: dict[str, Any] = json.load(f)
                return rec
        except (OSError, ValueError):
            return {"sid": sid}

    def put(self, rec: dict[str, Any]) -> None:
        path = self._path(rec["sid"])
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(rec, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def created_data(res: dict[str, Any]) -> dict[str, Any]:
    data = res.get("data") or {}
    created = data.get("created") if isinstance(data, dict) else None
    if isinstance(created, list) and created and isinstance(created[0], dict):
        return dict(created[0])
    return dict(data) if isinstance(data, dict) else {}


def step_flow(task: dict[str, Any], step: dict[str, Any], params: dict[str, Any],
              rec: dict[str, Any]) -> Flow:
    """One logical step. Returns ("done", data), ("waiting", token), ("failed", why): later steps
    that need nothing of it may run, or ("stop", why): the task ends (section 4)."""
    sid, op = step["id"], step["call"]
    key = key_of(task, sid)
    attempts = int(rec.get("attempts", 0))       # a restart's predecessor's attempts count too
    res: dict[str, Any] | None = None

    def lookup(ref: dict[str, Any]) -> Flow:
        pauses = [0.1, 0.2, 0.4]
        while True:
            got: dict[str, Any] = yield ("send", "lookup", {**ref, "operation": op})
            recon, cat = got.get("reconciled"), got.get("category")
            if recon in ("found", "not_found"):
                return ("res", got)
            # unknown: a never answer stops; a pace says wait; a pending call is collected
            if cat in NEVER or got.get("retry") in ("never", "human_required"):
                return ("res", got)
            if got.get("resume_token"):
                return ("res", got)
            if cat == "rate_limited":
                wait = float(got.get("retry_after_s") or 0.5)
                if wait > left(task):
                    return ("stop", f"{sid}: its outcome is unknown and the lookups' pace outlasts the deadline")
                yield ("sleep", wait)
                continue
            if not pauses or pauses[0] > left(task):
                return ("stop", f"{sid}: outcome unknown after lookups; a person must inspect it")
            yield ("sleep", pauses.pop(0))

    def collect(token: str) -> Flow:
        """Resume a pending call until it settles, or hand it over near the deadline."""
        rec["pending"] = token
        yield ("save", rec)
        while True:
            wait = min(5.0, left(task) - 0.5)
            if wait <= 0.2:
                return ("waiting", token)
            got: dict[str, Any] = yield ("send", "call.resume", {"resume_token": token, "wait_s": round(wait, 2)})
            if got.get("category") != "approval_pending":
                rec.pop("pending", None)
                yield ("save", rec)
                return ("res", got)

    if rec.get("pending"):                       # a predecessor's wait: collect it, never ask again
        try:
            kind, val = yield from collect(rec["pending"])
        except RpcError:                         # the vault no longer knows it: call again, same key
            rec.pop("pending", None)
            kind, val = "res", None
        if kind != "res":
            return kind, val
        res = val
    elif rec.get("sent"):                        # sent, its answer never kept: look it up first
        kind, val = yield from lookup({"idempotency_key": key})
        if kind != "res":
            return kind, val
        res = val

    while True:
        if res is None:
            if attempts >= 3:
                return ("failed", f"{sid}: 3 attempts without success")
            if left(task) <= 0.3:
                return ("failed", f"{sid}: no time left to send it")
            attempts += 1
            rec["sent"], rec["attempts"] = True, attempts
            yield ("save", rec)
            wait = max(0.0, min(5.0, left(task) - 0.5))
            res = yield ("send", "call", {"operation": op, "params": params, "idempotency_key": key,
                                          "wait_s": round(wait, 2)})
        assert res is not None
        cat, recon = res.get("category"), res.get("reconciled")
        if recon is not None:                    # a lookup's answer: category first (section 6)
            if recon == "found" and cat == "success":
                data = created_data(res)
                return ("done", data)
            if recon == "not_found" and cat == "success":
                res = None                       # not done: send it again, same key
                continue
            if recon == "unknown" and res.get("resume_token"):
                kind, val = yield from collect(res["resume_token"])
                if kind != "res":
                    return kind, val
                res = val
                continue
            if recon == "unknown" and cat not in NEVER and res.get("retry") not in ("never", "human_required"):
                return ("stop", f"{sid}: outcome unknown")
        if cat == "success":
            data = res.get("data")
            return ("done", dict(data) if isinstance(data, dict) else {})
        if cat == "approval_pending":
            kind, val = yield from collect(str(res.get("resume_token")))
            if kind != "res":
                return kind, val
            res = val
            continue
        if cat == "rate_limited":
            wait = float(res.get("retry_after_s") or 1.0)
            if attempts >= 3 or wait > left(task) - 0.3:
                return ("failed", f"{sid}: rate limited, its wait outlasts the deadline or the attempts")
            yield ("sleep", wait)
            res = None
            continue
        if cat in ("local_failure", "confirmed_failure"):
            if attempts >= 3:
                return ("failed", f"{sid}: {cat} 3 times")
            yield ("sleep", 0.2)
            res = None
            continue
        if cat == "outcome_unknown":
            if left(task) <= 0:
                return ("stop", f"{sid}: outcome unknown, no time left to look it up")
            kind, val = yield from lookup({"correlation_id": res.get("correlation_id")})
            if kind != "res":
                return kind, val
            res = val
            continue
        if cat == "vault_locked":
            while True:
                st = yield ("send_plain", "vault.status", {})
                if not st.get("locked"):
                    break
                if left(task) <= 0.5:
                    return ("failed", f"{sid}: the vault stayed locked")
                yield ("sleep", 0.25)
            res = None
            continue
        return ("stop", f"{sid}: {op} answered {cat} ({res.get('retry')})")


def final_message(task: dict[str, Any], outcomes: dict[str, tuple[str, Any]]) -> str:
    steps = [s["id"] for s in task.get("steps", [])]
    stops = [str(v) for k, v in outcomes.values() if k == "stop"]
    waits = [sid for sid, (k, _) in outcomes.items() if k == "waiting"]
    undone = [sid for sid in steps if outcomes.get(sid, ("", None))[0] != "done"]
    if stops:
        return "not done: " + "; ".join(stops)
    if not undone:
        return f"done: {len(steps)} steps"
    if waits:
        return "waiting: approval pending for " + ", ".join(waits) + " (resume token kept in state_dir)"
    return "not done: " + ", ".join(f"{s} ({outcomes.get(s, ('not started', None))[1] or 'not started'})"
                                    for s in undone)


class Plan:
    """Which steps may start now (not thread-safe: the driver calls it from one place)."""

    def __init__(self, task: dict[str, Any], store: Store, gated_ops: set[str] | None) -> None:
        self.task, self.store = task, store
        self.steps: list[dict[str, Any]] = list(task.get("steps", []))
        self.gated = gated_ops            # None: modes unknown, so every step is gated
        self.outcomes: dict[str, tuple[str, Any]] = {}
        self.data: dict[str, Any] = {}
        self.running: set[str] = set()
        self.stopped = False
        for s in self.steps:               # a predecessor's finished steps are kept, with their data
            rec = store.get(s["id"])
            if "done" in rec:
                self.outcomes[s["id"]] = ("done", rec["done"])
                self.data[s["id"]] = rec["done"]

    def is_gated(self, step: dict[str, Any]) -> bool:
        return self.gated is None or step["call"] in self.gated

    def ready(self) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        """Steps to start now: (step, filled params, its record)."""
        if self.stopped:
            return []
        out = []
        earlier_gated_open = False
        for i, s in enumerate(self.steps):
            sid = s["id"]
            settled = sid in self.outcomes
            gated = self.is_gated(s)
            if not settled and sid not in self.running:
                needs = refs(s.get("params", {}))
                missing = [n for n in needs if n not in self.data]
                blocked = [n for n in missing if n in self.outcomes]      # settled, not done
                if blocked:
                    self.outcomes[sid] = ("failed", f"needs {', '.join(sorted(blocked))}, not done")
                elif not missing and not (gated and earlier_gated_open) and not self._alike_before(i):
                    try:
                        params = fill(s.get("params", {}), self.data)
                    except (KeyError, TypeError):
                        self.outcomes[sid] = ("failed", "a reference its result lacks")
                        continue
                    self.running.add(sid)
                    out.append((s, params, self.store.get(sid)))
            if gated and sid not in self.outcomes:
                earlier_gated_open = True
        return out

    def _alike_before(self, i: int) -> bool:
        s = self.steps[i]
        return any(t["call"] == s["call"] and t.get("params") == s.get("params")
                   and t["id"] not in self.outcomes for t in self.steps[:i])

    def finish(self, sid: str, outcome: tuple[str, Any]) -> None:
        self.running.discard(sid)
        self.outcomes[sid] = outcome
        if outcome[0] == "done":
            self.data[sid] = outcome[1]
        if outcome[0] in ("stop", "waiting"):
            # a never answer or an unsettled unknown ends the task; a wait handed over at the
            # deadline leaves no time for more
            self.stopped = True

    def over(self) -> bool:
        if self.running:
            return False
        return self.stopped or not self.ready_possible()

    def ready_possible(self) -> bool:
        return any(s["id"] not in self.outcomes for s in self.steps) and left(self.task) > 0.3

    def message(self) -> str:
        return final_message(self.task, self.outcomes)


def record_outcome(store: Store, rec: dict[str, Any], outcome: tuple[str, Any]) -> None:
    if outcome[0] == "done":
        rec["done"] = outcome[1]
        rec.pop("pending", None)
        store.put(rec)


def gated_ops_from(catalog_answer: dict[str, Any] | None) -> set[str] | None:
    if not catalog_answer:
        return None
    ops = catalog_answer.get("operations")
    if not isinstance(ops, list):
        return None
    return {o["name"] for o in ops if isinstance(o, dict) and
            (o.get("approval") or {}).get("mode") not in ("auto", "deny")}


def connect(path: str, task: dict[str, Any]) -> socket.socket:
    pause = 0.05
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError as e:
            s.close()
            # a full accept queue (EAGAIN) or a vault still starting: back off, within the deadline
            if e.errno not in (errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT) or pause > left(task):
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


class Wire:
    """One connection, thread-safe and pipelined: a reader thread hands each answer to its asker."""

    _ids = iter(range(1, 1 << 62))
    _ids_lock = threading.Lock()

    def __init__(self, path: str, task: dict[str, Any]) -> None:
        self.task = task
        self.sock = connect(path, task)
        self.wlock = threading.Lock()
        self.waiting: dict[int, list[Any]] = {}
        self.mu = threading.Lock()
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    with self.mu:
                        slot = self.waiting.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                    if slot is not None:          # a line without one of our ids is ignored
                        slot[1] = msg
                        slot[0].set()
        except OSError:
            pass
        with self.mu:
            self.closed = True
            for slot in self.waiting.values():
                slot[0].set()
            self.waiting.clear()

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if float(self.task["deadline"]) - time.time() < 0.3:
            raise TooLate(method)
        with Wire._ids_lock:
            rid = next(Wire._ids)
        slot: list[Any] = [threading.Event(), None]
        with self.mu:
            if self.closed:
                raise ConnectionError("the vault closed the connection")
            self.waiting[rid] = slot
        line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n"
        with self.wlock:
            self.sock.sendall(line.encode())
        slot[0].wait()
        ans = slot[1]
        if ans is None:
            raise ConnectionError("the vault closed the connection")
        if "error" in ans:
            raise RpcError(str(ans["error"].get("message", ""))[:160])
        res: dict[str, Any] = ans.get("result") or {}
        return res

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Session:
    """A session on a Wire: every request carries its id."""

    def __init__(self, wire: Wire, task: dict[str, Any], client: str) -> None:
        self.wire, self.task = wire, task
        got = wire.rpc("session.open", {"agent": task["agent"], "run_id": task["run_id"],
                                        "client": {"name": client}})
        self.sid = str(got["session_id"])

    def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        res = self.wire.rpc(method, {"session_id": self.sid, **params})
        log(method, res.get("operation", ""), res.get("category", ""), res.get("reconciled", ""))
        return res

    def plain(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.wire.rpc(method, params)

    def close(self) -> None:
        try:
            self.wire.rpc("session.close", {"session_id": self.sid})
        except Exception:
            pass


def execute(op: Op, session: Session, store: Store) -> Any:
    """Do one thing a flow asked for, blocking."""
    if op[0] == "send":
        return session.send(op[1], op[2])
    if op[0] == "send_plain":
        return session.plain(op[1], op[2])
    if op[0] == "sleep":
        time.sleep(max(0.0, min(float(op[1]), left(session.task) + MARGIN - 0.3)))
    elif op[0] == "save":
        store.put(op[1])
    return None


def run_flow(flow: Flow, do: Any) -> tuple[str, Any]:
    """Run one step's flow to its end with `do(op)` doing each thing it asks, blocking."""
    answer: Any = None
    error: BaseException | None = None
    try:
        while True:
            op = flow.throw(error) if error is not None else flow.send(answer)
            answer, error = None, None
            try:
                answer = do(op)
            except RpcError as e:
                error = e
    except StopIteration as stop:
        return tuple(stop.value)  # type: ignore[return-value]
    except RpcError as e:
        return ("failed", f"the vault refused it: {e}")
    except TooLate:
        return ("failed", "the deadline came first")
    except OSError as e:
        return ("stop", f"the connection to the vault failed: {e}")


def open_session(task: dict[str, Any], client: str) -> tuple[Wire, Session]:
    wire = Wire(os.environ["VAULTSIM_SOCKET"], task)
    return wire, Session(wire, task, client)


def one_at_a_time(task: dict[str, Any], session: Session, store: Store, do: Any = None,
                  before_step: Any = None) -> str:
    """Every step in order, the next once the last settled; `do(op)` may wrap what a flow asks."""
    plan = Plan(task, store, None)
    run = do or (lambda op: execute(op, session, store))
    while True:
        batch = plan.ready()
        if not batch:
            break
        for step, params, rec in batch:
            if before_step is not None:
                before_step(step, plan)
            out = run_flow(step_flow(task, step, params, rec), run)
            record_outcome(store, rec, out)
            plan.finish(step["id"], out)
    return plan.message()
