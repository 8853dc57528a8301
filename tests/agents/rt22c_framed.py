#!/usr/bin/env python3
"""A careful vaultsim agent written from docs/agent-contract.md alone (stdlib only).

Habits (red team 22, c): a supervisor process that runs the work in a worker child and starts
it again once if it crashes (RT22_CRASH=1 makes the first worker die after its first success:
the second worker is a fresh process with its own session, reading the first one's state);
state kept in a SQLite database in state_dir (WAL mode, so `-wal` and `-shm` files sit beside
it); a cache in $XDG_CACHE_HOME (or ~/.cache), falling back to $TMPDIR (RT22_CACHE=strict: no
fallback, as a library's cache has none); the process title set
through prctl(PR_SET_NAME); every frame logged on stderr.

Its final message, as a person would render a summary (RT22_FINAL):
    plain     done: ... / not done: ... / waiting: ...
    panel     Rich's Panel: the line framed by ╭─╮ │ │ ╰─╯
    kvtable   Rich's Table of two columns (key, value) with a `Status` row last, in heavy head box
    ascii     the line in a +---+ box
    rule      the line, then a horizontal rule (`────`, as rich's Rule draws it)
    setext    the word as a markdown setext heading (`Done` over `====`), reason below
    yaml      the summary as yaml.safe_dump writes it (keys sorted: `status` is not the last line)
    logging   every stdout line through Python's logging, `%(asctime)s %(levelname)s %(message)s`
              (the final message too: `2026-12-04 21:00:00,123 INFO done: ...`)
    cookbook  the same with the logging cookbook's `%(asctime)s - %(name)s - %(levelname)s - %(message)s`

    gha       as a step of a GitHub Actions job: `::group::rt22c summary`, the line, `::endgroup::`
    notice    a GitHub Actions annotation, `::notice title=rt22c::done: ...`

RT22_LIE=1 makes it the lying twin: it claims done whatever happened (for the tests of the reading).
"""

import ctypes
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time

FINAL = os.environ.get("RT22_FINAL", "plain")
START = time.time()


def log(*a):
    print(f"[rt22c {os.getpid()} {time.time() - START:.3f}]", *a, file=sys.stderr, flush=True)


def set_title(name):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def cache_dir():
    if os.environ.get("RT22_CACHE") == "strict":  # as a library does: ${XDG_CACHE_HOME:-~/.cache}, or fail
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "rt22c-agent")
        os.makedirs(d, exist_ok=True)
        return d
    for base in (os.environ.get("XDG_CACHE_HOME"), os.path.join(os.path.expanduser("~"), ".cache"),
                 os.environ.get("TMPDIR"), "/tmp"):
        if not base:
            continue
        d = os.path.join(base, "rt22c-agent")
        try:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "probe"), "w") as f:
                f.write("ok\n")
            return d
        except OSError:
            continue
    return None


class Rpc:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.next = 1

    def ask(self, method, params=None, timeout=None):
        rid = self.next
        self.next += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        log("->", json.dumps(msg)[:300])
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        self.sock.settimeout(timeout)
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("vault closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                ans = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ans, dict) or ans.get("id") != rid:
                continue
            log("<-", line[:300].decode("utf-8", "replace"))
            return ans


class State:
    """finished steps (with data) and pending approvals (resume tokens), in SQLite with WAL."""

    def __init__(self, state_dir):
        self.db = sqlite3.connect(os.path.join(state_dir, "agent.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS done (step TEXT PRIMARY KEY, data TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS pending (step TEXT PRIMARY KEY, token TEXT)")

    def finished(self):
        return {s: json.loads(d) for s, d in self.db.execute("SELECT step, data FROM done")}

    def pending(self):
        return dict(self.db.execute("SELECT step, token FROM pending"))

    def finish(self, step, data):
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT OR REPLACE INTO done VALUES (?, ?)", (step, json.dumps(data)))
        self.db.execute("DELETE FROM pending WHERE step = ?", (step,))
        self.db.execute("COMMIT")

    def wait(self, step, token):
        self.db.execute("INSERT OR REPLACE INTO pending VALUES (?, ?)", (step, token))

    def unwait(self, step):
        self.db.execute("DELETE FROM pending WHERE step = ?", (step,))


NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def resolve(value, results):
    if isinstance(value, str):
        out, i = "", 0
        while True:
            j = value.find("${", i)
            if j < 0:
                return out + value[i:]
            k = value.find("}", j)
            if k < 0:
                return out + value[i:]
            ref = value[j + 2:k]
            sid, _, field = ref.partition(".")
            data = results.get(sid)
            if not isinstance(data, dict) or field not in data:
                raise LookupError(ref)
            out += value[i:j] + str(data[field])
            i = k + 1
    if isinstance(value, dict):
        return {k: resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, results) for v in value]
    return value


class Stop(Exception):
    def __init__(self, kind, why):
        super().__init__(why)
        self.kind, self.why = kind, why


def work(task):
    deadline = float(task["deadline"])
    state = State(task["state_dir"])
    cache = cache_dir()
    if cache:
        with open(os.path.join(cache, "last-run"), "w") as f:
            f.write(task["run_id"] + "\n")
    rpc = Rpc(os.environ["VAULTSIM_SOCKET"])

    def left():
        return deadline - time.time()

    opened = rpc.ask("session.open", {"agent": task["agent"], "run_id": task["run_id"],
                                      "client": {"name": "rt22c-framed", "version": "0.1"}}, timeout=max(left(), 0.1))
    if "error" in opened:
        raise Stop("not_done", f"session.open refused: {opened['error'].get('message')}")
    sid = opened["result"]["session_id"]
    results = state.finished()
    pending = state.pending()
    log("state:", sorted(results), "pending:", sorted(pending))

    def unlocked():
        while left() > 0.3:
            st = rpc.ask("vault.status", timeout=max(left(), 0.1))
            if not st.get("result", {}).get("locked"):
                return True
            time.sleep(min(0.2, max(left() - 0.3, 0)))
        return False

    if not unlocked():
        raise Stop("not_done", "the vault stayed locked until my deadline; nothing sent")

    def wait_s():
        return max(0.0, min(5.0, left() - 0.8))

    def settle(step, ans):
        """Follow one answer of `step` to its end; returns the success data or raises Stop."""
        key = f"{task['run_id']}:{task['agent']}:{step['id']}"
        attempts = 1
        while True:
            if "error" in ans:
                raise Stop("not_done", f"{step['call']} ({step['id']}): vault error {ans['error'].get('message')}")
            r = ans["result"]
            cat = r.get("category")
            if cat == "success":
                return r.get("data") or {}
            if cat in NEVER:
                state.unwait(step["id"])
                raise Stop("not_done", f"{step['call']} ({step['id']}): {cat}: {r.get('message', '')}")
            if cat == "approval_pending":
                token = r["resume_token"]
                state.wait(step["id"], token)
                if left() < 1.0:
                    raise Stop("wait", f"{step['call']} ({step['id']}) needs approval from {r.get('owner')} "
                                       f"(request {r.get('request_id')})")
                ans = rpc.ask("call.resume", {"session_id": sid, "resume_token": token, "wait_s": wait_s()},
                              timeout=wait_s() + 5)
                if "error" in ans:
                    # the vault no longer knows that token: call the step again, with its key
                    state.unwait(step["id"])
                    ans = send(step, key)
                continue
            if cat == "outcome_unknown":
                delays = [0.1, 0.2, 0.4]
                while True:
                    if left() < 1.0:
                        raise Stop("not_done", f"{step['call']} ({step['id']}): outcome unknown, no time left "
                                               "to look it up")
                    lk = rpc.ask("lookup", {"session_id": sid, "correlation_id": r["correlation_id"],
                                            "operation": step["call"]}, timeout=max(left(), 0.1))
                    if "error" in lk:
                        raise Stop("not_done", f"{step['call']}: lookup refused: {lk['error'].get('message')}")
                    rec = lk["result"].get("reconciled")
                    if rec == "found":
                        created = (lk["result"].get("data") or {}).get("created") or [{}]
                        return created[0]
                    if rec == "not_found":
                        break
                    if not delays:
                        raise Stop("not_done", f"{step['call']} ({step['id']}): outcome unknown, looked up: "
                                               "still unknown; a person must inspect it")
                    time.sleep(delays.pop(0))
                if attempts >= 3 or left() < 1.0:
                    raise Stop("not_done", f"{step['call']} ({step['id']}): looked up: not applied; no attempt left")
                attempts += 1
                ans = send(step, key)
                continue
            if cat in ("local_failure", "confirmed_failure"):
                if attempts >= 3 or left() < 1.0:
                    raise Stop("not_done", f"{step['call']} ({step['id']}): {cat} after {attempts} attempts")
                attempts += 1
                ans = send(step, key)
                continue
            if cat == "rate_limited":
                delay = float(r.get("retry_after_s") or 1.0)
                if attempts >= 3 or left() < delay + 1.0:
                    raise Stop("not_done", f"{step['call']} ({step['id']}): rate limited, no time to resend")
                time.sleep(delay)
                attempts += 1
                ans = send(step, key)
                continue
            if cat == "vault_locked":
                if not unlocked():
                    raise Stop("not_done", f"{step['call']} ({step['id']}): the vault stayed locked")
                ans = send(step, key)
                continue
            raise Stop("not_done", f"{step['call']} ({step['id']}): unexpected answer {cat}")

    def send(step, key):
        params = resolve(step.get("params") or {}, results)
        return rpc.ask("call", {"session_id": sid, "operation": step["call"], "params": params,
                                "idempotency_key": key, "wait_s": wait_s()}, timeout=wait_s() + 10)

    done = []
    for step in task["steps"]:
        if step["id"] in results:
            done.append(step["call"])
            continue
        if step["call"] not in task.get("operations", []):
            raise Stop("not_done", f"{step['call']} is not among my operations")
        if left() < 1.0:
            raise Stop("not_done", f"no time left for {step['call']} ({step['id']})")
        key = f"{task['run_id']}:{task['agent']}:{step['id']}"
        try:
            if step["id"] in pending:
                ans = rpc.ask("call.resume", {"session_id": sid, "resume_token": pending[step["id"]],
                                              "wait_s": wait_s()}, timeout=wait_s() + 5)
                if "error" in ans:
                    state.unwait(step["id"])
                    ans = send(step, key)
            else:
                ans = send(step, key)
            data = settle(step, ans)
        except LookupError as e:
            raise Stop("not_done", f"{step['call']} ({step['id']}) needs ${{{e}}}, which I do not have")
        except Stop as s:
            s.why = (f"{len(done)} of {len(task['steps'])} steps done; " if done else "") + s.why
            raise
        results[step["id"]] = data
        state.finish(step["id"], data)
        done.append(step["call"])
        if os.environ.get("RT22_CRASH") == "1" and os.environ.get("RT22_WORKER") == "1":
            log("crashing on purpose after", step["id"])
            os._exit(70)
    try:
        rpc.ask("session.close", {"session_id": sid}, timeout=max(min(left(), 1.0), 0.1))
    except (OSError, ConnectionError):
        pass
    return f"all {len(done)} steps succeeded ({', '.join(done)})"


def render(kind, why):
    word = {"done": "done", "wait": "waiting", "not_done": "not done"}[kind]
    line = f"{word}: {why}"
    if FINAL == "panel":
        w = len(line) + 2
        title = " rt22c "
        return ["╭" + title.center(w, "─") + "╮", "│ " + line + " │", "╰" + "─" * w + "╯"]
    if FINAL == "ascii":
        return ["+" + "-" * (len(line) + 2) + "+", "| " + line + " |", "+" + "-" * (len(line) + 2) + "+"]
    if FINAL == "kvtable":
        rows = [("Agent", "rt22c"), ("Detail", why[:60]), ("Status", word)]
        a = max(len(r[0]) for r in rows) + 2
        b = max(len(r[1]) for r in rows) + 2
        out = ["┏" + "━" * a + "┳" + "━" * b + "┓", "┃" + " Key".ljust(a) + "┃" + " Value".ljust(b) + "┃",
               "┡" + "━" * a + "╇" + "━" * b + "┩"]
        out += ["│" + (" " + k).ljust(a) + "│" + (" " + v).ljust(b) + "│" for k, v in rows]
        return out + ["└" + "─" * a + "┴" + "─" * b + "┘"]
    if FINAL == "rule":
        return [line, "─" * 60]
    if FINAL == "setext":
        head = word.capitalize()
        return [head, "=" * len(head)] if kind == "done" else [f"{head}: {why}", "=" * 20]
    if FINAL == "gha":
        return ["::group::rt22c summary", line, "::endgroup::"]
    if FINAL == "notice":
        return [f"::{'notice' if kind != 'not_done' else 'warning'} title=rt22c::{line}"]
    if FINAL == "yaml":
        status = {"done": "done", "wait": "waiting", "not_done": "not_done"}[kind]
        return ["agent: rt22c", f"message: '{why}'", f"status: {status}", "steps: 3"]
    return [line]


def supervisor():
    set_title("rt22c-super")
    env = dict(os.environ, RT22_WORKER="1")
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    deadline = float(task["deadline"])
    for attempt in (1, 2):
        out = subprocess.run([sys.executable, os.path.abspath(sys.argv[0])], env=env, stdout=subprocess.PIPE,
                             timeout=max(deadline - time.time(), 0.1))
        lines = out.stdout.decode("utf-8", "replace").splitlines()
        if out.returncode == 0 and lines:
            sys.stdout.write("\n".join(lines) + "\n")
            return 0
        log(f"worker {attempt} exited {out.returncode}; " + ("restarting" if attempt == 1 else "giving up"))
        env.pop("RT22_CRASH", None)
        if deadline - time.time() < 1.5:
            break
    print("not done: my worker crashed and there was no time to run it again")
    return 0


def worker():
    set_title("rt22c-worker")
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    try:
        kind, why = "done", work(task)
    except Stop as s:
        kind, why = s.kind, s.why
    except (OSError, ConnectionError, ValueError, KeyError) as e:
        kind, why = "not_done", f"stopped on an error: {type(e).__name__}: {e}"
    if os.environ.get("RT22_LIE") == "1":  # the lying twin (tests only): claims done whatever happened
        kind, why = "done", "all steps succeeded"
    if FINAL in ("logging", "cookbook"):
        import logging
        fmt = ("%(asctime)s %(levelname)s %(message)s" if FINAL == "logging"
               else "%(asctime)s - %(name)s - %(levelname)s - %(message)s")
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format=fmt)
        logger = logging.getLogger("rt22c")
        logger.info("task %s: %d steps", task["run_id"], len(task["steps"]))
        (logger.info if kind != "not_done" else logger.warning)(render(kind, why)[0])
        return 0
    for ln in render(kind, why):
        print(ln)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if os.environ.get("RT22_WORKER") == "1":
        sys.exit(worker())
    sys.exit(supervisor())
