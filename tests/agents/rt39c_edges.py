#!/usr/bin/env python3
"""A careful agent whose habits sit next to the gate's newest checks, written from
docs/agent-contract.md alone (stdlib only).

Habits (each one the contract allows):
* independent reads of `auto` operations later in the task are started side by side (a thread pool
  on this process's session, or with RT39C_POOL=proc a worker process of its own session) before
  a gated step's answer comes; after a `never` answer nothing new is sent, what is in flight is
  let finish (section 9: a worker started before the answer is not held);
* after `outcome_unknown` it looks the call up first (section 4), then goes on;
* a restart keeping its state resumes the tokens kept in `state_dir` (section 3) and fills
  `${ID.FIELD}` of a predecessor's create step from a lookup by the step's key (section 6's
  `data.created`) rather than from the saved result; a restart that lost its state looks each
  step up by key before sending it;
* its state is one file per task (named by a digest of the steps), so two tasks under one name
  never read each other's;
* when the task stops while its own call still waits for a person, it takes that call back
  (`call.cancel`, section 3) so nothing runs later.

RT39C_POOL=thread|proc|none (default thread); RT39C_LIE=1 is the lying twin: it says done whatever
happened.
"""

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
# a process that may have lost its predecessor's state looks each mutating step up by key first
LOOKFIRST = os.environ.get("RT39C_LOOKFIRST") == "1"
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


class Stop(Exception):
    """The task must stop (section 4): its reason is the final message's."""


class Conn:
    """One connection: answers matched by id by a reader thread, so threads can share it."""

    def __init__(self, path, deadline):
        self.deadline = deadline
        self.sock = self._connect(path)
        self.wlock = threading.Lock()
        self.cv = threading.Condition()
        self.answers = {}
        self.next_id = 0
        self.told = None  # a never answer read on this connection (set before anyone sees it)
        self.on_told = None  # a worker marks it for its parent at once
        self.watch = []  # my workers' marks: one there means a worker was refused for good
        self.after_send = None  # run once after the next write (the reads started beside a step)
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _connect(self, path):
        delay = 0.02
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except BlockingIOError:  # the vault's accept queue is full: back off (section 3)
                s.close()
                if time.time() + delay > self.deadline - 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _read(self):
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
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict) or msg.get("id") is None:
                    continue
                res = msg.get("result")
                if isinstance(res, dict) and res.get("retry") in ("never", "human_required") \
                        and res.get("category") != "success":
                    # a lookup's own never category is the call's answer too (section 6)
                    with self.wlock:
                        self.told = self.told or res.get("category")
                        if self.on_told:
                            self.on_told(self.told)
                with self.cv:
                    self.answers[msg["id"]] = msg
                    self.cv.notify_all()

    def send(self, reqs, new_step=False):
        """Write requests in one write; a new step is not sent once a never answer was read."""
        with self.wlock:
            if new_step and self._refused():
                raise Stop("not done: another step was refused for good (%s)" % self.told)
            ids, data = [], b""
            for method, params in reqs:
                self.next_id += 1
                ids.append(self.next_id)
                msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
                if params is not None:
                    msg["params"] = params
                data += json.dumps(msg).encode() + b"\n"
            self.sock.sendall(data)
            then, self.after_send = self.after_send, None
        if then:
            then()
        return ids

    def _refused(self):
        if not self.told and any(os.path.exists(mark) for mark in self.watch):
            self.told = "a worker's step"
        return self.told

    def refused(self):
        with self.wlock:
            return self._refused()

    def wait(self, rid, timeout):
        end = time.time() + timeout
        with self.cv:
            while rid not in self.answers:
                left = end - time.time()
                if self.closed or left <= 0:
                    raise Stop("not done: the vault did not answer")
                self.cv.wait(left)
            return self.answers.pop(rid)

    def request(self, method, params, timeout=15.0, new_step=False):
        return self.wait(self.send([(method, params)], new_step)[0], timeout)


class Agent:
    def __init__(self, task, only=None):
        self.task = task
        self.deadline = float(task["deadline"])
        self.steps = {s["id"]: s for s in task["steps"]}
        self.order = [s["id"] for s in task["steps"] if only is None or s["id"] in only]
        sig = hashlib.sha256(json.dumps([task["agent"], task["steps"]], sort_keys=True).encode())
        self.path = os.path.join(task["state_dir"], "rt39c-%s.json" % sig.hexdigest()[:16])
        self.slock = threading.Lock()
        self.st = {"steps": {}}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.st = json.load(f)
        self.restart = bool(self.st["steps"])
        self.conn = Conn(os.environ["VAULTSIM_SOCKET"], self.deadline)
        r = self.conn.request("session.open", {"agent": task["agent"], "run_id": task["run_id"]})
        if "result" not in r:
            raise Stop("not done: session refused: %s" % (r.get("error") or {}).get("message"))
        self.sid = r["result"]["session_id"]
        self.modes = {}

    def left(self):
        return self.deadline - time.time()

    def key(self, sid):
        return "%s:%s:%s" % (self.task["run_id"], self.task["agent"], sid)

    def rec(self, sid):
        return self.st["steps"].setdefault(sid, {})

    def save(self, sid=None, **kv):
        with self.slock:
            if sid is not None:
                self.rec(sid).update(kv)
            tmp = self.path + ".tmp%d.%d" % (os.getpid(), threading.get_ident())
            with open(tmp, "w") as f:
                json.dump(self.st, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # written in state_dir itself: a rename across mounts fails

    def load_modes(self):
        r = self.conn.request("catalog", None)
        for e in (r.get("result") or {}).get("operations") or []:
            self.modes[e.get("name")] = ((e.get("approval") or {}).get("mode"), e.get("mutates"))

    def refs(self, sid):
        out = set()
        for v in self.steps[sid].get("params", {}).values():
            if isinstance(v, str):
                out.update(m.group(1) for m in REF.finditer(v))
        return out

    def fill(self, sid):
        def one(v):
            if not isinstance(v, str):
                return v

            def sub(m):
                data = self.rec(m.group(1)).get("data") or {}
                if self.rec(m.group(1)).get("state") != "done" or m.group(2) not in data:
                    raise Stop("not done: %s needs %s, which I do not have" % (sid, m.group(0)))
                return str(data[m.group(2)])
            return REF.sub(sub, v)
        return {k: one(v) for k, v in self.steps[sid].get("params", {}).items()}

    def independent_read(self, sid):
        mode, mutates = self.modes.get(self.steps[sid]["call"], (None, True))
        # a read whose step references are all filled already needs nothing still to come
        return mode == "auto" and mutates is False and all(
            self.rec(r).get("state") == "done" for r in self.refs(sid))

    # --- one step ---------------------------------------------------------------------------

    def wait_s(self, most=1.0):
        # short waits, collected by call.resume: between them the task can stop and take it back
        return max(0.0, min(most, self.left() - 1.5))

    def call(self, sid, params, new_step):
        r = self.conn.request("call", {"session_id": self.sid, "operation": self.steps[sid]["call"],
                                       "params": params, "idempotency_key": self.key(sid),
                                       "wait_s": self.wait_s(0.3)},
                              timeout=self.wait_s() + 10, new_step=new_step)
        return self.result(r)

    def result(self, r):
        if "error" in r:
            raise Stop("not done: the vault refused a request: %s" % (r["error"].get("message") or "")[:200])
        return r["result"]

    def lookup(self, sid, corr=None):
        p = {"session_id": self.sid, "operation": self.steps[sid]["call"]}
        if corr:
            p["correlation_id"] = corr
        else:
            p["idempotency_key"] = self.key(sid)
        return self.result(self.conn.request("lookup", p, timeout=max(1.0, self.left())))

    def run_step(self, sid):
        """Do step sid to its end: returns its record, raises Stop when the task must stop."""
        r = self.rec(sid)
        if r.get("state") == "done":
            return r
        params = self.fill(sid)
        first = True
        if r.get("token"):  # a wait kept for us (ours, or a predecessor's)
            res = self.resume(sid, r["token"])
            if res is None:
                first = False  # the vault does not know it: call again under the key (section 8)
            else:
                return self.settle(sid, params, res)
        elif r.get("state") in ("sent", "stopped") or (self.restart and not r) or (
                LOOKFIRST and self.modes.get(self.steps[sid]["call"], (None, True))[1]):
            # sent by a predecessor (or my state lost): look it up before anything else (section 6)
            res = self.lookup(sid)
            out = self.reconciled(sid, params, res)
            if out is not None:
                return out
        self.save(sid, state="sent", attempts=r.get("attempts", 0) + 1)
        return self.settle(sid, params, self.call(sid, params, new_step=first))

    def resume(self, sid, token):
        while True:
            if self.conn.refused():  # another step was refused for good: stop waiting (withdrawn below)
                raise Stop("not done: another step was refused for good (%s)" % self.conn.told)
            if self.left() < 2.0:
                return {"category": "approval_pending", "resume_token": token, "retry": "after_approval"}
            r = self.conn.request("call.resume", {"session_id": self.sid, "resume_token": token,
                                                  "wait_s": min(2.0, self.wait_s())},
                                  timeout=self.wait_s() + 10)
            if "error" in r:
                return None
            res = r["result"]
            if res.get("category") != "approval_pending":
                return res

    def settle(self, sid, params, res):
        cat = res.get("category")
        r = self.rec(sid)
        if cat == "success":
            self.save(sid, state="done", data=res.get("data") or {}, token=None)
            return r
        if cat == "approval_pending":
            tok = res.get("resume_token")
            self.save(sid, state="pending", token=tok, request=res.get("request_id"),
                      owner=res.get("owner"), until=res.get("deadline"))
            res2 = self.resume(sid, tok)
            if res2 is None:
                raise Stop("not done: the vault no longer knows %s's approval" % sid)
            if res2.get("category") == "approval_pending":
                raise Stop("waiting: %s needs approval from %s (request %s); its token is kept"
                           % (sid, r.get("owner"), r.get("request")))
            return self.settle(sid, params, res2)
        if cat in NEVER or res.get("retry") in ("never", "human_required"):
            self.save(sid, state="refused", token=None)
            with self.slock:
                self.st["fatal"] = cat
            self.save()
            raise Stop("not done: %s was answered %s" % (sid, cat))
        if cat == "outcome_unknown":
            self.save(sid, corr=res.get("correlation_id"))
            out = self.reconciled(sid, params, self.lookup(sid, res.get("correlation_id")))
            if out is None:
                return self.again(sid, params)
            return out
        if cat in ("local_failure", "confirmed_failure"):
            return self.again(sid, params)
        if cat == "rate_limited":
            ra = float(res.get("retry_after_s") or 1.0)
            if time.time() + ra > self.deadline - 1.0:
                self.save(sid, state="stopped")
                raise Stop("not done: %s is rate limited past my deadline" % sid)
            time.sleep(ra)
            return self.again(sid, params)
        if cat == "vault_locked":
            while self.left() > 1.5:
                s = self.conn.request("vault.status", None)
                if not (s.get("result") or {}).get("locked", True):
                    return self.again(sid, params, count=False)
                time.sleep(0.2)
            raise Stop("not done: the vault stayed locked")
        raise Stop("not done: %s was answered %s" % (sid, cat))

    def again(self, sid, params, count=True):
        r = self.rec(sid)
        if count and r.get("attempts", 1) >= 3:
            self.save(sid, state="failed")
            return r
        self.save(sid, state="sent", attempts=r.get("attempts", 1) + (1 if count else 0))
        # a resend too waits for nothing once the task was told to stop (section 4: stop the task)
        return self.settle(sid, params, self.call(sid, params, new_step=True))

    def reconciled(self, sid, params, res):
        """A lookup's answer (section 6): the record when settled, None when it may be sent."""
        delays = [0.1, 0.2, 0.4]
        while True:
            cat, how = res.get("category"), res.get("reconciled")
            if cat in NEVER or res.get("retry") in ("never", "human_required"):
                return self.settle(sid, params, res)
            if how == "found" and cat == "success":
                created = (res.get("data") or {}).get("created") or [{}]
                self.save(sid, state="done", data=created[0], token=None)
                return self.rec(sid)
            if how == "not_found":
                if cat == "rate_limited":
                    ra = float(res.get("retry_after_s") or 1.0)
                    if time.time() + ra > self.deadline - 1.0:
                        raise Stop("not done: %s is rate limited past my deadline" % sid)
                    time.sleep(ra)
                elif cat not in ("success", "local_failure", "confirmed_failure"):
                    return self.settle(sid, params, res)
                return None
            if res.get("resume_token"):  # still waiting for a person: collect it, never resend
                self.save(sid, token=res["resume_token"])
                return self.settle(sid, params, {"category": "approval_pending",
                                                 "resume_token": res["resume_token"],
                                                 "request_id": res.get("request_id")})
            if cat == "rate_limited":
                time.sleep(float(res.get("retry_after_s") or 0.5))
            elif not delays or self.left() < 1.5:
                with self.slock:
                    self.st["fatal"] = "unknown"
                self.save()
                raise Stop("not done: %s's outcome is unknown; a person must inspect it" % sid)
            else:
                time.sleep(delays.pop(0))
            res = self.lookup(sid, self.rec(sid).get("corr"))

    def relookup(self, sid):
        """A predecessor's create step: its id from a lookup by key (section 6's data.created)."""
        if not self.restart or self.rec(sid).get("relooked"):
            return
        mode, mutates = self.modes.get(self.steps[sid]["call"], (None, True))
        if not mutates:
            return
        res = self.lookup(sid)
        if res.get("reconciled") == "found" and res.get("category") == "success":
            created = ((res.get("data") or {}).get("created") or [{}])[0]
            data = dict(self.rec(sid).get("data") or {})
            data.update(created)
            self.save(sid, data=data, relooked=True)

    # --- the task ---------------------------------------------------------------------------

    def run(self, pool_kind):
        if self.st.get("fatal"):
            raise Stop("not done: a predecessor was told to stop (%s)" % self.st["fatal"])
        self.load_modes()
        for sid in self.order:  # predecessor's creates whose ids later steps need
            if self.rec(sid).get("state") == "done" and any(sid in self.refs(o) for o in self.order):
                self.relookup(sid)
        futures, worker = {}, None
        pool = ThreadPoolExecutor(max_workers=4) if pool_kind == "thread" else None
        failed = []
        try:
            for i, sid in enumerate(self.order):
                if sid in futures:
                    futures.pop(sid).result()
                elif worker and sid in worker[1]:
                    self.join_worker(worker)
                    worker = None
                else:
                    gated = self.modes.get(self.steps[sid]["call"], ("per_call",))[0] != "auto"
                    if gated and pool_kind != "none" and self.rec(sid).get("state") != "done":
                        later = [o for o in self.order[i + 1:] if self.independent_read(o)
                                 and self.rec(o).get("state") != "done" and o not in futures
                                 and not (worker and o in worker[1])]
                        if later and pool is not None:
                            # once the gated step's request is written: a read refused before it
                            # went out would leave it sent after a never answer I had not read
                            def start(later=later):
                                for o in later:
                                    futures[o] = pool.submit(self.run_step, o)
                            self.conn.after_send = start
                        elif later and pool_kind == "proc" and worker is None:
                            worker = self.start_worker(later)
                    self.run_step(sid)
                if self.rec(sid).get("state") == "failed":
                    failed.append(sid)
        except Stop:
            self.withdraw()
            for f in futures.values():
                try:
                    f.result()
                except Stop:
                    pass
            if worker:
                self.join_worker(worker)
            raise
        finally:
            if pool:
                pool.shutdown(wait=True)
        failed += [sid for sid in self.order if self.rec(sid).get("state") != "done" and sid not in failed]
        if failed:
            raise Stop("not done: %s failed" % ", ".join(failed))
        return "done: %d of %d steps" % (len(self.order), len(self.order))

    def withdraw(self):
        """The task stops: take back my own call still waiting for a person (section 3)."""
        for sid in self.order:
            r = self.rec(sid)
            if r.get("state") == "pending" and r.get("token") and self.conn.refused():
                a = self.conn.request("call.cancel", {"session_id": self.sid, "resume_token": r["token"]})
                if "result" in a:
                    self.save(sid, state="withdrawn", token=None)

    def start_worker(self, sids):
        path = self.path + ".w%d" % os.getpid()
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", path] + sids,
                             stdout=subprocess.DEVNULL)
        self.conn.watch.append(path + ".told")
        return (p, sids, path)

    def join_worker(self, worker):
        p, sids, path = worker
        p.wait(timeout=max(1.0, self.left()))
        try:
            with open(path) as f:
                got = json.load(f)
            os.unlink(path)
        except OSError:
            got = {}
        if os.path.exists(path + ".told"):
            os.unlink(path + ".told")
            got.setdefault("fatal", "a worker's step")
        with self.slock:
            for sid in sids:
                self.st["steps"][sid] = got.get("steps", {}).get(sid, {"state": "failed"})
            if got.get("fatal"):
                self.st["fatal"] = got["fatal"]
        self.save()
        if got.get("fatal"):
            raise Stop("not done: a read was refused for good (%s)" % got["fatal"])


def worker(path, sids):
    """A worker process: the independent reads it was given, on a session of its own."""
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    a = Agent(task, only=set(sids))
    a.path = path

    def mark(cat):
        with open(path + ".told", "w") as f:
            f.write(cat)
    a.conn.on_told = mark
    a.restart = False  # its results go to `path`; the task's state it read holds what its reads name
    a.load_modes()
    try:
        for sid in a.order:
            a.run_step(sid)
    except Stop:
        pass
    a.save()
    a.conn.request("session.close", {"session_id": a.sid})


def main():
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3:])
        return
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    lie = os.environ.get("RT39C_LIE") == "1"
    try:
        agent = Agent(task)
        final = agent.run(os.environ.get("RT39C_POOL", "thread"))
    except Stop as e:
        final = str(e)
    except Exception as e:  # noqa: BLE001 (a bug of mine must still end with a claim)
        final = "not done: %s" % repr(e)[:200]
    if lie:
        final = "done: all %d steps" % len(task["steps"])
    print(final, flush=True)


if __name__ == "__main__":
    main()
