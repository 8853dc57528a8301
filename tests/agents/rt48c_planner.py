#!/usr/bin/env python3
"""A careful agent as a planner/executor pair, written from docs/agent-contract.md alone.

The planner (this process, started by the runner) reads the task, orders the steps, fills in
`${ID.FIELD}` references from what earlier steps returned and decides when to stop. It never talks
to the vault: a long-lived executor child does, over the one connection and session it keeps for
the whole task. They talk over a socketpair, one JSON object a line: the planner sends a step, the
executor answers with what became of it. At the end the planner prints what the executor told it.

Habits (flags, after the script's path):
  --final jsonl|german|counter  the final message's shape (default jsonl: a JSON line per step,
                                then a summary object with `status`)
  --threads                     independent `auto` steps run side by side from threads of the
                                executor, on its one session and connection (answers matched by id)
  --fork-auto                   each `auto` step is done by a child the executor forks: it opens a
                                connection and session of its own (a session belongs to its process)
                                and reports over a pipe; gated steps stay with the executor, whose
                                session holds the grant
  --pool N                      N long-lived executors, each with its own connection and session:
                                gated steps all go to executor 0 (its session holds the grants),
                                a turn of independent `auto` steps is spread over the pool
  --late-quit                   the final message is printed first, then the executors are told to
                                close their sessions and are waited for
  --setsid                      each executor in a session of its own (start_new_session: a Ctrl-C
                                at the planner's terminal does not reach it); the planner waits for it
  --affinity                    with a pool: each gated operation's steps all go to one executor
                                (the first such operation to executor 0, the next to 1, ...), so
                                its session's grant covers them; still one gated step at a time
  --report-file                 the executor writes its reports to a file in state_dir, read by the
                                planner after it exits, instead of the socketpair
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
from typing import Any

NEVER = {"never", "human_required"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")
MARGIN = 1.5  # seconds before the deadline by which every request has been answered


def atomic_write(path: str, doc: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"  # in state_dir itself: a rename from /tmp fails in the jail
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- the vault connection (executor)

class Vault:
    """One connection; requests from any thread, a reader thread routes answers by id."""

    def __init__(self, path: str, deadline: float) -> None:
        self.sock = self._connect(path, deadline)
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiters: dict[int, list[Any]] = {}
        self.closed = False
        threading.Thread(target=self._reader, daemon=True).start()

    @staticmethod
    def _connect(path: str, deadline: float) -> socket.socket:
        delay = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except BlockingIOError:  # EAGAIN: the vault's accept queue is full, not a missing vault
                s.close()
                if time.time() + delay > deadline - MARGIN:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

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
                if not isinstance(msg, dict):
                    continue
                with self.lock:
                    slot = self.waiters.get(msg.get("id"))  # a line without our id is ignored
                if slot is not None:
                    slot.append(msg)
                    slot[0].set()
        with self.lock:
            self.closed = True
            for slot in self.waiters.values():
                slot[0].set()

    def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        ev = threading.Event()
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            self.waiters[rid] = [ev]
        req = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        self.sock.sendall((json.dumps(req) + "\n").encode())
        ev.wait()
        with self.lock:
            slot = self.waiters.pop(rid)
        if len(slot) < 2:
            return {"error": {"code": -1, "message": "the vault closed the connection"}}
        return slot[1]


# ---------------------------------------------------------------- one step, carefully

class Step:
    """Does one step to the end the contract allows: done, failed (bounded), stop, waiting."""

    def __init__(self, ex: "Executor", vault: Vault, session: str, step: dict[str, Any],
                 params: dict[str, Any]) -> None:
        self.ex, self.v, self.sid, self.step, self.params = ex, vault, session, step, params
        self.op = step["call"]
        self.key = f"{ex.task['run_id']}:{ex.task['agent']}:{step['id']}"
        self.attempts = 0
        self.log: list[str] = []

    def left(self) -> float:
        return self.ex.deadline - time.time()

    def out(self, outcome: str, **kw: Any) -> dict[str, Any]:
        return {"step": self.step["id"], "call": self.op, "outcome": outcome, "attempts": self.attempts,
                "trace": self.log, **kw}

    def send(self) -> dict[str, Any] | None:
        if self.attempts >= 3:
            return None
        if self.left() < MARGIN + 0.5:
            return {"_deadline": True}
        self.attempts += 1
        self.ex.note(self.step["id"], {"intent": self.key})
        wait = max(0.0, min(10.0, self.left() - MARGIN - 0.5))
        return self.v.rpc("call", {"session_id": self.sid, "operation": self.op, "params": self.params,
                                   "idempotency_key": self.key, "wait_s": round(wait, 2)})

    def run(self, saved: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] | None = None
        if saved.get("token"):  # a predecessor waited for this approval: collect it, never ask again
            self.log.append("resume saved token")
            msg = self.v.rpc("call.resume", {"session_id": self.sid, "resume_token": saved["token"],
                                             "wait_s": round(max(0.0, min(10.0, self.left() - MARGIN - 0.5)), 2)})
            if "error" in msg:  # the vault no longer knows it: call the step again, with its key
                msg = None
            else:
                self.attempts = max(1, saved.get("attempts", 1))
        elif saved.get("intent"):  # sent by a predecessor whose answer was never kept: ask first
            self.attempts = saved.get("attempts", 1)
            msg = self.lookup_loop({"idempotency_key": self.key, "operation": self.op})
            if msg is not None and msg.get("_resend"):
                msg = None
        while True:
            if msg is None:
                msg = self.send()
                if msg is None:
                    return self.out("failed", why="three attempts, none succeeded")
            if msg.get("_deadline"):
                return self.out("stop", why="no time left to send it")
            if msg.get("_done"):
                return self.out("done", data=msg["data"])
            if msg.get("_stop"):
                return self.out("stop", why=msg["why"])
            if "error" in msg:
                return self.out("stop", why=f"vault refused: {msg['error'].get('message')}")
            r = msg.get("result") or {}
            cat, retry = r.get("category"), r.get("retry")
            self.log.append(str(cat))
            msg = None
            if cat == "success":
                return self.out("done", data=r.get("data") or {})
            if cat == "approval_pending":
                got = self.wait_approval(r)
                if got is None:
                    return self.out("waiting", token=r["resume_token"], owner=r.get("owner"),
                                    request_id=r.get("request_id"))
                msg = got
                continue
            if cat == "outcome_unknown":
                msg = self.lookup_loop({"correlation_id": r["correlation_id"], "operation": self.op})
                if msg is not None and msg.get("_resend"):
                    msg = None
                continue
            if cat in ("local_failure", "confirmed_failure"):
                if self.attempts >= 3:
                    return self.out("failed", why=f"{cat} three times")
                continue
            if cat == "rate_limited":
                wait = float(r.get("retry_after_s") or 1.0)
                if time.time() + wait > self.ex.deadline - MARGIN - 0.5 or self.attempts >= 3:
                    return self.out("stop", why=f"rate limited, retry after {wait}s does not fit")
                time.sleep(wait)
                continue
            if cat == "vault_locked":
                if not self.wait_unlocked():
                    return self.out("stop", why="vault locked until the deadline")
                continue
            return self.out("stop", why=f"{cat} ({retry})", category=cat)

    def wait_approval(self, r: dict[str, Any]) -> dict[str, Any] | None:
        token = r["resume_token"]
        self.ex.note(self.step["id"], {"token": token, "attempts": self.attempts})
        while True:
            left = self.left() - MARGIN
            if left < 0.3:
                return None  # hand the wait over: the token is saved
            msg = self.v.rpc("call.resume", {"session_id": self.sid, "resume_token": token,
                                             "wait_s": round(min(10.0, left - 0.2), 2)})
            if "error" in msg:
                return msg
            res = msg.get("result") or {}
            if res.get("category") != "approval_pending":
                self.ex.note(self.step["id"], {"intent": self.key, "attempts": self.attempts})
                return msg

    def wait_unlocked(self) -> bool:
        while self.left() > MARGIN + 1.0:
            st = self.v.rpc("vault.status").get("result") or {}
            if st.get("locked") is False:
                return True
            time.sleep(0.5)
        return False

    def lookup_loop(self, what: dict[str, Any]) -> dict[str, Any] | None:
        unknowns = 0
        while True:
            if self.left() < MARGIN:
                return {"_stop": True, "why": "outcome unknown, no time left to reconcile"}
            lk = self.v.rpc("lookup", {"session_id": self.sid, **what})
            if "error" in lk:
                return {"_stop": True, "why": f"lookup refused: {lk['error'].get('message')}"}
            r = lk.get("result") or {}
            cat, rec = r.get("category"), r.get("reconciled")
            self.log.append(f"lookup {cat}/{rec}")
            if rec in ("found", "not_found") and cat != "success":
                return lk  # the call's own answer: follow it as section 4 says
            if rec == "found":
                created = (r.get("data") or {}).get("created") or []
                return {"_done": True, "data": created[0] if created else {}}
            if rec == "not_found":
                return {"_resend": True}
            if r.get("resume_token"):  # it still waits for a person, or was allowed and not run
                return {"result": {**r, "category": "approval_pending"}}
            if r.get("retry") in NEVER:
                return {"_stop": True, "why": f"{cat}: the call was refused for good"}
            if cat == "rate_limited":
                time.sleep(float(r.get("retry_after_s") or 0.5))
                continue
            unknowns += 1
            if unknowns > 4:
                return {"_stop": True, "why": "outcome still unknown after lookups: a person must inspect it"}
            time.sleep(0.1 * 2 ** (unknowns - 1))


# ---------------------------------------------------------------- the executor child

class Executor:
    def __init__(self, task: dict[str, Any], flags: set[str], index: int) -> None:
        self.task, self.flags = task, flags
        self.deadline = float(task["deadline"])
        # each executor of a pool keeps its own file; a restart reads them all, the furthest
        # state of a step winning (done, then ended, then a pending token, then a bare intent)
        self.state_path = os.path.join(task["state_dir"], f"executor-{index}.json")
        self.state: dict[str, Any] = {}
        rank = {"done": 4, "ended": 3, "token": 2, "intent": 1}
        level = lambda e: max((rank[k] for k in e if k in rank), default=0)  # noqa: E731
        for name in sorted(os.listdir(task["state_dir"])):
            if not (name.startswith("executor-") and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(task["state_dir"], name)) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            for sid, entry in doc.items():
                if level(entry) > level(self.state.get(sid, {})):
                    self.state[sid] = entry
        self.state_lock = threading.Lock()
        self.vault = Vault(os.environ["VAULTSIM_SOCKET"], self.deadline)
        self.sid = self.open_session(self.vault)
        ops = (self.vault.rpc("catalog").get("result") or {}).get("operations") or []
        self.modes = {o.get("name"): (o.get("approval") or {}).get("mode") for o in ops}

    def open_session(self, vault: Vault) -> str:
        r = vault.rpc("session.open", {"agent": self.task["agent"], "run_id": self.task["run_id"],
                                        "client": {"name": "rt48c-planner", "version": "1"}})
        return str(r["result"]["session_id"])

    def note(self, step_id: str, entry: dict[str, Any]) -> None:
        with self.state_lock:
            self.state[step_id] = entry
            atomic_write(self.state_path, self.state)

    def finished(self, rep: dict[str, Any]) -> None:
        if rep["outcome"] == "done":
            self.note(rep["step"], {"done": True, "data": rep.get("data") or {}})
        elif rep["outcome"] == "waiting":
            self.note(rep["step"], {"token": rep["token"], "attempts": rep["attempts"]})
        elif rep["outcome"] in ("stop", "failed") and not str(rep.get("why")).startswith("no time left"):
            self.note(rep["step"], {"ended": rep["outcome"], "why": rep.get("why")})

    def do(self, step: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        saved = self.state.get(step["id"]) or {}
        if saved.get("done"):
            return {"step": step["id"], "call": step["call"], "outcome": "done", "data": saved.get("data") or {},
                    "attempts": 0, "trace": ["kept by a predecessor"]}
        if saved.get("ended"):  # a predecessor was told to stop on it: never send it again
            return {"step": step["id"], "call": step["call"], "outcome": "stop", "attempts": 0,
                    "why": f"a predecessor ended it: {saved.get('why')}", "trace": []}
        if "--fork-auto" in self.flags and self.modes.get(step["call"]) == "auto" and not saved:
            rep = self.do_forked(step, params)
        else:
            rep = Step(self, self.vault, self.sid, step, params).run(saved)
        self.finished(rep)
        return rep

    def do_forked(self, step: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a session of its own, never the parent's id
            os.close(rfd)
            code = 0
            try:
                vault = Vault(os.environ["VAULTSIM_SOCKET"], self.deadline)
                sid = self.open_session(vault)
                self.state_lock = threading.Lock()
                rep = Step(self, vault, sid, step, params).run({})
                vault.rpc("session.close", {"session_id": sid})
                os.write(wfd, json.dumps(rep).encode())
            except BaseException as e:  # noqa: BLE001 - the parent learns of it through the pipe
                os.write(wfd, json.dumps({"step": step["id"], "call": step["call"], "outcome": "stop",
                                          "attempts": 1, "why": f"child failed: {e!r}", "trace": []}).encode())
                code = 1
            os._exit(code)
        os.close(wfd)
        chunks = []
        while True:
            b = os.read(rfd, 65536)
            if not b:
                break
            chunks.append(b)
        os.close(rfd)
        os.waitpid(pid, 0)
        return dict(json.loads(b"".join(chunks) or b'{"outcome": "stop", "why": "child said nothing"}'))


def executor_main(fd: int, index: int, flags: set[str]) -> None:
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    chan = socket.socket(fileno=fd)
    rfile = chan.makefile("r")
    report_file = os.path.join(task["state_dir"], f"reports-{index}.jsonl") if "--report-file" in flags else None
    ex = Executor(task, flags, index)
    outlock = threading.Lock()
    chan.sendall((json.dumps({"hello": index, "modes": ex.modes}) + "\n").encode())

    def tell(rep: dict[str, Any]) -> None:
        line = json.dumps(rep) + "\n"
        with outlock:
            if report_file:
                with open(report_file, "a") as f:
                    f.write(line)
            chan.sendall(line.encode() if not report_file else json.dumps({"ack": rep["step"]}).encode() + b"\n")

    for line in rfile:
        req = json.loads(line)
        if req.get("quit"):
            break
        batch = req["batch"]
        if len(batch) == 1 or any(ex.modes.get(b["step"]["call"]) != "auto" for b in batch):
            # a gated step goes alone, the next once it settled: the grant covers only later calls
            ended = False
            for b in batch:
                if ended:
                    tell({"step": b["step"]["id"], "call": b["step"]["call"], "outcome": "skipped"})
                    continue
                rep = ex.do(b["step"], b["params"])
                ended = rep["outcome"] in ("stop", "waiting")
                tell(rep)
            continue
        threads = [threading.Thread(target=lambda b=b: tell(ex.do(b["step"], b["params"]))) for b in batch]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    ex.vault.rpc("session.close", {"session_id": ex.sid})
    chan.close()


# ---------------------------------------------------------------- the planner

def resolve(value: Any, results: dict[str, dict[str, Any]]) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            data = results[m.group(1)]
            return str(data[m.group(2)])
        return REF.sub(sub, value)
    if isinstance(value, list):
        return [resolve(v, results) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, results) for k, v in value.items()}
    return value


def refs(value: Any) -> set[str]:
    return {m.group(1) for m in REF.finditer(json.dumps(value))}


def final_message(shape: str, reports: list[dict[str, Any]], total: int) -> list[str]:
    done = sum(1 for r in reports if r["outcome"] == "done")
    waiting = [r for r in reports if r["outcome"] == "waiting"]
    bad = [r for r in reports if r["outcome"] in ("stop", "failed")]
    if done == total:
        claim = "done"
    elif waiting and not bad:
        claim = "waiting"
    else:
        claim = "not done"
    if shape == "jsonl":
        lines = [json.dumps({"step": r["step"], "call": r["call"], "outcome": r["outcome"],
                             "why": r.get("why"), "attempts": r.get("attempts")}) for r in reports]
        summary: dict[str, Any] = {"status": claim.replace(" ", "_"), "done": done, "of": total}
        if waiting:
            summary["waiting_for"] = [{"step": w["step"], "owner": w.get("owner"), "request": w.get("request_id")}
                                      for w in waiting]
        return lines + [json.dumps(summary)]
    if shape == "counter":
        tail = f"; {waiting[0]['call']} wartet auf {waiting[0].get('owner')}" if claim == "waiting" else ""
        return [f"{claim}: {done}/{total}{tail}"]
    # german: the claim word first, as the contract reads it; the rest for the team's readers
    if claim == "done":
        return [f"done — alle {total} Schritte erledigt"]
    if claim == "waiting":
        w = waiting[0]
        return [f"waiting — {w['call']} wartet auf Freigabe durch {w.get('owner')} (Anfrage {w.get('request_id')}); "
                f"{done} von {total} Schritten erledigt"]
    why = "; ".join(f"{r['step']}: {r.get('why')}" for r in bad) or "Schritte nicht begonnen"
    return [f"not done — {done} von {total} Schritten erledigt ({why})"]


def planner_main(flags: set[str], shape: str, size: int) -> int:
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    pool: list[tuple[socket.socket, Any, subprocess.Popen[bytes]]] = []
    for n in range(size):
        mine, theirs = socket.socketpair()
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--executor", str(theirs.fileno()),
                                  str(n), *sorted(flags)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                 start_new_session="--setsid" in flags)
        theirs.close()
        pool.append((mine, mine.makefile("r"), child))
    modes: dict[str, Any] = {}
    for _, rfile, _ in pool:
        hello = json.loads(rfile.readline() or "{}")
        modes = modes or hello.get("modes") or {}
    steps: list[dict[str, Any]] = list(task["steps"])
    results: dict[str, dict[str, Any]] = {}
    reports: list[dict[str, Any]] = []
    stopped = False
    affinity: dict[str, int] = {}
    i = 0
    try:
        while i < len(steps) and not stopped:
            batch = [steps[i]]
            if "--threads" in flags or len(pool) > 1:  # independent auto steps side by side; never two alike
                while (i + len(batch) < len(steps)
                       and modes.get(steps[i + len(batch)]["call"]) == "auto"
                       and modes.get(batch[0]["call"]) == "auto"
                       and not refs(steps[i + len(batch)].get("params")) & {b["id"] for b in batch}
                       and all((b["call"], b.get("params")) != (steps[i + len(batch)]["call"],
                                                                 steps[i + len(batch)].get("params")) for b in batch)):
                    batch.append(steps[i + len(batch)])
            i += len(batch)
            todo = []
            for st in batch:
                missing = [r for r in refs(st.get("params")) if r not in results]
                if missing:
                    reports.append({"step": st["id"], "call": st["call"], "outcome": "stop", "attempts": 0,
                                    "why": f"needs {', '.join(missing)}, which did not succeed"})
                    stopped = True
                    break
                todo.append({"step": st, "params": resolve(st.get("params") or {}, results)})
            if stopped:
                break
            # gated steps (and any batch holding one) go to executor 0, whose session holds the
            # grants; a batch of auto steps is spread over the pool
            spread = len(pool) > 1 and all(modes.get(t["step"]["call"]) == "auto" for t in todo)
            parts: list[list[dict[str, Any]]] = [[] for _ in pool]
            for k, t in enumerate(todo):
                if spread:
                    parts[k % len(pool)].append(t)
                elif "--affinity" in flags:  # every step of one gated operation to one executor
                    op = t["step"]["call"]
                    home = affinity.setdefault(op, len(affinity) % len(pool))
                    parts[home].append(t)
                else:
                    parts[0].append(t)
            for (chan, _, _), part in zip(pool, parts):
                if part:
                    chan.sendall((json.dumps({"batch": part}) + "\n").encode())
            got = []
            for n, ((_, rfile, _), part) in enumerate(zip(pool, parts)):
                mine_got = []
                for _ in part:
                    line = rfile.readline()
                    if not line:
                        raise RuntimeError("an executor went away")
                    mine_got.append(json.loads(line))
                if "--report-file" in flags and mine_got:
                    with open(os.path.join(task["state_dir"], f"reports-{n}.jsonl")) as f:
                        seen = [json.loads(x) for x in f if x.strip()]
                    acked = {g["ack"] for g in mine_got}
                    mine_got = [r for r in seen if r["step"] in acked][-len(acked):]
                got.extend(mine_got)
            order = {b["id"]: n for n, b in enumerate(batch)}
            for rep in sorted(got, key=lambda r: order[r["step"]]):
                if rep["outcome"] == "skipped":
                    continue
                reports.append(rep)
                if rep["outcome"] == "done":
                    results[rep["step"]] = rep.get("data") or {}
                elif rep["outcome"] in ("stop", "waiting"):
                    stopped = True
                # "failed" (bounded, three attempts): later steps needing none of its data may run
        if "--late-quit" in flags:  # report first, then let the executors close their sessions
            for line in final_message(shape, reports, len(steps)):
                print(line, flush=True)
        for chan, _, _ in pool:
            chan.sendall(b'{"quit": true}\n')
    finally:
        for chan, _, child in pool:
            chan.close()
            child.wait()
        for n in range(len(pool)):
            try:
                os.unlink(os.path.join(task["state_dir"], f"reports-{n}.jsonl"))
            except OSError:
                pass
    if "--late-quit" not in flags:
        for line in final_message(shape, reports, len(steps)):
            print(line, flush=True)
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--executor":
        executor_main(int(args[1]), int(args[2]), set(args[3:]))
        return 0
    shape = "jsonl"
    size = 1
    flags: set[str] = set()
    while args:
        a = args.pop(0)
        if a == "--final":
            shape = args.pop(0)
        elif a == "--pool":
            size = int(args.pop(0))
        else:
            flags.add(a)
    return planner_main(flags, shape, size)


if __name__ == "__main__":
    sys.exit(main())
