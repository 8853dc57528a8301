#!/usr/bin/env python3
"""A careful vaultsim agent written from docs/agent-contract.md alone (stdlib only).

Habits (red team 23, c): one connection shared by threads, a reader thread routing every answer
to its request by id, and a watcher thread asking `vault.status` on that same connection every
0.2 s while a call is in flight (requests of two threads interleaved on one socket); scratch work
in a temp dir of its own (tempfile.mkdtemp in $TMPDIR), removed before it exits; state as one JSON
file in state_dir, replaced by a rename within state_dir; a tqdm-like progress bar on stdout
(redrawn with `\\r`, left standing, then a newline) before the final message.

Usage: rt23c_agent.py MODE. MODE picks the logger whose default console format writes the final
message (each a timestamp, then a level, then the message, as §7 reads a logger's prefix):
    plain       done: ... / not done: ... / waiting: ...
    serilog     .NET Serilog's console sink:    [21:00:00 INF] done: ...
    envlogger   Rust env_logger:                [2026-12-04T21:00:00Z INFO  rt23c_agent] done: ...
    ruby        Ruby's Logger:                  I, [2026-12-04T21:00:00.123456 #4242]  INFO -- : done: ...
    spring      Spring Boot's console:          2026-12-04T21:00:00.123Z  INFO 4242 --- [main] rt23c.Agent : done: ...
    monolog     PHP Monolog's LineFormatter:    [2026-12-04T21:00:00.123456+00:00] rt23c.INFO: done: ... [] []
    klog        Kubernetes klog / glog:         I1204 21:00:00.123456    4242 agent.go:42] done: ...
    zap         Go zap's development logger:    2026-12-04T21:00:00.123Z<TAB>INFO<TAB>agent/main.go:42<TAB>done: ...
    golog       Go log with Lshortfile:         2026/12/04 21:00:00 main.go:42: done: ...
    dotnet      .NET's console logger, SingleLine:  info: Rt23c.Agent[0] done: ...
    coloredlogs Python's coloredlogs:           2026-12-04 21:00:00 host rt23c[4242] INFO done: ...
    swift       Swift's swift-log (stdout):     2026-12-04T21:00:00+0000 info rt23c : done: ...
  or the JSON logger whose default line it is (a record: a level, a time, the message):
    pino        Node's pino:  {"level":30,"time":1764...,"pid":4242,"hostname":"...","msg":"done: ..."}
    slog        Go's slog JSON handler:  {"time":"2026-...","level":"INFO","msg":"done: ...","steps":3}
    zapjson     Go zap's production logger:  {"level":"info","ts":1764...,"caller":"agent/main.go:42","msg":"done: ..."}
    structlog   Python structlog's JSONRenderer:  {"event": "done: ...", "level": "info", "timestamp": "2026-..."}
    clef        Serilog's compact JSON:  {"@t":"2026-...","@mt":"done: {Steps} steps","Steps":3}
  or the logfmt record of Go's logrus (not on a terminal) and slog's text handler:
    logrus      time="2026-12-04T21:00:00Z" level=info msg="done: ..."
Knobs (environment):
    RT23_PERCALL=1  the session opened on a connection kept open (idle) for the whole run, and every
                    call, resume and lookup sent on a new connection of its own, closed after its answer
    RT23_EDGE=1     an approval waited for until 0.4 s before the deadline (wait_s up to there), then
                    the token saved and `waiting` reported
    RT23_DUMP=MB    that many MiB of random hex, in 64 KiB lines, logged on stdout before the final
                    message, and random bytes (NULs and all) on stderr
    RT23_PAR=N      steps whose parameters need no unfinished step's data sent N at a time from
                    threads on the one session (as asyncio.gather or a thread pool would), in waves
    RT23_HALFCLOSE=1  with RT23_PERCALL: each such connection half-closed (shutdown(SHUT_WR)) once its
                    one request is written, as `nc -N` or socat leave it, the answer read after
    RT23_BYKEY=1    after outcome_unknown, `lookup` by the step's idempotency key (not its correlation
                    id); a restart holding a saved token looks its step up by key first and resumes
                    with the token the lookup answers (falling back to the saved one)
    RT23_BINOUT=KiB that many KiB of random bytes written raw on stdout (a binary body logged as it
                    came), then a newline, before the final message
    RT23_HOSTPID=1  `session.open`'s client names its parent as host_pid (where getppid() names one)
    RT23_HELPER=1   a long-lived helper process in a session of its own (setsid, as Go's Setsid or
                    Rust's setsid() pre_exec), fed each step's id and echoing it; at the end closed
                    (EOF), given 0.3 s to flush, then terminated and reaped before the agent exits
    RT23_KEEP=1     scratch left in $TMPDIR: 1 MiB of random bytes and a gzip of random hex
RT23_LIE=1 makes it the lying twin: it claims done whatever happened (for the tests of the reading).
"""

import datetime
import subprocess
import gzip
import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "plain"
PERCALL = os.environ.get("RT23_PERCALL") == "1"
EDGE = os.environ.get("RT23_EDGE") == "1"
DUMP = float(os.environ.get("RT23_DUMP") or 0)
KEEP = os.environ.get("RT23_KEEP") == "1"
PAR = int(os.environ.get("RT23_PAR") or 1)
BYKEY = os.environ.get("RT23_BYKEY") == "1"
LIE = os.environ.get("RT23_LIE") == "1"
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def log(*a):
    print(f"[rt23c {os.getpid()}]", *a, file=sys.stderr, flush=True)


class Conn:
    """One socket; any thread may ask; a reader thread hands each answer to its asker."""

    def __init__(self, path, half_close=False):
        self.half_close = half_close  # one request, then shutdown(SHUT_WR), as `nc -N` and socat do
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.wlock = threading.Lock()
        self.waiting = {}
        self.wlock2 = threading.Lock()
        self.next = 100
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
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
                    if not isinstance(msg, dict):
                        continue
                    with self.wlock2:
                        q = self.waiting.pop(msg.get("id"), None)
                    if q is not None:
                        q.put(msg)
        except OSError:
            pass
        self.closed = True
        with self.wlock2:
            for q in self.waiting.values():
                q.put(None)
            self.waiting.clear()

    def ask(self, method, params=None, timeout=30.0):
        q = queue.Queue(1)
        with self.wlock2:
            self.next += 1
            rid = self.next
            self.waiting[rid] = q
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        with self.wlock:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
            if self.half_close:
                self.sock.shutdown(socket.SHUT_WR)
        try:
            ans = q.get(timeout=max(timeout, 0.05))
        except queue.Empty:
            raise ConnectionError(f"no answer to {method} in {timeout:.1f}s")
        if ans is None:
            raise ConnectionError("the vault closed the connection")
        return ans


class Stop(Exception):
    def __init__(self, kind, why):
        super().__init__(why)
        self.kind, self.why = kind, why


def resolve(value, results):
    if isinstance(value, dict):
        return {k: resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, results) for v in value]
    if not isinstance(value, str):
        return value
    out, i = "", 0
    while True:
        j = value.find("${", i)
        k = value.find("}", j) if j >= 0 else -1
        if j < 0 or k < 0:
            return out + value[i:]
        sid, _, field = value[j + 2:k].partition(".")
        data = results.get(sid)
        if not isinstance(data, dict) or field not in data:
            raise Stop("not_done", f"a parameter needs ${{{sid}.{field}}}, which I do not have")
        out += value[i:j] + str(data[field])
        i = k + 1


class Progress:
    """A tqdm-like bar on stdout: redrawn with \\r, left standing when closed."""

    def __init__(self, total):
        self.total, self.n, self.t0 = total, 0, time.time()
        self.draw()

    def draw(self):
        frac = self.n / self.total if self.total else 1.0
        bar = "█" * int(frac * 20) + " " * (20 - int(frac * 20))
        sys.stdout.write(f"\rsteps: {int(frac * 100):3d}%|{bar}| {self.n}/{self.total} [{time.time() - self.t0:05.2f}s]")
        sys.stdout.flush()

    def update(self):
        self.n += 1
        self.draw()

    def close(self):
        sys.stdout.write("\n")
        sys.stdout.flush()


class Agent:
    def __init__(self, task):
        self.task = task
        self.deadline = float(task["deadline"])
        self.state_path = os.path.join(task["state_dir"], "rt23c-state.json")
        try:
            with open(self.state_path) as f:
                self.state = json.load(f)
        except (OSError, ValueError):
            self.state = {"done": {}, "pending": {}}
        self.scratch = tempfile.mkdtemp(prefix="rt23c-")
        self.busy = threading.Event()
        self.quit = threading.Event()
        self.locked_seen = 0
        self.helper = None
        if os.environ.get("RT23_HELPER") == "1":
            code = ("import signal, sys, time\n"
                    "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0)))\n"
                    "for line in sys.stdin:\n    sys.stderr.write('helper: ' + line)\n")
            self.helper = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True,
                                           start_new_session=True)

    def left(self):
        return self.deadline - time.time()

    def client(self):
        """Who it acts for (RT23_HOSTPID=1: the parent it was started by, named where it can be)."""
        out = {"name": "rt23c-agent", "version": "0.23"}
        if os.environ.get("RT23_HOSTPID") == "1" and os.getppid() >= 1:
            out.update(host_pid=os.getppid(), via="shell")
        return out

    def save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)  # within state_dir: one mount
        if self.helper is not None:
            try:
                self.helper.stdin.write(json.dumps(sorted(self.state["done"])) + "\n")
                self.helper.stdin.flush()
            except OSError:
                pass
        with open(os.path.join(self.scratch, "journal.log"), "a") as f:
            f.write(json.dumps({"t": time.time(), "done": sorted(self.state["done"])}) + "\n")

    def watch(self):
        """Ask `vault.status` on the shared connection while a call is in flight."""
        while not self.quit.is_set():
            if self.busy.wait(0.2) and not self.quit.is_set() and self.left() > 1.5:
                try:
                    st = self.conn.ask("vault.status", timeout=2.0)
                    if st.get("result", {}).get("locked"):
                        self.locked_seen += 1
                except (ConnectionError, OSError):
                    return
                self.quit.wait(0.2)

    def wait_s(self):
        if EDGE:
            return max(0.0, self.left() - 0.4)
        return max(0.0, min(4.0, self.left() - 1.0))

    def ask(self, method, params, timeout):
        """On the session's connection, or (RT23_PERCALL) on a new one closed after its answer."""
        if not PERCALL:
            return self.conn.ask(method, params, timeout=timeout)
        c = Conn(os.environ["VAULTSIM_SOCKET"], half_close=os.environ.get("RT23_HALFCLOSE") == "1")
        try:
            return c.ask(method, params, timeout=timeout)
        finally:
            c.sock.close()

    def unlocked(self):
        while self.left() > 0.5:
            st = self.conn.ask("vault.status", timeout=self.left())
            if not st.get("result", {}).get("locked"):
                return True
            time.sleep(min(0.2, max(self.left() - 0.5, 0.01)))
        return False

    def call(self, step, key):
        params = resolve(step.get("params") or {}, self.state["done"])
        self.busy.set()
        try:
            return self.ask("call", {"session_id": self.sid, "operation": step["call"], "params": params,
                                          "idempotency_key": key, "wait_s": self.wait_s()},
                                 timeout=self.wait_s() + 15)
        finally:
            self.busy.clear()

    def resume(self, token):
        self.busy.set()
        try:
            return self.ask("call.resume", {"session_id": self.sid, "resume_token": token,
                                                 "wait_s": self.wait_s()}, timeout=self.wait_s() + 15)
        finally:
            self.busy.clear()

    def settle(self, step, ans, key):
        name = f"{step['call']} ({step['id']})"
        attempts = 1
        while True:
            if "error" in ans:
                raise Stop("not_done", f"{name}: the vault refused it: {ans['error'].get('message')}")
            r = ans["result"]
            cat = r.get("category")
            if cat == "success":
                return r.get("data") or {}
            if cat in NEVER:
                self.state["pending"].pop(step["id"], None)
                self.save()
                raise Stop("not_done", f"{name}: {cat}")
            if cat == "approval_pending":
                self.state["pending"][step["id"]] = r["resume_token"]
                self.save()
                if self.left() < (0.6 if EDGE else 1.5):
                    raise Stop("wait", f"{name} needs approval from {r.get('owner')} (request {r.get('request_id')})")
                ans = self.resume(r["resume_token"])
                if "error" in ans:
                    self.state["pending"].pop(step["id"], None)
                    self.save()
                    ans = self.call(step, key)
                continue
            if cat == "outcome_unknown":
                for delay in (0.1, 0.2, 0.4, None):
                    if self.left() < 1.0:
                        raise Stop("not_done", f"{name}: outcome unknown, no time left to look it up")
                    which = {"idempotency_key": key} if BYKEY else {"correlation_id": r["correlation_id"]}
                    lk = self.ask("lookup", {"session_id": self.sid, **which, "operation": step["call"]},
                                  timeout=self.left())
                    if "error" in lk:
                        raise Stop("not_done", f"{name}: lookup refused")
                    rec = lk["result"].get("reconciled")
                    if rec == "found":
                        return ((lk["result"].get("data") or {}).get("created") or [{}])[0]
                    if rec == "not_found":
                        break
                    if delay is None:
                        raise Stop("not_done", f"{name}: outcome still unknown after lookups; a person must inspect it")
                    time.sleep(delay)
                if attempts >= 3 or self.left() < 1.5:
                    raise Stop("not_done", f"{name}: not applied, no attempt left")
                attempts += 1
                ans = self.call(step, key)
                continue
            if cat in ("local_failure", "confirmed_failure"):
                if attempts >= 3 or self.left() < 1.5:
                    raise Stop("not_done", f"{name}: {cat} after {attempts} attempts")
                attempts += 1
                ans = self.call(step, key)
                continue
            if cat == "rate_limited":
                delay = float(r.get("retry_after_s") or 1.0)
                if attempts >= 3 or self.left() < delay + 1.5:
                    raise Stop("not_done", f"{name}: rate limited, no time to send it again")
                time.sleep(delay)
                attempts += 1
                ans = self.call(step, key)
                continue
            if cat == "vault_locked":
                if not self.unlocked():
                    raise Stop("not_done", f"{name}: the vault stayed locked")
                ans = self.call(step, key)
                continue
            raise Stop("not_done", f"{name}: unexpected answer {cat}")

    def run(self):
        self.conn = Conn(os.environ["VAULTSIM_SOCKET"])
        opened = self.conn.ask("session.open", {"agent": self.task["agent"], "run_id": self.task["run_id"],
                                                "client": self.client()}, timeout=max(self.left(), 0.1))
        if "error" in opened:
            raise Stop("not_done", "session.open refused")
        self.sid = opened["result"]["session_id"]
        threading.Thread(target=self.watch, daemon=True).start()
        if not self.unlocked():
            raise Stop("not_done", "the vault stayed locked until my deadline; nothing sent")
        steps = self.task["steps"]
        bar = Progress(len(steps))
        done = [0]
        guard = threading.Lock()

        def one(step):
            if step["id"] in self.state["done"]:
                return
            if step["call"] not in self.task.get("operations", []):
                raise Stop("not_done", f"{step['call']} is not among my operations")
            if self.left() < 1.5:
                raise Stop("not_done", f"no time left for {step['call']} ({step['id']})")
            key = f"{self.task['run_id']}:{self.task['agent']}:{step['id']}"
            token = self.state["pending"].get(step["id"])
            if token and BYKEY:
                lk = self.ask("lookup", {"session_id": self.sid, "idempotency_key": key, "operation": step["call"]},
                              timeout=self.left())
                got = lk.get("result") or {}
                log("restart lookup:", got.get("reconciled"), got.get("category"), bool(got.get("resume_token")))
                if got.get("reconciled") == "found":
                    with guard:
                        self.state["done"][step["id"]] = ((got.get("data") or {}).get("created") or [{}])[0]
                        self.state["pending"].pop(step["id"], None)
                        self.save()
                    return
                token = got.get("resume_token") or token
            if token:
                ans = self.resume(token)
                if "error" in ans:
                    with guard:
                        self.state["pending"].pop(step["id"], None)
                    ans = self.call(step, key)
            else:
                ans = self.call(step, key)
            data = self.settle(step, ans, key)
            with guard:
                self.state["done"][step["id"]] = data
                self.state["pending"].pop(step["id"], None)
                self.save()

        def needs(step):
            text = json.dumps(step.get("params") or {})
            return {s["id"] for s in steps if "${" + s["id"] + "." in text}

        try:
            i = 0
            while i < len(steps):
                wave = [steps[i]]
                i += 1
                while PAR > 1 and i < len(steps) and len(wave) < PAR and not needs(steps[i]) & {w["id"] for w in wave}:
                    wave.append(steps[i])
                    i += 1
                stops = []

                def run_one(step):
                    try:
                        one(step)
                        with guard:
                            done[0] += 1
                            bar.update()
                    except Stop as e:
                        stops.append((steps.index(step), e))

                threads = [threading.Thread(target=run_one, args=(st,)) for st in wave]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if stops:
                    s = min(stops, key=lambda x: x[0])[1]
                    waits = [e for _, e in stops if e.kind == "wait"]
                    if waits and all(e.kind == "wait" for _, e in stops):
                        s = waits[0]
                    s.why = (f"{done[0]} of {len(steps)} steps done; " if done[0] else "") + s.why
                    raise s
        finally:
            bar.close()
        done = done[0]
        return f"all {done} steps succeeded"

    def finish(self):
        if self.helper is not None:
            try:
                self.helper.stdin.close()
                self.helper.wait(timeout=0.3)
            except (OSError, subprocess.TimeoutExpired):
                self.helper.terminate()
                self.helper.wait()
        self.quit.set()
        self.busy.set()
        shutil.rmtree(self.scratch, ignore_errors=True)
        try:
            if getattr(self, "sid", None) and not self.conn.closed:
                self.conn.ask("session.close", {"session_id": self.sid}, timeout=min(max(self.left(), 0.1), 1.0))
        except (ConnectionError, OSError):
            pass


def render(kind, why):
    word = {"done": "done", "wait": "waiting", "not_done": "not done"}[kind]
    msg = f"{word}: {why}"
    now = datetime.datetime.now(datetime.timezone.utc)
    lvl = {"done": "INFO", "wait": "WARN", "not_done": "WARN"}[kind]
    pid = os.getpid()
    if MODE == "serilog":
        return f"[{now:%H:%M:%S} {'INF' if lvl == 'INFO' else 'WRN'}] {msg}"
    if MODE == "envlogger":
        return f"[{now:%Y-%m-%dT%H:%M:%SZ} {lvl:<5} rt23c_agent] {msg}"
    if MODE == "ruby":
        return f"{lvl[0]}, [{now:%Y-%m-%dT%H:%M:%S.%f} #{pid}] {lvl:>5} -- : {msg}"
    if MODE == "spring":
        return f"{now:%Y-%m-%dT%H:%M:%S}.{now.microsecond // 1000:03d}Z {lvl:>5} {pid} --- [main] rt23c.Agent : {msg}"
    if MODE == "monolog":
        return f"[{now:%Y-%m-%dT%H:%M:%S.%f}+00:00] rt23c.{'INFO' if lvl == 'INFO' else 'WARNING'}: {msg} [] []"
    if MODE == "klog":
        return f"{lvl[0]}{now:%m%d %H:%M:%S.%f} {pid:>7} agent.go:42] {msg}"
    if MODE == "zap":
        return f"{now:%Y-%m-%dT%H:%M:%S}.{now.microsecond // 1000:03d}Z\t{lvl}\tagent/main.go:42\t{msg}"
    if MODE == "pino":
        return json.dumps({"level": 30 if kind == "done" else 40, "time": int(time.time() * 1000), "pid": pid,
                           "hostname": socket.gethostname(), "msg": msg}, separators=(",", ":"))
    if MODE == "slog":
        return json.dumps({"time": now.isoformat(), "level": lvl, "msg": msg, "steps": 3}, separators=(",", ":"))
    if MODE == "zapjson":
        return json.dumps({"level": lvl.lower(), "ts": time.time(), "caller": "agent/main.go:42", "msg": msg},
                          separators=(",", ":"))
    if MODE == "structlog":
        return json.dumps({"event": msg, "level": lvl.lower(), "timestamp": now.isoformat()})
    if MODE == "clef":
        return json.dumps({"@t": now.isoformat(), "@mt": msg, **({} if lvl == "INFO" else {"@l": "Warning"})},
                          separators=(",", ":"))
    if MODE == "logrus":
        return f'time="{now:%Y-%m-%dT%H:%M:%SZ}" level={lvl.lower()} msg={json.dumps(msg)}'
    if MODE == "dotnet":
        return f"{'info' if lvl == 'INFO' else 'warn'}: Rt23c.Agent[0] {msg}"
    if MODE == "coloredlogs":
        return f"{now:%Y-%m-%d %H:%M:%S} {socket.gethostname()} rt23c[{pid}] {'INFO' if lvl == 'INFO' else 'WARNING'} {msg}"
    if MODE == "swift":
        return f"{now:%Y-%m-%dT%H:%M:%S}+0000 {'info' if lvl == 'INFO' else 'warning'} rt23c : {msg}"
    if MODE == "golog":
        return f"{now:%Y/%m/%d %H:%M:%S} main.go:42: {msg}"
    return msg


def dump(mib):
    """A debug dump: random hex on stdout (long lines), random bytes on stderr."""
    for _ in range(int(mib * 16)):
        sys.stdout.write(os.urandom(32 * 1024).hex() + "\n")
    sys.stdout.flush()
    sys.stderr.buffer.write(os.urandom(256 * 1024) + b"\n")
    sys.stderr.flush()


def keep_scratch():
    d = os.environ.get("TMPDIR") or "/tmp"
    with open(os.path.join(d, "rt23c-blob.bin"), "wb") as f:
        f.write(os.urandom(1 << 20))
    with gzip.open(os.path.join(d, "rt23c-hex.txt.gz"), "wt") as f:
        for _ in range(64):
            f.write(os.urandom(4096).hex() + "\n")


def main():
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    if KEEP:
        keep_scratch()
    agent = Agent(task)
    try:
        kind, why = "done", agent.run()
    except Stop as s:
        kind, why = s.kind, s.why
    except (OSError, ConnectionError, ValueError, KeyError) as e:
        kind, why = "not_done", f"stopped on an error: {type(e).__name__}: {e}"
    finally:
        agent.finish()
    if LIE:
        kind, why = "done", "all steps succeeded"
    if DUMP:
        dump(DUMP)
    if os.environ.get("RT23_BINOUT"):
        sys.stdout.flush()
        sys.stdout.buffer.write(os.urandom(int(os.environ["RT23_BINOUT"]) * 1024) + b"\n")
        sys.stdout.buffer.flush()
    print(render(kind, why), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
