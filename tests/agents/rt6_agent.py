"""Red team, sixth pass: a careful agent written from docs/agent-contract.md alone (stdlib, raw
socket, no project import), with knobs for the unusual-but-valid ways an outsider's agent
talks, prints, exits and keeps notes. Every knob is an environment variable (RT6_*):

  RT6_IDS     int | str | big | zero | uuid       the JSON-RPC ids it uses
  RT6_PIPE    1: session.open, catalog and vault.status in one write, answers read out of order
  RT6_SPLIT   1: every request written a few bytes at a time
  RT6_SIDE    1: `catalog` and `vault.status` between steps, each on a connection of its own
  RT6_WAIT    block | poll                        one long wait_s, or wait_s 0 and resumes
  RT6_OUT     chatter | binary | noeol | crlf | unicode | quote | data | catalog | stderr | json
  RT6_EXIT    nonzero: exit 3 whenever the task is not done
  RT6_NOTES   1: a work log, the results (data included) and a copy of the task in state_dir
              and $TMPDIR
  RT6_TERM    1: a SIGTERM handler that cleans up and exits
  RT6_HOLD    seconds to stay after the work (within the deadline)
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import sys
import time
import uuid

ENV = os.environ.get
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(TASK["deadline"])
MARGIN = 0.4
# RT6_ONLY: the output knob applies only where the run id holds this text (one scenario of a run)
OUT = ENV("RT6_OUT", "") if ENV("RT6_ONLY", "") in TASK["run_id"] else ""
NOTES = ENV("RT6_NOTES") == "1"
LOGS: list[str] = []


def left() -> float:
    return DEADLINE - time.time() - MARGIN


def log(msg: str) -> None:
    LOGS.append(msg)
    if OUT == "chatter":
        print(f"[{time.strftime('%H:%M:%S')}] {msg} " + "." * 400, flush=True)
    print(msg, file=sys.stderr, flush=True)


_counter = itertools.count(1)


def next_id() -> object:
    n = next(_counter)
    style = ENV("RT6_IDS", "int")
    if style == "str":
        return f"req-{n}"
    if style == "big":
        return 2 ** 62 + n
    if style == "zero":
        return n - 1  # the first request has id 0
    if style == "uuid":
        return str(uuid.uuid4())
    return n


class Conn:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["VAULTSIM_SOCKET"])
        self.buf = b""
        self.answers: dict[str, dict] = {}

    def send(self, method: str, params: dict | None = None) -> object:
        rid = next_id()
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        data = (json.dumps(msg) + "\n").encode()
        if ENV("RT6_SPLIT") == "1":
            for i in range(0, len(data), 7):
                self.sock.sendall(data[i:i + 7])
        else:
            self.sock.sendall(data)
        return rid

    def send_many(self, reqs: list[tuple[str, dict | None]]) -> list[object]:
        ids, data = [], b""
        for method, params in reqs:
            rid = next_id()
            ids.append(rid)
            msg: dict = {"jsonrpc": "2.0", "id": rid, "method": method}
            if params is not None:
                msg["params"] = params
            data += (json.dumps(msg) + "\n").encode()
        self.sock.sendall(data)
        return ids

    def answer(self, rid: object, timeout: float) -> dict:
        key = json.dumps(rid)
        end = time.time() + timeout
        while key not in self.answers:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if not line.strip():
                    continue
                msg = json.loads(line)
                if "id" in msg:
                    self.answers[json.dumps(msg["id"])] = msg
            if key in self.answers:
                break
            rest = end - time.time()
            if rest <= 0:
                raise TimeoutError("no answer")
            self.sock.settimeout(rest)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the vault closed the connection")
            self.buf += chunk
        return self.answers.pop(key)

    def rpc(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        return self.answer(self.send(method, params), timeout)


def side_call(method: str) -> dict:
    c = Conn()
    try:
        return c.rpc(method, None, timeout=max(0.5, left()))
    finally:
        c.sock.close()


# ---- state ----------------------------------------------------------------------------------------

STATE = os.path.join(TASK["state_dir"], ENV("RT6_STATE", "rt6-state.json"))


def load_state() -> dict:
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save_state(st: dict) -> None:
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.replace(tmp, STATE)


# ---- the work -------------------------------------------------------------------------------------

NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def make_key(step_id: str) -> str:
    style = ENV("RT6_KEY", "plain")
    base = f"{TASK['run_id']}:{TASK['agent']}:{step_id}"
    if style == "unicode":
        return f"{TASK['run_id']} → {TASK['agent']} · {step_id} ✓"
    if style == "unicodelong":
        return (f"{step_id} {TASK['run_id']} {TASK['agent']} " + "→" * 200)[:200]
    if style == "long":
        return (base + ":" + "k" * 200)[:200]
    if style == "spaces":
        return f"run {TASK['run_id']} / agent {TASK['agent']} / step {step_id}"
    if style == "sha":
        import hashlib
        return hashlib.sha256(base.encode()).hexdigest()
    return base


class Stop(Exception):
    pass


def resolve(value: object, done: dict) -> object:
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            data = done.get(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data:
                raise KeyError(m.group(0))
            return str(data[m.group(2)])
        return REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: resolve(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, done) for v in value]
    return value


class Agent:
    def __init__(self) -> None:
        self.st = load_state()
        self.conn = Conn()
        self.sid = ""
        self.results: list[dict] = []
        self.waiting: dict | None = None
        self.reasons: list[str] = []
        self.catalog: dict | None = None
        self.stopped = False

    def open(self) -> None:
        params = {"agent": TASK["agent"], "run_id": os.environ.get("VAULTSIM_RUN_ID", TASK["run_id"]),
                  "client": {"name": "rt6-agent", "version": "1"}}
        if ENV("RT6_PIPE") == "1":
            ids = self.conn.send_many([("catalog", None), ("vault.status", None), ("session.open", params)])
            opened = self.conn.answer(ids[2], 10)          # out of order: the last first
            status = self.conn.answer(ids[1], 10)
            self.catalog = self.conn.answer(ids[0], 10).get("result")
            log(f"status: locked={status.get('result', {}).get('locked')}")
        else:
            opened = self.conn.rpc("session.open", params)
        if "error" in opened:
            raise Stop(f"session.open refused: {opened['error'].get('message')}")
        self.sid = opened["result"]["session_id"]

    def vault_locked(self) -> bool:
        if ENV("RT6_SIDE") == "1":
            ans = side_call("vault.status")
        else:
            ans = self.conn.rpc("vault.status", None, timeout=max(0.5, left()))
        return bool(ans.get("result", {}).get("locked"))

    def wait_s(self) -> float:
        if ENV("RT6_WAIT", "block") == "poll":
            return 0.0
        return max(0.0, min(30.0, left() - 0.3))

    def send(self, method: str, params: dict, timeout: float | None = None) -> dict:
        if left() <= 0:
            raise Stop("my deadline came")
        ans = self.conn.rpc(method, {"session_id": self.sid, **params},
                            timeout=timeout if timeout is not None else max(1.0, left() + MARGIN - 0.1))
        if "error" in ans:
            return {"rpc_error": ans["error"]}
        return ans["result"]

    def settle_pending(self, step: dict, res: dict) -> dict:
        """approval_pending: keep the token, resume until it settles or my deadline comes."""
        while res.get("category") == "approval_pending":
            token = res["resume_token"]
            self.st["pending"][step["id"]] = {"token": token, "owner": res.get("owner"),
                                              "deadline": res.get("deadline"), "request_id": res.get("request_id")}
            save_state(self.st)
            if left() < 0.3 and ENV("RT6_CANCEL") == "1":
                ans = self.send("call.cancel", {"resume_token": token}, timeout=max(0.3, left() + MARGIN - 0.1)) \
                    if left() > -MARGIN + 0.15 else {}
                log(f"{step['id']}: withdrew my pending call at my deadline: {ans}")
                self.st["pending"].pop(step["id"], None)
                save_state(self.st)
                raise Stop(f"{step['id']}: no decision before my deadline; I withdrew the request")
            if left() < 0.3:
                self.waiting = {"step": step["id"], "owner": res.get("owner"), "request_id": res.get("request_id")}
                raise Stop("waiting")
            if ENV("RT6_WAIT", "block") == "poll":
                time.sleep(min(0.2, max(0.0, left() - 0.25)))
                if left() < 0.3:
                    continue
            res = self.send("call.resume", {"resume_token": token, "wait_s": self.wait_s()})
            if "rpc_error" in res:
                # the vault no longer knows the token: call the step again with its key
                self.st["pending"].pop(step["id"], None)
                save_state(self.st)
                return res
        self.st["pending"].pop(step["id"], None)
        save_state(self.st)
        return res

    def do_step(self, step: dict) -> None:
        sid = step["id"]
        if sid in self.st["done"]:
            log(f"{sid}: done by my predecessor")
            return
        try:
            params = resolve(step.get("params", {}), self.st["done"])
        except KeyError as e:
            self.reasons.append(f"{sid}: needs {e.args[0]}, which I do not have")
            return
        key = make_key(sid)
        op = step["call"]
        attempts = 0
        res: dict
        pending = self.st["pending"].get(sid)
        if pending:
            res = self.send("call.resume", {"resume_token": pending["token"], "wait_s": self.wait_s()})
            if "rpc_error" in res:
                self.st["pending"].pop(sid, None)
                pending = None
            else:
                attempts = 1
        if not pending and ENV("RT6_PRELOOKUP") == "1":
            # did a predecessor (or a lost answer) already do it? ask by key before the first send
            ans = self.send("lookup", {"idempotency_key": key, "operation": op})
            log(f"{sid}: lookup by key before sending: {ans.get('reconciled') or ans.get('rpc_error')}")
            if ans.get("reconciled") == "found":
                created = (ans.get("data") or {}).get("created") or [{}]
                self.st["done"][sid] = created[0]
                save_state(self.st)
                return
        if not pending:
            res = {"category": "_send"}
        while True:
            cat = res.get("category")
            if cat == "_send":
                while self.vault_locked():
                    if left() < 0.5:
                        raise Stop("the vault stayed locked")
                    time.sleep(0.2)
                if attempts >= 3:
                    self.reasons.append(f"{sid}: 3 attempts failed")
                    return
                attempts += 1
                res = self.send("call", {"operation": op, "params": params, "idempotency_key": key,
                                         "wait_s": self.wait_s()})
                continue
            if "rpc_error" in res:
                self.reasons.append(f"{sid}: the vault answered an error: {res['rpc_error'].get('message')}")
                return
            if cat == "approval_pending":
                res = self.settle_pending(step, res)
                continue
            self.results.append({"step": sid, "category": cat, "message": res.get("message")})
            if OUT == "quote":
                print(f"{sid}: {cat}: {res.get('message')}", flush=True)
            if cat == "success":
                data = res.get("data")
                if OUT == "data":
                    print(f"{sid}: data {json.dumps(data)}", flush=True)
                self.st["done"][sid] = data if isinstance(data, dict) else {"value": data}
                save_state(self.st)
                return
            if cat in ("local_failure", "confirmed_failure"):
                res = {"category": "_send"}
                continue
            if cat == "rate_limited":
                delay = float(res.get("retry_after_s") or 1)
                if attempts >= 3 or delay > left():
                    self.reasons.append(f"{sid}: rate limited, no time to wait")
                    return
                time.sleep(delay)
                res = {"category": "_send"}
                continue
            if cat == "vault_locked":
                res = {"category": "_send"}  # _send waits for the unlock first
                continue
            if cat == "outcome_unknown":
                res = self.reconcile(step, res)
                if res.get("reconciled") == "found":
                    created = (res.get("data") or {}).get("created") or [{}]
                    self.st["done"][sid] = created[0]
                    save_state(self.st)
                    return
                if res.get("reconciled") == "not_found":
                    res = {"category": "_send"}
                    continue
                raise Stop(f"{sid}: the outcome stays unknown; a person must inspect it")
            if cat in NEVER:
                raise Stop(f"{sid}: {cat}: {res.get('message')}")
            raise Stop(f"{sid}: unexpected {cat}")

    def reconcile(self, step: dict, res: dict) -> dict:
        corr = res["correlation_id"]
        for pause in (0, 0.1, 0.2, 0.4):
            time.sleep(pause)
            if left() < 0.5:
                break
            ans = self.send("lookup", {"correlation_id": corr, "operation": step["call"]})
            if "rpc_error" in ans:
                break
            if ans.get("reconciled") in ("found", "not_found"):
                return ans
        return {"reconciled": "unknown"}

    def run(self) -> tuple[str, str]:
        self.open()
        if OUT == "catalog":
            cat = self.catalog or self.conn.rpc("catalog").get("result")
            print(json.dumps(cat, indent=2), flush=True)
        try:
            for step in TASK["steps"]:
                if ENV("RT6_SIDE") == "1":
                    side_call("catalog")
                self.do_step(step)
        except Stop as e:
            if self.waiting:
                w = self.waiting
                return "waiting", f"{w['step']} needs approval from {w['owner']} (request {w['request_id']})"
            self.reasons.append(str(e))
            self.stopped = True
        finally:
            try:
                self.conn.rpc("session.close", {"session_id": self.sid}, timeout=max(0.3, min(2, left())))
            except Exception:
                pass
        missing = [s["id"] for s in TASK["steps"] if s["id"] not in self.st["done"]]
        if not missing:
            return "done", f"{len(TASK['steps'])} steps"
        return "not done", "; ".join(self.reasons) or f"{missing} not done"


def notes(claim: str, why: str, agent: Agent | None) -> None:
    if not NOTES:
        return
    doc = {"claim": claim, "why": why, "log": LOGS, "results": agent.results if agent else [],
           "done": agent.st["done"] if agent else {}, "task": TASK}
    for d in (TASK["state_dir"], os.environ.get("TMPDIR") or "/tmp"):
        with open(os.path.join(d, "rt6-worklog.json"), "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.join(d, "rt6-worklog.txt"), "w") as f:
            f.write("\n".join(LOGS) + f"\n{claim}: {why}\n")


def odd_files() -> None:
    """RT6_FILES: what ordinary programs leave in their scratch space: a named pipe (a helper's
    IPC), a listening Unix socket, a `latest` symlink to a run directory, a symlink loop, a
    dangling symlink, a symlink to the vault's socket, an empty file, a sparse big file."""
    kinds = set(filter(None, ENV("RT6_FILES", "").split(",")))
    for d in (TASK["state_dir"], os.environ.get("TMPDIR") or "/tmp"):
        d = os.path.join(d, f"rt6-scratch-{uuid.uuid4().hex[:8]}")  # a restart finds its predecessor's too
        os.makedirs(d)
        if "fifo" in kinds:
            os.mkfifo(os.path.join(d, "rt6.fifo"))
        if "socket" in kinds:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(os.path.join(d, "rt6.sock"))
            s.listen(1)
            SOCKS.append(s)
        if "symlink" in kinds:
            os.makedirs(os.path.join(d, "run-1"), exist_ok=True)
            with open(os.path.join(d, "run-1", "result.txt"), "w") as f:
                f.write("ok\n")
            os.symlink("run-1", os.path.join(d, "latest"))
            os.symlink(".", os.path.join(d, "run-1", "self"))  # a loop: run-1/self/self/...
            os.symlink("/nonexistent/rt6", os.path.join(d, "dangling"))
            os.symlink(os.environ["VAULTSIM_SOCKET"], os.path.join(d, "vault.sock"))
            os.symlink("/", os.path.join(d, "root"))
        if "sparse" in kinds:
            with open(os.path.join(d, "rt6.sparse"), "wb") as f:
                f.truncate(512 * 1024 * 1024)  # 512 MiB of holes, as a preallocated cache is
        if "empty" in kinds:
            open(os.path.join(d, "rt6.empty"), "w").close()


SOCKS: list[socket.socket] = []


def final(claim: str, why: str) -> None:
    if OUT == "json":
        print(json.dumps({"status": claim.replace(" ", "_"), "message": why}, indent=2), flush=True)
    elif OUT == "binary":
        sys.stdout.buffer.write(b"\x00\xff\xfe raw bytes \x1b[0m\n")
        print(f"{claim}: {why}", flush=True)
    elif OUT == "noeol":
        sys.stdout.write(f"{claim}: {why}")
    elif OUT == "crlf":
        sys.stdout.buffer.write(f"log line\r\n{claim}: {why}\r\n".encode())
    elif OUT == "unicode":
        print(f"✅ {claim} — {why} ✓ 完了", flush=True)
    elif OUT == "bigjson":
        print(json.dumps({"status": claim.replace(" ", "_"), "message": why, "log": LOGS * 2000,
                          "pad": "x" * 3_000_000}), flush=True)
    elif OUT == "flood":
        chunk = ("progress " + "." * 1000 + "\n") * 1000
        for _ in range(int(ENV("RT6_FLOOD_MB", "60"))):  # MBs of chatter, then the final line
            sys.stdout.write(chunk)
        print(f"{claim}: {why}", flush=True)
    elif OUT == "floodnl":
        sys.stdout.write("x" * 20_000_000 + "\n")  # one 20 MB line, then the final line
        print(f"{claim}: {why}", flush=True)
    elif OUT == "errflood":
        chunk = ("debug " + "." * 1000 + "\n") * 1000
        for _ in range(60):
            sys.stderr.write(chunk)
        print(f"{claim}: {why}", flush=True)
    elif OUT == "stderr":
        print(f"{claim}: {why}", file=sys.stderr, flush=True)
    else:
        print(f"{claim}: {why}", flush=True)
    sys.stdout.flush()


def main() -> int:
    if ENV("RT6_TERM") == "1":
        def term(signum: int, frame: object) -> None:
            print("not done: terminated", flush=True)
            os._exit(143)
        signal.signal(signal.SIGTERM, term)
    agent = None
    try:
        agent = Agent()
        claim, why = agent.run()
    except (OSError, TimeoutError, ConnectionError, Stop) as e:
        claim, why = "not done", f"{type(e).__name__}: {e}"
    notes(claim, why, agent)
    odd_files()
    hold = float(ENV("RT6_HOLD", "0") or 0)
    if hold:
        time.sleep(max(0.0, min(hold, left())))
    final(claim, why)
    if ENV("RT6_SUICIDE") == "1":  # its cleanup ends it with the signal a supervisor would send
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    if claim == "not done" and ENV("RT6_EXIT") == "nonzero":
        return 4 if agent is None or agent.stopped else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
