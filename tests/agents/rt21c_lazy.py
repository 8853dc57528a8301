#!/usr/bin/env -S python3 -X importtime -X utf8 -u
"""A careful agent written from docs/agent-contract.md alone (stdlib only, no project import).

Habits (pass 21, careful): started through a `/usr/bin/env -S` shebang with `-X importtime`
(hundreds of stderr lines before the first byte of its own); the task file read lazily and
re-read before every step (only `agent` and `run_id` at start; steps, operations and the deadline
from a fresh read each time); `session.open`, `vault.status` and `catalog` written in one write
before any answer is read, and every `call` pipelined behind a `vault.status`; heavy logging: every
frame at DEBUG on stderr and into rotating logs (gzip-compressed backups) in a hidden directory of
state_dir, with the journal (JSON lines, fsync'd) beside them, and (RT21_CWD_LOG=1) into the
working directory when it is writable; a careful report of partial success after a refusal.

RT21_FINAL picks the final message's rendering:
    plain  `done: ...` / `waiting: ...` / `not done: ...`
    ja     Japanese after the word, fullwidth colon: `done：すべての手順が完了しました`
    he     Hebrew after the word, the line opened by U+200E (LEFT-TO-RIGHT MARK) as bidi-aware
           tools do before a Latin word in an RTL message
    table  a markdown table of the steps, then a key-value row `| Status | ✅ done |` last
    json   one JSON object (ensure_ascii=False, localized message), no trailing newline
    ws     emoji, trailing blanks and tabs, no trailing newline
    long   the word, then a 300 KB explanation on the same line
    pydict print() of a dict holding an Enum member and a datetime:
           `{'status': <Status.DONE: 'done'>, 'finished_at': datetime.datetime(...), ...}`
    pprint the same dict through pprint.pprint, spread over several lines
    logfmt a logfmt record whose status is str() of an Enum member, as Python 3.11 writes one
           in an f-string: `ts=... level=info event=finished status=Status.DONE steps=3`
    kv     a record as structlog's KeyValueRenderer writes one (each value's repr()):
           `event='finished' status=<Status.DONE: 'done'> steps=3 at=datetime.datetime(...)`
"""

import datetime
import enum
import gzip
import json
import logging
import logging.handlers
import os
import pprint
import shutil
import socket
import sys
import time

TASK_PATH = os.environ["VAULTSIM_TASK"]
SOCK_PATH = os.environ["VAULTSIM_SOCKET"]
FINAL = os.environ.get("RT21_FINAL", "plain")
MARGIN = 0.6

log = logging.getLogger("rt21c")


def task():
    # lazily, and again every time: the file is the source of truth
    with open(TASK_PATH, encoding="utf-8-sig") as f:
        return json.load(f)


def left():
    return float(task()["deadline"]) - time.time()


def setup_logging(state_dir):
    log.setLevel(logging.DEBUG)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(fmt)
    log.addHandler(err)
    hidden = os.path.join(state_dir, ".rt21c", "logs")
    os.makedirs(hidden, exist_ok=True)

    def namer(name):
        return name + ".gz"

    def rotator(source, dest):
        with open(source, "rb") as src, gzip.open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(source)

    rot = logging.handlers.RotatingFileHandler(os.path.join(hidden, "agent.log"), maxBytes=2048,
                                               backupCount=12, encoding="utf-8")
    rot.namer = namer
    rot.rotator = rotator
    rot.setFormatter(fmt)
    log.addHandler(rot)
    if not os.environ.get("RT21_CWD_LOG"):
        return
    try:  # the working directory, when it lets us (without a jail); read-only in one
        here = logging.FileHandler(os.path.join(os.getcwd(), ".rt21c-agent.%d.log" % os.getpid()),
                                   encoding="utf-8", delay=False)
        here.setFormatter(fmt)
        log.addHandler(here)
    except OSError as exc:
        log.debug("working directory not writable: %s", exc)


class Journal:
    def __init__(self, state_dir):
        self.dir = os.path.join(state_dir, ".rt21c")
        os.makedirs(self.dir, exist_ok=True)
        self.path = os.path.join(self.dir, "journal.jsonl")
        self.done = {}
        self.pending = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # a torn last line
                    if e["kind"] == "done":
                        self.done[e["step"]] = e["data"]
                        self.pending.pop(e["step"], None)
                    elif e["kind"] == "pending":
                        self.pending[e["step"]] = e["token"]
                    elif e["kind"] == "dropped":
                        self.pending.pop(e["step"], None)
        except FileNotFoundError:
            pass

    def add(self, **entry):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if entry["kind"] == "done":
            self.done[entry["step"]] = entry["data"]
            self.pending.pop(entry["step"], None)
        elif entry["kind"] == "pending":
            self.pending[entry["step"]] = entry["token"]
        elif entry["kind"] == "dropped":
            self.pending.pop(entry["step"], None)


class Wire:
    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(SOCK_PATH)
        self.buf = b""
        self.next_id = 1
        self.answers = {}

    def send(self, *reqs):
        """Write several requests in one write; return their ids."""
        ids, out = [], b""
        for method, params in reqs:
            rid = self.next_id
            self.next_id += 1
            frame = {"jsonrpc": "2.0", "id": rid, "method": method}
            if params is not None:
                frame["params"] = params
            line = json.dumps(frame, ensure_ascii=False)
            log.debug("→ %s", line)
            out += line.encode() + b"\n"
            ids.append(rid)
        self.sock.sendall(out)
        return ids

    def wait(self, rid, timeout):
        end = time.time() + max(timeout, 0.05)
        while rid not in self.answers:
            rest = end - time.time()
            if rest <= 0:
                raise TimeoutError("no answer to %s" % rid)
            self.sock.settimeout(rest)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the vault closed the connection")
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if not line.strip():
                    continue
                log.debug("← %s", line.decode("utf-8", "replace"))
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.get("id") is not None:
                    self.answers[msg["id"]] = msg
        return self.answers.pop(rid)

    def ask(self, method, params, timeout):
        (rid,) = self.send((method, params))
        return self.wait(rid, timeout)


def resolve(value, done):
    """Fill ${ID.FIELD} from finished steps; None when a value would have to be guessed."""
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
            sid, _, fld = ref.partition(".")
            data = done.get(sid)
            if not isinstance(data, dict) or fld not in data:
                return None
            out += value[i:j] + str(data[fld])
            i = k + 1
    if isinstance(value, dict):
        res = {}
        for k, v in value.items():
            r = resolve(v, done)
            if r is None:
                return None
            res[k] = r
        return res
    if isinstance(value, list):
        res = []
        for v in value:
            r = resolve(v, done)
            if r is None:
                return None
            res.append(r)
        return res
    return value


NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


class Stop(Exception):
    def __init__(self, why, waiting=False):
        super().__init__(why)
        self.why = why
        self.waiting = waiting


def main():
    t0 = task()
    agent, run_id = t0["agent"], t0["run_id"]
    state_dir = t0["state_dir"]
    setup_logging(state_dir)
    log.info("agent %s of run %s starting, %.2f s left", agent, run_id, left())
    journal = Journal(state_dir)
    wire = Wire()
    open_id, status_id, cat_id = wire.send(
        ("session.open", {"agent": agent, "run_id": run_id, "client": {"name": "rt21c-lazy", "version": "0.21"}}),
        ("vault.status", None), ("catalog", None))
    opened = wire.wait(open_id, left() - 0.2)
    if "error" in opened:
        return finish([], "session.open refused: %s" % opened["error"].get("message"))
    sid = opened["result"]["session_id"]
    status = wire.wait(status_id, left() - 0.2)
    locked = bool(status.get("result", {}).get("locked"))
    cat = wire.wait(cat_id, left() - 0.2)
    log.debug("catalog fingerprint %s", cat.get("result", {}).get("fingerprint"))

    report = []  # (step id, operation, outcome)
    failed = set()
    stopped = None
    try:
        i = 0
        while True:
            t = task()  # re-read before every step
            steps = t["steps"]
            if i >= len(steps):
                break
            step = steps[i]
            i += 1
            stid, op = step["id"], step["call"]
            if stid in journal.done:
                report.append((stid, op, "done (saved)"))
                continue
            if op not in t["operations"]:
                report.append((stid, op, "not allowed"))
                failed.add(stid)
                continue
            params = resolve(step.get("params", {}), journal.done)
            if params is None:
                report.append((stid, op, "skipped: needs a failed step's data"))
                failed.add(stid)
                continue
            while locked:
                if left() < MARGIN + 0.3:
                    raise Stop("the vault stayed locked")
                time.sleep(0.2)
                locked = bool(wire.ask("vault.status", None, left() - 0.2).get("result", {}).get("locked"))
            outcome = run_step(wire, journal, sid, run_id, agent, stid, op, params)
            report.append((stid, op, outcome))
            if outcome == "vault_locked":
                locked = True
                i -= 1
                report.pop()
                continue
            if outcome != "done":
                failed.add(stid)
    except Stop as stop:
        stopped = stop
    except (TimeoutError, ConnectionError, OSError) as exc:
        stopped = Stop("the vault did not answer in time: %s" % exc)
    try:
        if left() > 0.3:
            wire.ask("session.close", {"session_id": sid}, min(1.0, left() - 0.2))
    except (TimeoutError, ConnectionError, OSError):
        pass
    return finish(report, stopped.why if stopped else None, failed=bool(failed) or bool(stopped),
                  waiting=bool(stopped and stopped.waiting))


def run_step(wire, journal, sid, run_id, agent, stid, op, params):
    key = "%s:%s:%s" % (run_id, agent, stid)
    attempts = 0
    token = journal.pending.get(stid)
    res = None
    if token:
        log.info("resuming %s with the saved token", stid)
        ans = wire.ask("call.resume", {"session_id": sid, "resume_token": token, "wait_s": wait_for()},
                       left())
        if "error" in ans:
            journal.add(kind="dropped", step=stid)
            token = None
        else:
            res = ans["result"]
            attempts = 1
    while True:
        if res is None:
            if left() < MARGIN + 0.2:
                raise Stop("no time left for %s" % stid)
            attempts += 1
            # a status probe pipelined before the call (one write)
            _, call_id = wire.send(("vault.status", None),
                                   ("call", {"session_id": sid, "operation": op, "params": params,
                                             "idempotency_key": key, "wait_s": wait_for()}))
            ans = wire.wait(call_id, left())
            if "error" in ans:
                log.warning("%s: error %s", stid, ans["error"])
                return "refused: %s" % ans["error"].get("message")
            res = ans["result"]
        cat = res.get("category")
        log.info("%s (%s): %s", stid, op, cat)
        if cat == "success":
            journal.add(kind="done", step=stid, data=res.get("data"))
            return "done"
        if cat == "approval_pending":
            token = res["resume_token"]
            journal.add(kind="pending", step=stid, token=token)
            while True:
                if left() < MARGIN + 0.3:
                    raise Stop("%s needs approval from %s (request %s)" % (op, res.get("owner"), res.get("request_id")),
                               waiting=True)
                ans = wire.ask("call.resume", {"session_id": sid, "resume_token": token, "wait_s": wait_for()},
                               left())
                if "error" in ans:
                    journal.add(kind="dropped", step=stid)
                    raise Stop("the vault no longer knows the approval of %s" % stid)
                res = ans["result"]
                if res.get("category") != "approval_pending":
                    break
            if res.get("category") != "success":
                journal.add(kind="dropped", step=stid)
            continue
        if cat in NEVER:
            raise Stop("%s: %s (%s)" % (stid, cat, res.get("message", "")))
        if cat in ("local_failure", "confirmed_failure"):
            if attempts >= 3:
                return "failed 3 times (%s)" % cat
            res = None
            continue
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 0)
            if attempts >= 3 or left() < delay + MARGIN + 0.3:
                return "rate limited"
            time.sleep(delay)
            res = None
            continue
        if cat == "vault_locked":
            return "vault_locked"
        if cat == "outcome_unknown":
            verdict = reconcile(wire, sid, op, res["correlation_id"])
            if verdict[0] == "found":
                created = (verdict[1] or {}).get("created") or [{}]
                journal.add(kind="done", step=stid, data=created[0])
                return "done"
            if verdict[0] == "not_found":
                if attempts >= 3:
                    return "failed 3 times (not found)"
                res = None
                continue
            raise Stop("%s: outcome unknown after lookups: a person must inspect it" % stid)
        raise Stop("%s: unexpected category %s" % (stid, cat))


def wait_for():
    return round(max(0.0, min(30.0, left() - MARGIN - 0.4)), 3)


def reconcile(wire, sid, op, cid):
    for pause in (0.0, 0.1, 0.2, 0.4):
        if left() < 1.0 + pause:
            break
        time.sleep(pause)
        ans = wire.ask("lookup", {"session_id": sid, "correlation_id": cid, "operation": op}, left() - 0.1)
        if "error" in ans:
            return ("unknown", None)
        r = ans["result"]
        if r.get("reconciled") in ("found", "not_found"):
            return (r["reconciled"], r.get("data"))
    return ("unknown", None)


class Status(str, enum.Enum):
    DONE = "done"
    AWAITING_APPROVAL = "awaiting_approval"
    NOT_DONE = "not_done"


def finish(report, why, failed=True, waiting=False):
    claim = "waiting" if waiting else ("not done" if (failed or why) else "done")
    done = [s for s, _, o in report if o.startswith("done")]
    why = why or ""
    if claim == "done":
        en = "all %d steps succeeded" % len(report)
    elif claim == "waiting":
        en = why
    else:
        en = "%d of %d steps succeeded; %s" % (len(done), len(report), why or "; ".join(
            "%s: %s" % (s, o) for s, _, o in report if not o.startswith("done")))
    log.info("finishing: %s %s", claim, en)
    if FINAL == "ja":
        ja = {"done": "すべての手順が完了しました", "waiting": "承認待ち（%s）" % en,
              "not done": "未完了：%d/%d 手順が成功（%s）" % (len(done), len(report), why)}[claim]
        out = "%s：%s\n" % (claim, ja)
    elif FINAL == "he":
        he = {"done": "כל השלבים הושלמו", "waiting": "ממתין לאישור (%s)" % en,
              "not done": "לא הושלם: %s" % en}[claim]
        out = "\u200e%s: %s\n" % (claim, he)
    elif FINAL == "table":
        rows = ["| Step | Operation | Result |", "|---|---|---|"]
        rows += ["| %s | %s | %s |" % (s, o, r) for s, o, r in report]
        mark = {"done": "✅", "waiting": "⏳", "not done": "❌"}[claim]
        out = "\n".join(["## Summary", "", *rows, "", "| Key | Value |", "|---|---|",
                         "| Reason | %s |" % (why or "-"), "| **Status** | %s %s |" % (mark, claim)]) + "\n"
    elif FINAL == "json":
        status = {"done": "done", "waiting": "waiting", "not done": "not_done"}[claim]
        out = json.dumps({"status": status, "message": en, "メッセージ": "結果: " + claim,
                          "steps": [{"id": s, "operation": o, "result": r} for s, o, r in report]},
                         ensure_ascii=False)
    elif FINAL == "ws":
        mark = {"done": "🎉", "waiting": "⏳", "not done": "⚠️"}[claim]
        out = "%s %s — %s %s \t  " % (mark, claim, en, mark)
    elif FINAL in ("pydict", "pprint", "logfmt", "kv"):
        status = {"done": Status.DONE, "waiting": Status.AWAITING_APPROVAL, "not done": Status.NOT_DONE}[claim]
        if FINAL == "kv":
            record = {"event": "finished", "status": status, "steps": len(report),
                      "at": datetime.datetime.now(), "message": en}
            out = " ".join("%s=%r" % kv for kv in record.items()) + "\n"
        elif FINAL == "logfmt":
            out = "ts=%s level=info event=finished status=%s steps=%d\n" % (
                datetime.datetime.now(datetime.timezone.utc).isoformat(), status, len(report))
        else:
            summary = {"status": status, "finished_at": datetime.datetime.now(),
                       "steps": [{"id": s, "operation": o, "result": r} for s, o, r in report], "message": en}
            out = (pprint.pformat(summary, width=60) if FINAL == "pprint" else repr(summary)) + "\n"
    elif FINAL == "long":
        out = "%s: %s; %s\n" % (claim, en, " ".join("(detail %d)" % n for n in range(30000)))
    else:
        out = "%s: %s\n" % (claim, en)
    sys.stdout.write("rt21c: %d steps reported\n" % len(report))
    sys.stdout.write(out)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
