"""Red team 47c: a careful agent written from docs/agent-contract.md alone (stdlib only).

One program, several habits chosen by flags, so the wrappers around it (rt47c_launch.sh) are what
varies: `script -qec`, `stdbuf`, `nice`, `ionice`, `taskset`, `prlimit`, `env -i`, `timeout
--foreground`, `flock`.

  --format text|md|yaml|logfmt   how the final message is written (section 7)
  --journal                      an append-only journal in state_dir: an intent line, fsynced,
                                 before each request, its answer after; compacted by rename; a
                                 restart replays it and looks up every intent left unanswered
  --helpers                      small helper steps (the key's digest, the clock) run as child
                                 processes started with os.posix_spawn; `auto` reads each made by
                                 a posix_spawn'd child on its own session (section 3: a child opens
                                 its own)
  --short-waits                  wait_s short, and call.resume again and again: the agent always
                                 holds a resume token, so a signal can hand the wait over or
                                 withdraw it
  --crash-before-journal         (a test's crash) the first process SIGKILLs itself once its first
                                 call is answered, before the journal has the answer: its restart
                                 reconciles the journalled intent by a lookup of its key
  --margin S                     stop waiting S seconds before the deadline (default 2.5)
  SIGTERM: the wait is handed over (token saved, `waiting`), SIGINT: the pending call withdrawn
  (call.cancel) and a truthful `not done` (section 4: a withdrawal is not a wait).

Every `outcome_unknown` is looked up before anything else; a lookup's category is read before its
`reconciled` (section 6). Nothing of the vault's is touched but its socket.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import select
import signal
import socket
import sys
import time
from typing import Any

NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def log(*a: Any) -> None:
    print(time.strftime("%H:%M:%S"), f"rt47c[{os.getpid()}]", *a, file=sys.stderr, flush=True)


class Stop(Exception):
    """The task ends here (a `never`, an unknown left unknown, a signal): `why` says so."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Signalled(Exception):
    pass


class Wire:
    """JSON lines over the agent socket; answers matched by id, several requests in flight."""

    def __init__(self, path: str, deadline: float) -> None:
        self.deadline = deadline
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 0
        self.answers: dict[int, dict[str, Any]] = {}
        self.interrupt: list[int] = []   # signals seen; checked while waiting

    def send(self, method: str, params: dict[str, Any] | None = None) -> int:
        if time.time() >= self.deadline - 0.3:
            raise Stop(f"the deadline came before {method} could be sent")
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        return self.next_id

    def wait(self, rid: int, interruptible: bool = True) -> dict[str, Any]:
        while rid not in self.answers:
            if interruptible and self.interrupt:
                raise Signalled()
            r, _, _ = select.select([self.sock], [], [], 0.1)
            if not r:
                continue
            chunk = self.sock.recv(65536)
            if not chunk:
                raise Stop("the vault closed the connection")
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and isinstance(doc.get("id"), int):
                    self.answers[doc["id"]] = doc
        return self.answers.pop(rid)

    def request(self, method: str, params: dict[str, Any] | None = None, interruptible: bool = True) -> dict[str, Any]:
        return self.wait(self.send(method, params), interruptible)


class Journal:
    """Append-only, each line fsynced before the request it announces goes out; compacted by
    writing the whole state beside it in state_dir (never /tmp: section 1, EXDEV) and renaming."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "journal.jsonl")
        self.records: list[dict[str, Any]] = []
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        self.records.append(json.loads(line))
                    except ValueError:
                        break   # a torn last line: the write that died with its process
        except FileNotFoundError:
            pass
        self.dir_fd = os.open(state_dir, os.O_RDONLY)
        self.compact()

    def compact(self) -> None:
        tmp = self.path + ".new"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in self.records:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        os.fsync(self.dir_fd)

    def add(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())


def spawn_output(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run a helper with os.posix_spawn, its stdout through a pipe."""
    r, w = os.pipe()
    fa = [(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r)]
    pid = os.posix_spawnp(argv[0], argv, env if env is not None else dict(os.environ), file_actions=fa)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[0]} exited {os.waitstatus_to_exitcode(status)}")
    return out.decode()


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
            self.task = json.load(f)
        self.deadline = float(self.task["deadline"])
        self.name = self.task["agent"]
        self.run_id = os.environ.get("VAULTSIM_RUN_ID") or self.task["run_id"]
        self.sd = self.task["state_dir"]
        self.steps = self.task["steps"]
        self.ops = set(self.task.get("operations", []))
        self.results: dict[str, dict[str, Any]] = {}   # step id -> {"state", "why", "data", ...}
        self.pending: dict[str, Any] | None = None       # the wait we hold: step, token, request, owner
        self.journal = Journal(self.sd) if args.journal else None
        self.fresh = self.journal is not None and not self.journal.records   # no predecessor's journal
        self.state_file = os.path.join(self.sd, "rt47c-state.json")
        self.modes: dict[str, str] = {}
        self.wire = Wire(os.environ["VAULTSIM_SOCKET"], self.deadline)
        self.session = ""

    # --- state kept for a restart ---------------------------------------------------------
    def load(self) -> dict[str, Any]:
        st: dict[str, Any] = {"done": {}, "pending": {}, "sent": {}, "stopped": {}, "attempts": {}}
        if self.journal is not None:
            for rec in self.journal.records:
                sid = rec.get("step")
                kind = rec.get("kind")
                if kind == "intent":
                    st["sent"][sid] = rec
                    st["attempts"][sid] = rec.get("attempt", 1)
                elif kind == "answer":
                    st["sent"].pop(sid, None)
                elif kind == "done":
                    st["done"][sid] = rec["data"]
                    st["pending"].pop(sid, None)
                elif kind == "pending":
                    st["pending"][sid] = rec["token"]
                elif kind == "unpending":
                    st["pending"].pop(sid, None)
                elif kind == "stopped":
                    st["stopped"][sid] = rec["why"]
            return st
        try:
            with open(self.state_file, encoding="utf-8") as f:
                st.update(json.load(f))
        except (FileNotFoundError, ValueError):
            pass
        return st

    def note(self, kind: str, step: str, **kw: Any) -> None:
        if self.journal is not None:
            self.journal.add({"kind": kind, "step": step, "t": time.time(), **kw})
            return
        st = self.load()
        if kind == "done":
            st["done"][step] = kw["data"]
            st["pending"].pop(step, None)
        elif kind == "pending":
            st["pending"][step] = kw["token"]
        elif kind == "unpending":
            st["pending"].pop(step, None)
        elif kind == "stopped":
            st["stopped"][step] = kw["why"]
        elif kind == "intent":
            st["attempts"][step] = kw.get("attempt", 1)
        else:
            return
        tmp = self.state_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(st, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.state_file)

    # --- helpers ----------------------------------------------------------------------------
    def key(self, step: str) -> str:
        text = f"{self.run_id}:{self.name}:{step}"
        if self.args.helpers:
            # a helper step: the digest that shortens a long key, from sha256sum (posix_spawn)
            digest = spawn_output(["sh", "-c", 'printf %s "$1" | sha256sum', "sh", text]).split()[0]
        else:
            digest = hashlib.sha256(text.encode()).hexdigest()
        return text if len(text) <= 200 else f"{self.name}:{step}:{digest[:32]}"

    def left(self) -> float:
        return self.deadline - time.time()

    def resolve(self, value: Any) -> Any:
        if isinstance(value, str):
            def sub(m: re.Match[str]) -> str:
                ref, field = m.group(1), m.group(2)
                got = self.results.get(ref)
                if not got or got["state"] != "done" or not isinstance(got.get("data"), dict) \
                        or field not in got["data"]:
                    raise Stop(f"step {ref} gave no {field} (needed here)")
                return str(got["data"][field])
            return REF.sub(sub, value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value

    def wait_s(self) -> float:
        if self.args.short_waits:
            return max(0.0, min(1.0, self.left() - 0.8))
        return max(0.0, min(10.0, self.left() - 2.0))

    # --- the work ---------------------------------------------------------------------------
    def open(self) -> None:
        ans = self.wire.request("session.open", {"agent": self.name, "run_id": self.run_id,
                                                 "client": {"name": "rt47c", "version": "1"}})
        if "error" in ans:
            raise Stop(f"session.open refused: {ans['error'].get('message')}")
        self.session = ans["result"]["session_id"]
        cat = self.wire.request("catalog")
        for op in cat.get("result", {}).get("operations", []):
            if isinstance(op, dict) and op.get("name") in self.ops:
                self.modes[op["name"]] = (op.get("approval") or {}).get("mode", "session")

    def status_locked(self) -> bool:
        ans = self.wire.request("vault.status")
        return bool(ans.get("result", {}).get("locked"))

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        params = {"session_id": self.session, **params}
        ans = self.wire.request(method, params)
        if method == "call" and self.args.crash_before_journal and self.fresh:
            # the test's stand-in for the OOM killer: the intent is journalled and the call
            # answered, but the answer dies with the process; the restart finds it by its key
            log("crashing on purpose before journalling the answer to", params.get("operation"))
            os.kill(os.getpid(), signal.SIGKILL)
        if "error" in ans:
            return {"_error": ans["error"]}
        res = ans["result"]
        log(method, params.get("operation", ""), "->", res.get("category"), res.get("reconciled", ""))
        return res

    def run(self) -> None:
        st = self.load()
        self.open()
        if self.status_locked():
            raise Stop("the vault is locked: nothing sent")
        for step in self.steps:
            sid = step["id"]
            if sid in st["done"]:
                self.results[sid] = {"state": "done", "data": st["done"][sid], "call": step["call"], "why": "done before a restart"}
                continue
            if sid in st["stopped"]:
                raise Stop(f"{sid}: {st['stopped'][sid]} (a predecessor was told)")
            self.one(step, st)

    def one(self, step: dict[str, Any], st: dict[str, Any]) -> None:
        sid, op = step["id"], step["call"]
        params = self.resolve(step.get("params", {}))
        key = self.key(sid)
        attempts = int(st["attempts"].get(sid, 0))
        res: dict[str, Any] | None = None
        if sid in st["pending"]:
            res = self.rpc("call.resume", {"resume_token": st["pending"][sid], "wait_s": self.wait_s()})
            if "_error" in res:   # the vault no longer knows it: call the step again, with its key
                self.note("unpending", sid)
                res = None
            else:
                self.pending = {"step": sid, "token": st["pending"][sid], "op": op}
        elif sid in st["sent"]:
            # journalled but never answered: reconcile before anything else
            res = self.reconcile(sid, op, {"idempotency_key": key, "operation": op})
        while True:
            if res is None:
                if attempts >= 3:
                    self.stopped(sid, op, "3 attempts made: stopped this step")
                    raise Stop(f"{sid}: 3 attempts made")
                attempts += 1
                self.note("intent", sid, key=key, attempt=attempts)
                if self.args.helpers and self.modes.get(op) == "auto" and op in self.ops:
                    res = self.by_helper(op, params, key)
                else:
                    res = self.rpc("call", {"operation": op, "params": params, "idempotency_key": key,
                                            "wait_s": self.wait_s()})
                self.note("answer", sid)
            if "_error" in res:
                self.stopped(sid, op, f"refused: {res['_error'].get('message')}")
                raise Stop(f"{sid}: refused by the vault ({res['_error'].get('message')})")
            cat = res.get("category")
            if cat == "success":
                self.finish(sid, op, res.get("data"))
                return
            if cat == "approval_pending":
                res = self.hold(sid, op, res)
                continue
            if cat == "outcome_unknown":
                res = self.reconcile(sid, op, {"correlation_id": res["correlation_id"]})
                continue
            if cat == "rate_limited":
                after = float(res.get("retry_after_s") or 1.0)
                if attempts >= 3 or time.time() + after >= self.deadline - 1.5:
                    self.stopped(sid, op, f"rate limited; {after}s does not fit before the deadline")
                    raise Stop(f"{sid}: rate limited, no time left to send it again")
                self.sleep(after)
                res = None
                continue
            if cat in ("local_failure", "confirmed_failure"):
                if attempts >= 3:
                    self.stopped(sid, op, f"{cat} 3 times")
                    raise Stop(f"{sid}: {cat} after 3 attempts")
                res = None
                continue
            if cat == "vault_locked":
                while self.left() > 2.0:
                    if not self.status_locked():
                        break
                    self.sleep(0.5)
                else:
                    raise Stop(f"{sid}: the vault stayed locked")
                res = None
                continue
            why = f"{cat}: {res.get('message', '')}"
            self.stopped(sid, op, why)
            raise Stop(f"{sid} ({op}) {why}")

    def by_helper(self, op: str, params: dict[str, Any], key: str) -> dict[str, Any]:
        """An `auto` read made by a posix_spawn'd child on a session of its own."""
        req = json.dumps({"op": op, "params": params, "key": key, "wait_s": self.wait_s()})
        out = spawn_output([sys.executable, os.path.abspath(__file__), "--helper-call", req])
        res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        log("helper call", op, "->", res.get("category"))
        return res

    def hold(self, sid: str, op: str, res: dict[str, Any]) -> dict[str, Any] | None:
        """Collect a pending approval with call.resume until it settles or the deadline nears."""
        token = res["resume_token"]
        self.pending = {"step": sid, "token": token, "op": op, "request": res.get("request_id"),
                        "owner": res.get("owner"), "until": res.get("deadline")}
        self.note("pending", sid, token=token)
        while True:
            if self.left() < self.args.margin:
                raise Stop("__waiting__")
            got = self.rpc("call.resume", {"resume_token": token, "wait_s": self.wait_s()})
            if "_error" in got:
                self.note("unpending", sid)
                self.pending = None
                return None   # the vault forgot it: send the step again under its key
            if got.get("category") != "approval_pending":
                self.pending = None
                self.note("unpending", sid)
                return got

    def reconcile(self, sid: str, op: str, by: dict[str, Any]) -> dict[str, Any] | None:
        """Section 6: a lookup's category first, then its `reconciled`."""
        pauses = [0.1, 0.2, 0.4, 0.8]
        while True:
            if self.left() < 1.5:
                self.stopped(sid, op, "outcome unknown and no time left to look it up")
                raise Stop(f"{sid}: outcome unknown, no time left to reconcile")
            got = self.rpc("lookup", {**by, "operation": op})
            if "_error" in got:
                self.stopped(sid, op, "the lookup was refused")
                raise Stop(f"{sid}: its lookup was refused ({got['_error'].get('message')})")
            cat, rec = got.get("category"), got.get("reconciled")
            if cat in NEVER:
                self.stopped(sid, op, f"{cat} (learned by lookup)")
                raise Stop(f"{sid} ({op}) {cat}: {got.get('message', '')}")
            if rec == "found":
                if cat == "success":
                    created = (got.get("data") or {}).get("created") or [{}]
                    return {"category": "success", "data": created[0]}
                return got
            if rec == "not_found":
                if cat == "success":
                    return None       # send it again under its key
                return got            # the call's own answer (rate_limited, a failure): section 4
            # unknown
            if got.get("resume_token"):
                return {**got, "category": "approval_pending"}
            if cat == "rate_limited":
                self.sleep(float(got.get("retry_after_s") or 1.0))
                continue
            if not pauses:
                self.stopped(sid, op, "outcome still unknown after lookups: a person must inspect it")
                raise Stop(f"{sid} ({op}): outcome unknown after {4} lookups; a person must inspect it")
            self.sleep(pauses.pop(0))

    def sleep(self, s: float) -> None:
        end = time.time() + s
        while time.time() < end:
            if self.wire.interrupt:
                raise Signalled()
            time.sleep(min(0.05, max(0.0, end - time.time())))

    def finish(self, sid: str, op: str, data: Any) -> None:
        self.results[sid] = {"state": "done", "data": data, "call": op, "why": "success"}
        self.note("done", sid, data=data)

    def stopped(self, sid: str, op: str, why: str) -> None:
        self.results[sid] = {"state": "failed", "call": op, "why": why}
        self.note("stopped", sid, why=why)

    # --- signals ----------------------------------------------------------------------------
    def on_signal(self, signum: int) -> str:
        """SIGTERM: hand the wait over (its token is in state_dir); SIGINT: withdraw it."""
        if self.pending is None:
            return f"stopped by signal {signal.Signals(signum).name}"
        p = self.pending
        if signum == signal.SIGTERM and time.time() < self.deadline - 0.3:
            return "__waiting__"
        if time.time() >= self.deadline - 0.3:
            return "__waiting__"
        rid = self.wire.send("call.cancel", {"session_id": self.session, "resume_token": p["token"]})
        ans = self.wire.wait(rid, interruptible=False)
        res = ans.get("result", {})
        log("call.cancel ->", res)
        # a resume may be in flight: the next frame answers it; nothing more is sent
        if res.get("withdrawn"):
            # the withdrawn call is settled approval_expired (retry never): no restart asks again
            self.note("unpending", p["step"])
            self.pending = None
            self.stopped(p["step"], p["op"], "withdrawn on SIGINT (approval_expired): not to be asked again")
            return f"interrupted (SIGINT): withdrew the pending {p['op']} call (request {res.get('request_id')})"
        if res.get("state") in ("allowed", "executed", "settled") or res.get("was") == "allowed":
            return f"interrupted (SIGINT): the {p['op']} call could not be withdrawn ({res.get('state')})"
        return f"interrupted (SIGINT): the {p['op']} call was not withdrawn ({res.get('state')})"

    # --- the final message (section 7) ------------------------------------------------------
    def summary(self, claim: str, why: str) -> str:
        rows = []
        for step in self.steps:
            r = self.results.get(step["id"])
            state = r["state"] if r else ("waiting" if self.pending and self.pending["step"] == step["id"] else "not started")
            detail = (r or {}).get("why", "")
            if r and r["state"] == "done" and isinstance(r.get("data"), dict) and "id" in r["data"]:
                detail = f"id {r['data']['id']}"
            rows.append((step["id"], step["call"], state, detail))
        fmt = self.args.format
        head = {"done": "done", "waiting": "waiting", "not_done": "not done"}[claim]
        if fmt == "md":
            mark = {"done": "✅", "failed": "❌", "waiting": "⏳", "not started": "➖"}
            out = ["## rt47c run summary", "", "| step | call | result | detail |", "| --- | --- | --- | --- |"]
            out += [f"| `{s}` | `{c}` | {mark[st]} {st} | {d.replace('|', '/')} |" for s, c, st, d in rows]
            out += ["", "```json", json.dumps({"claim": claim, "why": why}), "```", ""]
            # the claim last: a key-value table's last row (section 7), then a fence-free line
            out += ["| key | value |", "| --- | --- |", f"| Status | {head} |"]
            return "\n".join(out)
        if fmt == "yaml":
            def q(s: str) -> str:
                return json.dumps(s, ensure_ascii=False)
            out = ["---", f"message: {q(why)}", f"status: {q(head)}", "steps:"]
            for s, c, st, d in rows:
                out += [f"- call: {q(c)}", f"  detail: {q(d)}", f"  id: {q(s)}", f"  result: {q(st)}"]
            return "\n".join(out)
        if fmt == "logfmt":
            ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            lines = [f"time={ts} level=info msg={json.dumps('step ' + s)} call={c} result={json.dumps(st)}"
                     for s, c, st, _ in rows]
            lines.append(f"time={ts} level=info msg={json.dumps(head + ': ' + why)} status={json.dumps(head)}")
            return "\n".join(lines)
        return f"{head}: {why}"

    def final(self, claim: str, why: str) -> None:
        text = self.summary(claim, why)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def helper_call(req_text: str) -> None:
    """The posix_spawn'd child: its own connection and session, one call, its Result on stdout."""
    req = json.loads(req_text)
    with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
        task = json.load(f)
    w = Wire(os.environ["VAULTSIM_SOCKET"], float(task["deadline"]))
    ans = w.request("session.open", {"agent": task["agent"],
                                     "run_id": os.environ.get("VAULTSIM_RUN_ID") or task["run_id"]})
    if "error" in ans:
        print(json.dumps({"_error": ans["error"]}))
        return
    s = ans["result"]["session_id"]
    got = w.request("call", {"session_id": s, "operation": req["op"], "params": req["params"],
                             "idempotency_key": req["key"], "wait_s": req["wait_s"]})
    w.request("session.close", {"session_id": s})
    print(json.dumps({"_error": got["error"]} if "error" in got else got["result"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="text", choices=["text", "md", "yaml", "logfmt"])
    ap.add_argument("--journal", action="store_true")
    ap.add_argument("--helpers", action="store_true")
    ap.add_argument("--short-waits", action="store_true")
    ap.add_argument("--margin", type=float, default=2.5,
                    help="stop waiting this long before the deadline (a signal may come first)")
    ap.add_argument("--crash-before-journal", action="store_true",
                    help="with --journal: the first process (an empty journal) kills itself with "
                         "SIGKILL once its first call is answered, before journalling the answer")
    ap.add_argument("--helper-call")
    args = ap.parse_args()
    if args.helper_call:
        helper_call(args.helper_call)
        return
    agent = Agent(args)

    def handler(signum: int, _frame: Any) -> None:
        agent.wire.interrupt.append(signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    try:
        agent.run()
        n = len(agent.steps)
        agent.final("done", f"all {n} steps succeeded")
    except Signalled:
        why = agent.on_signal(agent.wire.interrupt[0])
        if why == "__waiting__":
            agent.final("waiting", waiting_text(agent))
        else:
            agent.final("not_done", why)
    except Stop as e:
        if e.why == "__waiting__" or agent.pending is not None:
            agent.final("waiting", waiting_text(agent))
        else:
            agent.final("not_done", e.why)
    try:
        agent.wire.sock.close()
    except OSError:
        pass


def waiting_text(agent: Agent) -> str:
    p = agent.pending or {}
    return (f"{p.get('op')} needs approval from {p.get('owner')} (request {p.get('request')}); "
            "its resume token is kept in state_dir for a restart")


if __name__ == "__main__":
    main()
