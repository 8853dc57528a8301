#!/usr/bin/env python3
"""A careful agent as a pre-fork worker pool, written from docs/agent-contract.md alone.

The supervisor forks N workers once, before it opens anything (no session or
connection is inherited). Each worker opens its own connection and session on
its first step and keeps them (section 3: one session per process). Steps whose
operation the vault's `catalog` says is `approval.mode: auto` go to a free worker;
consecutive auto steps that need nothing of each other run side by side. Every
other step (gated, denied, or a mode this agent does not know) the supervisor
calls itself, alone and in order, so that its one session's grant covers the
later gated steps (a worker's grant would not carry, and its prompts count).

State: one JSON file in state_dir, replaced by a rename written in state_dir.
RT33C_WORKERS sets N (default 3). RT33C_LIE=1 is the lying twin: it claims
done whatever happened.
"""

import json
import os
import random
import select
import socket
import sys
import time

MARGIN = 1.5  # seconds before the deadline at which no new request starts
FATAL = {"authentication_failed", "authorization_denied", "malformed_response",
         "approval_denied", "approval_expired", "approval_unroutable"}
BOUNDED = {"local_failure", "confirmed_failure"}


def log(*a):
    print("[rt33c-prefork %d]" % os.getpid(), *a, file=sys.stderr, flush=True)


class Conn:
    def __init__(self, path, deadline):
        self.deadline = deadline
        self.sock = None
        delay = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(5)
                s.connect(path)
                break
            except BlockingIOError:
                s.close()
            except OSError as e:
                s.close()
                if e.errno not in (11,):
                    raise
            if time.time() + delay > deadline - MARGIN:
                raise OSError("vault socket busy until the deadline")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        s.settimeout(None)
        self.sock = s
        self.buf = b""
        self.next_id = 1

    def request(self, method, params=None, timeout=None):
        rid = self.next_id
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        limit = time.time() + (timeout if timeout is not None else 60)
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and obj.get("id") == rid:
                    return obj
            left = limit - time.time()
            if left <= 0:
                raise TimeoutError(method)
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("vault closed the connection")
            self.buf += chunk


class Session:
    def __init__(self, task):
        self.task = task
        self.deadline = float(task["deadline"])
        self.conn = Conn(os.environ["VAULTSIM_SOCKET"], self.deadline)
        params = {"agent": task["agent"], "run_id": task["run_id"]}
        if os.environ.get("RT33C_CLIENT") == "1":  # who we act for (section 3); a parent pid only where we can name one
            params["client"] = {"name": "rt33c-pool", "version": "0.1", "via": "worker pool"}
            if os.getppid() > 1:
                params["client"]["host_pid"] = os.getppid()
        r = self.conn.request("session.open", params,
                              timeout=max(1.0, self.deadline - time.time()))
        if "error" in r:
            raise RuntimeError("session.open refused: %s" % r["error"].get("message"))
        self.sid = r["result"]["session_id"]

    def left(self):
        return self.deadline - time.time()

    def rpc(self, method, params):
        p = dict(params)
        p["session_id"] = self.sid
        wait = p.get("wait_s", 0)
        # never wait for an answer past the deadline: exit in time instead
        return self.conn.request(method, p, timeout=max(0.2, min(wait + 5.0 if wait else 30.0,
                                                                 self.left() - 0.3)))

    def close(self):
        try:
            self.conn.request("session.close", {"session_id": self.sid}, timeout=1.0)
        except Exception:
            pass


def created_data(res):
    data = res.get("data") or {}
    created = data.get("created") or []
    return created[0] if created else data


def run_step(sess, step, params, key, op, attempts=0, token=None, on_pending=None):
    """One step to its end. Returns (state, detail): done(data) | failed | fatal | waiting(token)
    | unknown(correlation id: not reconciled before the deadline)."""
    def wait_s():
        return max(0.0, min(30.0, sess.left() - MARGIN - 0.5))

    res = None
    if token is not None:
        r = sess.rpc("call.resume", {"resume_token": token, "wait_s": wait_s()})
        if "error" in r:
            token = None  # the vault no longer knows it: call the step again, with its key
        else:
            res = r["result"]
    while True:
        if res is None:
            if sess.left() < MARGIN:
                return ("failed", "deadline before sending")
            if attempts >= 3:
                return ("failed", "three attempts")
            attempts += 1
            r = sess.rpc("call", {"operation": op, "params": params,
                                  "idempotency_key": key, "wait_s": wait_s()})
            if "error" in r:
                return ("failed", "error %s" % r["error"].get("message"))
            res = r["result"]
        cat = res.get("category")
        if cat == "success":
            return ("done", res.get("data") or {})
        if cat in FATAL:
            return ("fatal", "%s: %s" % (cat, res.get("message", "")))
        if cat == "approval_pending":
            token = res.get("resume_token")
            if on_pending:
                on_pending(token)
            while cat == "approval_pending":
                if sess.left() < MARGIN + 0.5:
                    return ("waiting", {"token": token, "owner": res.get("owner"),
                                        "request_id": res.get("request_id"), "attempts": attempts})
                r = sess.rpc("call.resume", {"resume_token": token, "wait_s": wait_s()})
                if "error" in r:
                    return ("failed", "resume error")
                res = r["result"]
                cat = res.get("category")
            continue
        if cat in BOUNDED:
            res = None
            continue
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 1.0) + random.uniform(0.01, 0.1)
            if attempts >= 3:
                return ("failed", "rate limited three times")
            if time.time() + delay > sess.deadline - MARGIN:
                return ("retry_at", {"at": time.time() + delay, "attempts": attempts})
            time.sleep(delay)
            res = None
            continue
        if cat == "vault_locked":
            while True:
                if sess.left() < MARGIN:
                    return ("failed", "vault locked until the deadline")
                st = sess.conn.request("vault.status", None, timeout=5)
                if not (st.get("result") or {}).get("locked", True):
                    break
                time.sleep(0.2)
            attempts -= 1  # nothing was sent
            res = None
            continue
        if cat == "outcome_unknown":
            out = reconcile(sess, res.get("correlation_id"), op)
            if out[0] == "found":
                return ("done", out[1])
            if out[0] == "not_found":
                res = None
                continue
            if out[0] == "pending":
                token = out[1]
                res = {"category": "approval_pending", "resume_token": token}
                continue
            if out[0] == "answer":
                res = out[1]
                continue
            return ("unknown", res.get("correlation_id"))
        return ("fatal", "unexpected category %r" % cat)


def reconcile(sess, cid, op, key=None):
    """lookup until it says something: found(data) | not_found | pending(token) | answer(res) | unknown."""
    pause = 0.1
    tries = 0
    while tries < 4:  # a few times shortly (section 6); a lookup over SSH can take seconds
        if sess.left() < 2.5:
            return ("unknown", None)
        tries += 1
        q = {"operation": op}
        if cid:
            q["correlation_id"] = cid
        else:
            q["idempotency_key"] = key
        r = sess.rpc("lookup", q)
        if "error" in r:
            return ("unknown", None)
        res = r["result"]
        cat = res.get("category")
        rec = res.get("reconciled")
        if cat == "rate_limited" and rec == "unknown":
            # the vault's pace for lookups: nothing was looked up, so it is no try (section 6)
            tries -= 1
            time.sleep(float(res.get("retry_after_s") or 0.25) + random.uniform(0.01, 0.2))
            continue
        if cat != "success":
            return ("answer", res)
        if rec == "found":
            return ("found", created_data(res))
        if rec == "not_found":
            return ("not_found", None)
        if res.get("resume_token"):
            return ("pending", res["resume_token"])
        time.sleep(pause)
        pause *= 2
    return ("unknown", None)


def settle_saved(sess, cid, op, job):
    """A step a predecessor sent without keeping its answer: look it up first. Returns (state,
    detail) when that settles it; else None, with job's token set when it waits for a person (or
    after waiting out a rate limit the lookup says still runs)."""
    out = reconcile(sess, cid, op, key=job["key"])
    if out[0] == "found":
        return ("done", out[1])
    if out[0] in ("not_found", "answer"):
        # the predecessor's send was an attempt (its bounded failure, or one the remote never
        # saw): at most 3 in all for one step, its included (sections 4 and 6)
        job["attempts"] = max(job["attempts"], 1)
    if out[0] == "pending":
        job["token"] = out[1]
    elif out[0] == "unknown":
        return ("unknown", cid)
    elif out[0] == "answer":
        res = out[1]
        cat = res.get("category")
        if cat in FATAL:
            return ("fatal", cat)
        if cat == "approval_pending" and res.get("resume_token"):
            job["token"] = res["resume_token"]
        if cat == "rate_limited":  # the call's own 429, its wait still running: wait it out
            delay = float(res.get("retry_after_s") or 1.0) + random.uniform(0.01, 0.1)
            if time.time() + delay > sess.deadline - MARGIN:
                return ("retry_at", {"at": time.time() + delay, "attempts": job["attempts"]})
            time.sleep(delay)
    return None


REF = "${"


def refs(value):
    out = []
    if isinstance(value, str):
        i = value.find(REF)
        while i >= 0:
            j = value.find("}", i)
            if j < 0:
                break
            out.append(value[i + 2:j])
            i = value.find(REF, j)
    elif isinstance(value, dict):
        for v in value.values():
            out += refs(v)
    elif isinstance(value, list):
        for v in value:
            out += refs(v)
    return out


def resolve(value, done):
    if isinstance(value, str):
        for ref in refs(value):
            sid, _, field = ref.partition(".")
            data = done.get(sid)
            if not isinstance(data, dict) or field not in data:
                raise KeyError(ref)
            if value == "${%s}" % ref:
                return data[field]
            value = value.replace("${%s}" % ref, str(data[field]))
        return value
    if isinstance(value, dict):
        return {k: resolve(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, done) for v in value]
    return value


# ---- workers ------------------------------------------------------------------------------------

def crash_here(sess, job):
    """RT33C_CRASH=1: the first worker to get a job dies right after writing its call, its answer
    unread (an OOM kill, a segfault in a native library), once per run of the agent."""
    if os.environ.get("RT33C_CRASH") != "1" or "reconcile" in job:
        return
    mark = os.path.join(os.environ.get("TMPDIR", "/tmp"), "rt33c-crashed-%d" % os.getppid())
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    sess.conn.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": 999, "method": "call", "params": {
        "session_id": sess.sid, "operation": job["op"], "params": job["params"],
        "idempotency_key": job["key"], "wait_s": 0}}).encode() + b"\n")
    os._exit(70)


def worker_main(task, rfd, wfd):
    # RT33C_EAGER=1: open the session at start, as a pool's initializer does;
    # RT33C_RECYCLE=N: exit after N jobs, as maxtasksperchild or gunicorn's max_requests do
    recycle = int(os.environ.get("RT33C_RECYCLE", "0"))
    sess = Session(task) if os.environ.get("RT33C_EAGER") == "1" else None
    rf = os.fdopen(rfd, "r")
    wf = os.fdopen(wfd, "w")
    jobs = 0
    for line in rf:
        job = json.loads(line)
        try:
            if sess is None:
                sess = Session(task)
            crash_here(sess, job)
            settled = settle_saved(sess, job["reconcile"], job["op"], job) if "reconcile" in job else None
            if settled:
                state, detail = settled
            else:
                state, detail = run_step(sess, job["step"], job["params"], job["key"], job["op"],
                                         attempts=job.get("attempts", 0), token=job.get("token"))
        except Exception as e:  # noqa: BLE001 - the supervisor decides what a broken worker means
            state, detail = "broken", repr(e)[:200]
        jobs += 1
        bye = recycle > 0 and jobs >= recycle
        if bye and sess is not None:
            sess.close()
        wf.write(json.dumps({"id": job["step"], "state": state, "detail": detail, "bye": bye}) + "\n")
        wf.flush()
        if bye:
            os._exit(0)
    if sess is not None:
        sess.close()
    os._exit(0)


class Pool:
    def __init__(self, task, n):
        self.task = task
        self.workers = []
        for _ in range(n):
            self.workers.append(self.spawn())

    def spawn(self):
        """A worker; a replacement is forked later, from a supervisor holding its own connection,
        which the child leaves alone (and, as most pools, does not close)."""
        to_r, to_w = os.pipe()
        back_r, back_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(to_w)
            os.close(back_r)
            for w in self.workers:
                os.close(w["to"])
                os.close(w["back"])
            worker_main(self.task, to_r, back_w)
        os.close(to_r)
        os.close(back_w)
        return {"pid": pid, "to": to_w, "back": back_r, "busy": None, "buf": b""}

    def replace(self, w):
        os.close(w["to"])
        os.close(w["back"])
        os.waitpid(w["pid"], 0)
        i = self.workers.index(w)
        del self.workers[i]  # before the fork: the child closes every other worker's pipes
        self.workers.insert(i, self.spawn())

    def free(self):
        return [w for w in self.workers if w["busy"] is None]

    def busy(self):
        return [w for w in self.workers if w["busy"] is not None]

    def give(self, w, job):
        w["busy"] = job["step"]
        w["job"] = job
        os.write(w["to"], (json.dumps(job) + "\n").encode())

    def collect(self, timeout):
        """Answers of workers that finished within timeout."""
        out = []
        fds = {w["back"]: w for w in self.busy()}
        if not fds:
            return out
        ready, _, _ = select.select(list(fds), [], [], max(0.0, timeout))
        for fd in ready:
            w = fds[fd]
            chunk = os.read(fd, 65536)
            if not chunk:
                out.append({"id": w["busy"], "state": "died", "detail": w.get("job")})
                w["busy"] = None
                self.replace(w)  # a supervisor replaces a dead worker, as every pool does
                continue
            w["buf"] += chunk
            while b"\n" in w["buf"]:
                line, w["buf"] = w["buf"].split(b"\n", 1)
                res = json.loads(line)
                out.append(res)
                w["busy"] = None
                if res.get("bye"):
                    self.replace(w)
                    break
        return out

    def stop(self, deadline):
        for w in self.workers:
            try:
                os.close(w["to"])
            except OSError:
                pass
        for w in self.workers:
            while True:
                pid, _ = os.waitpid(w["pid"], os.WNOHANG)
                if pid:
                    break
                if time.time() > deadline - 0.3:
                    os.kill(w["pid"], 9)
                    os.waitpid(w["pid"], 0)
                    break
                time.sleep(0.02)


# ---- supervisor ---------------------------------------------------------------------------------

class State:
    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, "rt33c-prefork.json")
        self.tmp = os.path.join(state_dir, ".rt33c-prefork.tmp")
        try:
            with open(self.path) as f:
                self.d = json.load(f)
        except (OSError, ValueError):
            self.d = {}
        self.d.setdefault("steps", {})

    def step(self, sid):
        return self.d["steps"].get(sid, {})

    def put(self, sid, **kw):
        self.d["steps"][sid] = kw
        self.save()

    def save(self):
        with open(self.tmp, "w") as f:
            json.dump(self.d, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(self.tmp, self.path)


def main():
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    lie = os.environ.get("RT33C_LIE") == "1"
    deadline = float(task["deadline"])
    n = int(os.environ.get("RT33C_WORKERS", "3"))
    st = State(task["state_dir"])
    steps = task["steps"]
    allowed = set(task.get("operations") or [])
    key_of = {s["id"]: "%s:%s:%s" % (task["run_id"], task["agent"], s["id"]) for s in steps}
    pool = Pool(task, n)  # forked before any connection is opened
    sess = None
    final = None
    try:
        sess = Session(task)
        final = supervise(task, sess, pool, st, steps, allowed, key_of)
    except Exception as e:  # noqa: BLE001
        log("supervisor broke:", repr(e)[:200])
        final = "not done: the agent broke (%s)" % type(e).__name__
    finally:
        pool.stop(deadline)
        if sess is not None and time.time() < deadline - 0.2:
            sess.close()
    if lie:
        final = "done: all %d steps" % len(steps)
    print(final, flush=True)


def supervise(task, sess, pool, st, steps, allowed, key_of):
    if st.d.get("fatal"):
        return "not done: a predecessor was told to stop (%s)" % st.d["fatal"]
    modes = {}
    r = sess.conn.request("catalog", None, timeout=10)
    for entry in (r.get("result") or {}).get("operations") or []:
        modes[entry.get("name")] = (entry.get("approval") or {}).get("mode")
    done = {sid: v["data"] for sid, v in st.d["steps"].items() if v.get("state") == "done"}
    failed, waiting, unknown = set(), {}, set()
    fatal = None
    i = 0
    inflight = set()

    def finish(res):
        nonlocal fatal
        sid, state, detail = res["id"], res["state"], res["detail"]
        inflight.discard(sid)
        if state == "done":
            done[sid] = detail
            st.put(sid, state="done", data=detail)
        elif state == "waiting":
            waiting[sid] = detail
            st.put(sid, state="pending", token=detail["token"], attempts=detail.get("attempts", 1))
        elif state == "retry_at":
            failed.add(sid)
            st.put(sid, state="retry_at", at=detail["at"], attempts=detail["attempts"])
        elif state == "unknown":
            unknown.add(sid)
            st.put(sid, state="sent", cid=detail)
        elif state == "died" and detail and "reconcile" not in detail:
            log("worker died on", sid, "- looking it up by its key before anything else")
            retry.append(dict(detail, reconcile=""))
        elif state == "fatal":
            fatal = "%s: %s" % (sid, detail)
            st.d["fatal"] = fatal
            st.save()
        else:
            failed.add(sid)
            log("step", sid, state, detail)

    retry = []  # jobs whose worker died, to give again (looked up first)
    blocked = False  # the last pass could not go on until a worker answers
    while i < len(steps) or inflight or retry:
        for res in pool.collect(0.2 if blocked or i >= len(steps) else 0.0):
            finish(res)
        blocked = True
        while retry and pool.free():
            job = retry.pop(0)
            inflight.add(job["step"])
            pool.give(pool.free()[0], job)
        if retry:
            continue
        if fatal or waiting or unknown:
            if inflight:
                for res in pool.collect(0.5):
                    finish(res)
                continue
            break
        if i >= len(steps):
            continue
        blocked = False
        step = steps[i]
        sid, op = step["id"], step["call"]
        if sid in done:
            i += 1
            continue
        if op not in allowed:
            failed.add(sid)
            i += 1
            continue
        need = [ref.partition(".")[0] for ref in refs(step.get("params") or {})]
        if any(n in inflight for n in need):
            blocked = True
            continue  # its data is still being made
        if any(n not in done for n in need):
            failed.add(sid)  # never send a value we would have to guess
            i += 1
            continue
        params = resolve(step.get("params") or {}, done)
        saved = st.step(sid)
        job = {"step": sid, "op": op, "params": params, "key": key_of[sid],
               "attempts": saved.get("attempts", 0), "token": saved.get("token")}
        if saved.get("state") == "retry_at":
            left = saved["at"] - time.time()
            if left > 0:
                if time.time() + left > sess.deadline - MARGIN:
                    failed.add(sid)
                    i += 1
                    continue
                time.sleep(left)
        if saved.get("state") == "sent" and not job["token"]:
            if os.environ.get("RT33C_GATED") == "worker":
                job["reconcile"] = saved.get("cid") or ""  # worker 0 asks, on its session
            else:
                settled = settle_saved(sess, saved.get("cid"), op, job)
                if settled:
                    finish({"id": sid, "state": settled[0], "detail": settled[1]})
                    if settled[0] == "done":
                        i += 1
                    continue
        gated = modes.get(op) != "auto" or job["token"] or "reconcile" in job
        if gated and os.environ.get("RT33C_GATED") == "worker":
            # every gated step on worker 0's one session, alone and in order: its grant covers them
            if inflight:
                blocked = True
                continue
            st.put(sid, state="sent", attempts=job["attempts"])
            pool.give(pool.workers[0], job)
            got = []
            while not got:
                got = pool.collect(0.5)
            finish(got[0])
            if got[0]["state"] != "fatal":
                i += 1
            continue
        if gated:
            if inflight:
                blocked = True
                continue  # gated steps go alone, after what runs now
            st.put(sid, state="sent", attempts=job["attempts"])

            def keep_token(token, sid=sid):
                st.put(sid, state="pending", token=token, attempts=1)
            state, detail = run_step(sess, sid, params, job["key"], op, attempts=job["attempts"],
                                     token=job["token"], on_pending=keep_token)
            finish({"id": sid, "state": state, "detail": detail})
            i += 1
            continue
        free = pool.free()
        if not free:
            blocked = True
            continue
        st.put(sid, state="sent", attempts=job["attempts"])
        inflight.add(sid)
        pool.give(free[0], job)
        i += 1

    if fatal:
        return "not done: stopped, %s" % fatal
    if waiting:
        sid, w = next(iter(waiting.items()))
        return "waiting: %s needs approval from %s (request %s); the token is kept for a restart" % (
            sid, w.get("owner") or "its owner", w.get("request_id"))
    if unknown:
        return "not done: %s may have happened and could not be reconciled in time" % ", ".join(sorted(unknown))
    missing = [s["id"] for s in steps if s["id"] not in done]
    if missing:
        return "not done: %d of %d steps (%s not done)" % (len(steps) - len(missing), len(steps), ", ".join(missing))
    return "done: %d steps" % len(steps)


if __name__ == "__main__":
    main()
