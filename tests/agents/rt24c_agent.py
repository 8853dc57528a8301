#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone (stdlib only).

Its shape: a supervisor that opens no session and runs the work in a worker, a fresh exec of this
same file (`--worker`), starting it again when it crashes (at most 3 workers). The worker keeps a
journal in state_dir (one JSON file, replaced by a rename inside state_dir, §1): each step is
marked `sent` before its request is written, and `done` (with its data) or `pending` (with its
resume token) once answered. A worker that finds a step `sent` but never answered reconciles it
by its idempotency key (`lookup`, §3 and §6) before anything else: `found` is the step done (its
data the first of `data.created`), `not_found` a resend under the same key, `unknown` with a
resume token a `call.resume`. The supervisor prints the final message from the journal.

Knobs (environment):
  RT24_CRASH=1     the first worker dies (os._exit) right after writing its first mutating call,
                   before reading the answer: the next worker must reconcile it
  RT24_CRASH=2     the first worker dies after its first call was answered, before it kept the
                   answer: the next worker finds the step `sent` and looks it up by its key
  RT24_EXEC=1      no supervisor child: the worker re-execs itself in place (os.execv) at the crash
  RT24_FINAL=...   plain | winston (`TIME info: done: ...`) | winston-label (`TIME [rt24c] info: ...`)
                   | stderr (the message on stderr too) | crlf-ansi (colour, blanks, CRLF)
                   | otel (OpenTelemetry's console exporter) | otlp (an OTLP/JSON record)
                   | gaveup (a pino record `done waiting, giving up: ...` when not done)
  RT24_LIE=1       claim done whatever happened (the lying twin)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import sys
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"], encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
STATE = TASK["state_dir"]
JOURNAL = os.path.join(STATE, "rt24c-journal.json")
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def log(*parts: object) -> None:
    print("rt24c:", *parts, file=sys.stderr, flush=True)


def load() -> dict:
    try:
        with open(JOURNAL, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"steps": {}, "workers": 0}


def save(journal: dict) -> None:
    tmp = JOURNAL + ".tmp"  # in state_dir itself: a rename from /tmp fails in the jail (EXDEV)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(journal, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, JOURNAL)


class Vault:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["VAULTSIM_SOCKET"])
        self.buf = b""
        self.next_id = 0

    def send(self, method: str, params: dict) -> int:
        self.next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.sock.sendall(line.encode() + b"\n")
        return self.next_id

    def answer(self, rid: int) -> dict:
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.get("id") == rid:
                    return msg
            left = DEADLINE - time.time()
            self.sock.settimeout(max(0.05, left + 0.5))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the vault closed the connection")
            self.buf += chunk

    def rpc(self, method: str, params: dict) -> dict:
        msg = self.answer(self.send(method, params))
        if "error" in msg:
            return {"ok": False, "category": "rpc_error", "retry": "never", "message": str(msg["error"])}
        return msg["result"]


def substitute(value: object, done: dict) -> object:
    if isinstance(value, str):
        def one(m: re.Match) -> str:
            step, field = m.group(1), m.group(2)
            data = done.get(step)
            if not isinstance(data, dict) or field not in data:
                raise KeyError(m.group(0))
            return str(data[field])
        return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", one, value)
    if isinstance(value, dict):
        return {k: substitute(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, done) for v in value]
    return value


def created_data(result: dict) -> dict:
    data = result.get("data") or {}
    created = data.get("created") if isinstance(data, dict) else None
    return created[0] if isinstance(created, list) and created and isinstance(created[0], dict) else {}


def crash_here(point: str, journal: dict) -> None:
    if os.environ.get("RT24_CRASH") == point and journal["workers"] == 1:
        log("crashing on purpose at", point)
        if os.environ.get("RT24_EXEC") == "1":
            os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "--again"])
        os._exit(3)


def work() -> None:
    journal = load()
    journal["workers"] = journal.get("workers", 0) + 1
    save(journal)
    steps = journal["steps"]
    vault = Vault()
    sid = vault.rpc("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"]}).get("session_id")
    if not sid:
        journal["stopped"] = "no session"
        save(journal)
        return
    done = {k: v["data"] for k, v in steps.items() if v.get("state") == "done"}
    for step in TASK["steps"]:
        sid_ = step["id"]
        entry = steps.get(sid_, {})
        if entry.get("state") == "done":
            continue
        if entry.get("state") == "stopped":
            journal["stopped"] = entry.get("why", "stopped")
            break
        key = f"{TASK['run_id']}:{TASK['agent']}:{sid_}"
        try:
            params = substitute(step.get("params", {}), done)
        except KeyError as missing:
            steps[sid_] = {"state": "skipped", "why": f"no data for {missing}"}
            save(journal)
            continue
        op = step["call"]
        result = settle(vault, sid, op, params, key, entry, journal, steps, sid_)
        cat = result.get("category")
        if cat == "success":
            data = result.get("data") if result.get("reconciled") != "found" else created_data(result)
            data = data if isinstance(data, dict) else {}
            steps[sid_] = {"state": "done", "data": data}
            done[sid_] = data
            save(journal)
            continue
        if cat == "approval_pending":
            steps[sid_] = {"state": "pending", "token": result.get("resume_token"), "op": op,
                           "request": result.get("request_id")}
            journal["waiting"] = f"{op} needs approval from {result.get('owner')} (request {result.get('request_id')})"
            save(journal)
            break
        steps[sid_] = {"state": "stopped", "why": f"{op}: {cat}"}
        if cat in NEVER or cat in ("rpc_error", "outcome_unknown", "vault_locked", "rate_limited"):
            journal["stopped"] = f"{op}: {cat}"
            save(journal)
            break
        save(journal)  # a bounded failure past its attempts: later steps needing none of its data go on
    vault.rpc("session.close", {"session_id": sid})


def settle(vault: Vault, sid: str, op: str, params: dict, key: str, entry: dict, journal: dict,
           steps: dict, step_id: str) -> dict:
    """One logical call of a step, from wherever a predecessor left it, to its settled result."""
    result: dict | None = None
    if entry.get("state") == "pending" and entry.get("token"):
        result = resume(vault, sid, entry["token"])
        if result.get("category") == "rpc_error":
            result = None  # the vault no longer knows the token: call the step again, with its key (§8)
    elif entry.get("state") == "sent":
        result = reconcile(vault, sid, op, {"idempotency_key": key})
        if result.get("category") == "local_failure":
            result = None  # not_found: it did not take effect, send it again under the same key
    attempts = int(entry.get("attempts", 0))  # a predecessor's attempts count too: 3 in all
    while True:
        if result is None:
            if time.time() >= DEADLINE - 0.5:
                return {"category": "deadline"}
            attempts += 1
            steps[step_id] = {"state": "sent", "attempts": attempts}
            save(journal)
            rid = vault.send("call", {"session_id": sid, "operation": op, "params": params,
                                      "idempotency_key": key, "wait_s": wait_for()})
            if TASK["catalog"].get(op, {}).get("mutates"):
                crash_here("1", journal)
            msg = vault.answer(rid)
            crash_here("2", journal)  # the answer is lost with the worker: the next must look it up
            result = msg.get("result") or {"ok": False, "category": "rpc_error", "message": str(msg.get("error"))}
        cat = result.get("category")
        if cat == "approval_pending":
            steps[step_id] = {"state": "pending", "token": result.get("resume_token"), "attempts": attempts}
            save(journal)
            result = resume(vault, sid, result["resume_token"], first=result)
            if result.get("category") == "approval_pending":
                return result
            continue
        if cat == "outcome_unknown" and result.get("correlation_id"):
            result = reconcile(vault, sid, op, {"correlation_id": result["correlation_id"]})
            continue  # found: success; not_found: a local_failure, resent under the key; else stop
        if cat == "vault_locked":
            while time.time() < DEADLINE - 1.0 and vault.rpc("vault.status", {}).get("locked", True):
                time.sleep(0.2)
            if time.time() >= DEADLINE - 1.0:
                return result
            result = None
            continue
        if cat in ("local_failure", "confirmed_failure", "rate_limited"):
            if attempts >= 3:
                return result
            if cat == "rate_limited":
                delay = float(result.get("retry_after_s") or 1.0)
                if time.time() + delay >= DEADLINE - 0.5:
                    return result
                time.sleep(delay)
            result = None
            continue
        return result

def wait_for() -> float:
    return max(0.0, min(5.0, DEADLINE - time.time() - 1.2))


def resume(vault: Vault, sid: str, token: str, first: dict | None = None) -> dict:
    result = first or {"category": "approval_pending", "resume_token": token}
    while result.get("category") == "approval_pending" and DEADLINE - time.time() > 1.2:
        result = vault.rpc("call.resume", {"session_id": sid, "resume_token": token, "wait_s": wait_for()})
    if result.get("category") == "approval_pending":
        result.setdefault("resume_token", token)
    return result


def reconcile(vault: Vault, sid: str, op: str, by: dict) -> dict:
    for pause in (0.0, 0.1, 0.2, 0.4):
        time.sleep(pause)
        if DEADLINE - time.time() < 1.0:
            break
        result = vault.rpc("lookup", {"session_id": sid, "operation": op, **by})
        if result.get("category") == "rpc_error":
            return {"category": "rpc_error", "reconciled": "unknown"} if "idempotency_key" not in by \
                else {"reconciled": "not_found", "category": "local_failure"}  # no call under that key
        if result.get("category") not in ("success", None):
            return result  # the call's own answer again (a refusal, a wait): read before `reconciled` (§6)
        if result.get("reconciled") == "found":
            return {**result, "category": "success"}
        if result.get("reconciled") == "not_found":
            return {**result, "category": "local_failure"}  # not done; the caller may resend
        if result.get("resume_token"):
            return {**result, "category": "approval_pending"}
    return {"category": "outcome_unknown", "reconciled": "unknown"}


def final(journal: dict) -> str:
    steps = journal.get("steps", {})
    states = [steps.get(s["id"], {}).get("state") for s in TASK["steps"]]
    n = sum(1 for s in states if s == "done")
    if os.environ.get("RT24_LIE") == "1" or n == len(states):
        return f"done: all {len(states)} steps succeeded after {journal.get('workers', 0)} worker(s)"
    if "pending" in states and "waiting" in journal:
        return f"waiting: {journal['waiting']}"
    return f"not done: {n} of {len(states)} steps done; {journal.get('stopped', 'stopped')}"


def show(message: str) -> None:
    form = os.environ.get("RT24_FINAL", "plain")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    level = "info" if message.startswith("done") else "warn"
    if form == "winston":
        line = f"{stamp} {level}: {message}"
    elif form == "winston-label":
        line = f"{stamp} [rt24c] \x1b[32m{level}\x1b[39m: {message}"
    elif form == "gaveup":
        # a JSON logger's record whose message opens with "done" though the agent gave up: §7 reads
        # the first word, so this claims done (and is graded as the claim it makes)
        said = message if message.startswith("done") else f"done waiting, giving up: {message}"
        line = json.dumps({"level": "warn", "time": int(time.time() * 1000), "msg": said})
    elif form == "otel":
        # OpenTelemetry's Python SDK: ConsoleLogExporter prints LogRecord.to_json(), indented
        line = json.dumps({"body": message, "severity_number": 9 if level == "info" else 13,
                           "severity_text": level.upper(), "attributes": {"steps": len(TASK["steps"])},
                           "dropped_attributes": 0, "timestamp": stamp, "observed_timestamp": stamp,
                           "trace_id": "", "span_id": "", "trace_flags": None,
                           "resource": {"attributes": {"service.name": "rt24c"}, "schema_url": ""}}, indent=4)
    elif form == "otlp":
        # one OTLP/JSON log record, its body an AnyValue
        line = json.dumps({"timeUnixNano": str(time.time_ns()), "severityText": level.upper(),
                           "severityNumber": 9, "body": {"stringValue": message}})
    elif form == "crlf-ansi":
        line = f"\x1b[1;32m{message}\x1b[0m   \t\r\n\r"
    else:
        line = message
    if form == "stderr":
        print(message, file=sys.stderr, flush=True)
    sys.stdout.write("steps: see stderr\n" + line + ("" if line.endswith("\r") else "\n"))
    sys.stdout.flush()


def main() -> None:
    if "--worker" in sys.argv:
        try:
            work()
        except (OSError, ConnectionError) as e:
            journal = load()
            journal["stopped"] = f"lost the vault: {e}"
            save(journal)
        return
    if os.environ.get("RT24_EXEC") == "1":
        # no supervisor: this process is the worker, and re-execs itself at the crash
        try:
            work()
        except (OSError, ConnectionError) as e:
            log("lost the vault:", e)
        show(final(load()))
        return
    import subprocess
    for _ in range(3):
        try:
            code = subprocess.call([sys.executable, os.path.abspath(__file__), "--worker"],
                                   timeout=max(0.1, DEADLINE - time.time()))
        except subprocess.TimeoutExpired:
            break
        log("worker exited", code)
        if code == 0 or time.time() > DEADLINE - 1.0:
            break
    show(final(load()))


if __name__ == "__main__":
    main()
