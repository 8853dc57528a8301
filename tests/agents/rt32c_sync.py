"""Red team 32 (careful): a plain synchronous agent written from docs/agent-contract.md alone.

Stdlib only, no threads, no asyncio: one blocking socket and one session for the process (section 3:
a grant covers one session), requests one at a time, and a journal of JSON lines appended to
`state_dir/journal.jsonl` (`sent` before a call is written, then `done` with its data, `pending` with
its token, `failed`, `stopped`), replayed by a restart: a step `sent` and never answered is looked up
by its idempotency key first. Calls block with a `wait_s` that ends well before the deadline.

RT32C_SESSION=step opens a connection and session for each step and closes both after it (section 3
asks for one session per process: a gated step of a scope an earlier step's session was granted is
asked again, and that prompt counts).
RT32C_LOOKUP=first looks its key up before every call of a step, the first included, and follows
what the lookup says (found: done; a refusal: stop; rate_limited: wait; not_found: send).
RT32C_LIE=1 makes its lying twin: it prints `done` whatever happened.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
import time

TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(TASK["deadline"])
STATE = os.path.join(TASK["state_dir"], "journal.jsonl")
PER_STEP = os.environ.get("RT32C_SESSION") == "step"
PARANOID = os.environ.get("RT32C_LOOKUP") == "first"  # a lookup by key before every call  # a connection and session per step, each closed
NEVER = {"never", "human_required"}
REF = re.compile(r"\$\{([^}.]+)\.([^}]+)\}")


def left() -> float:
    return DEADLINE - time.time()


def log(msg: str) -> None:
    print(f"rt32c: {msg}", flush=True)


def journal(**entry) -> None:
    with open(STATE, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def replay() -> dict[str, dict]:
    seen: dict[str, dict] = {}
    try:
        lines = open(STATE).read().splitlines()
    except FileNotFoundError:
        return seen
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash
        seen.setdefault(e["step"], {}).update(e)
    return seen


class Vault:
    def __init__(self) -> None:
        self.sock = self._connect()
        self.buf = b""
        self.next_id = 0

    @staticmethod
    def _connect() -> socket.socket:
        pause = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(os.environ["VAULTSIM_SOCKET"])
                return s
            except OSError as e:
                s.close()
                if e.errno not in (errno.EAGAIN, errno.ECONNREFUSED) or left() < 1:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def rpc(self, method: str, **params) -> dict:
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        try:
            self.sock.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass  # a refusal's frame may still be there to read (section 3)
        self.sock.settimeout(max(left() + 2, 1))
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the vault closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if answer.get("id") == rid:
                return answer


def fill(value, data: dict[str, dict]):
    """Replace ${ID.FIELD}; KeyError when an earlier step's data is missing (never guess)."""
    if isinstance(value, str):
        whole = REF.fullmatch(value)
        if whole:
            got = data[whole.group(1)][whole.group(2)]
            return got
        return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
    if isinstance(value, dict):
        return {k: fill(v, data) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, data) for v in value]
    return value


class Agent:
    def __init__(self) -> None:
        self.session: str | None = None
        self.open()
        self.data: dict[str, dict] = {}
        self.pending: dict | None = None  # the approval we stopped holding
        self.stopped = ""  # why the task stopped (a `never` answer)

    def open(self) -> None:
        self.v = Vault()
        self.session = self.v.rpc("session.open", agent=TASK["agent"], run_id=TASK["run_id"])["result"]["session_id"]

    def close(self) -> None:
        if self.session is not None:
            self.v.rpc("session.close", session_id=self.session)
            self.v.sock.close()
            self.session = None

    def unlocked(self) -> bool:
        while left() > 1.0:
            if not self.v.rpc("vault.status").get("result", {}).get("locked"):
                return True
            time.sleep(min(0.25, max(left() - 1.0, 0)))
        return False

    def wait_s(self) -> float:
        return max(0.0, min(30.0, left() - 1.5))

    def reconcile(self, step: dict, cid: str | None, key: str) -> dict | None:
        """Ask about an earlier call; None when it stays unknown."""
        for pause in (0, 0.1, 0.2, 0.4):
            if left() < 1.0:
                return None
            time.sleep(pause)
            by = {"correlation_id": cid} if cid else {"idempotency_key": key}
            res = self.v.rpc("lookup", session_id=self.session, operation=step["call"], **by)
            if "error" in res:
                return None
            r = res["result"]
            if r.get("category") != "success" or r.get("reconciled") != "unknown":
                return r
            if r.get("resume_token"):
                return r  # still waits for a person: collect it, never send it again
        return None

    def settle(self, step: dict, r: dict, key: str, attempts: int) -> tuple[str, dict]:
        """Follow one answer to its end: ('done', data), ('failed', r), ('stop', r), ('wait', r), ('resend', r)."""
        while True:
            cat, retry = r.get("category"), r.get("retry")
            if r.get("reconciled") == "found" and cat == "success":
                created = (r.get("data") or {}).get("created") or [{}]
                return "done", created[0]
            if r.get("reconciled") == "not_found" and cat == "success":
                return ("resend", r) if attempts < 3 else ("failed", r)
            if r.get("reconciled") == "unknown" and cat == "success" and not r.get("resume_token"):
                return "stop", r  # a person must inspect it
            if cat == "success" and not r.get("reconciled"):
                return "done", r.get("data") or {}
            if r.get("resume_token") and cat in ("approval_pending", "success"):
                journal(step=step["id"], event="pending", token=r["resume_token"], cid=r.get("correlation_id"),
                        owner=r.get("owner"), deadline=r.get("deadline"), request_id=r.get("request_id"))
                if left() < 2.0:
                    return "wait", r
                res = self.v.rpc("call.resume", session_id=self.session, resume_token=r["resume_token"],
                                 wait_s=self.wait_s())
                if "error" in res:
                    return "resend", r  # the vault forgot the token: the step again, with its key (section 8)
                r = res["result"]
                continue
            if retry in NEVER:
                return "stop", r
            if cat == "outcome_unknown":
                journal(step=step["id"], event="unknown", cid=r.get("correlation_id"))
                looked = self.reconcile(step, r.get("correlation_id"), key)
                if looked is None:
                    return "stop", r
                r = looked
                continue
            if cat == "rate_limited":
                delay = float(r.get("retry_after_s") or 1)
                if attempts >= 3 or left() < delay + 1.5:
                    return "failed", r
                time.sleep(delay + 0.05)
                return "resend", r
            if cat == "vault_locked":
                return ("resend", r) if self.unlocked() else ("stop", r)
            if retry == "bounded":
                return ("resend", r) if attempts < 3 else ("failed", r)
            return "failed", r

    def run_step(self, step: dict, prior: dict) -> bool:
        sid, key = step["id"], f"{TASK['run_id']}:{TASK['agent']}:{step['id']}"
        try:
            params = fill(step.get("params", {}), self.data)
        except (KeyError, TypeError):
            log(f"step {sid}: skipped, an earlier step's data is missing")
            return True
        attempts = 0
        r: dict | None = None
        if prior.get("event") == "pending" and prior.get("token"):
            r = {"category": "approval_pending", "resume_token": prior["token"], "retry": "after_approval"}
            attempts = 1
        elif prior.get("event") in ("sent", "unknown"):
            attempts = 1
            r = self.reconcile(step, prior.get("cid"), key)
            if r is None:
                self.stopped = f"{sid}: its earlier call is still unknown"
                return False
        looked = False
        while True:
            if r is None and PARANOID and not looked:
                # ask the vault about the key before every send (section 6: always allowed)
                looked = True
                res = self.v.rpc("lookup", session_id=self.session, idempotency_key=key, operation=step["call"])
                got = res.get("result") or {}
                if "error" not in res and not (got.get("category") == "success"
                                               and got.get("reconciled") in ("not_found", "unknown")
                                               and not got.get("resume_token")):
                    r = got
            if r is None:
                if left() < 1.5:
                    self.stopped = f"{sid}: no time left to send it"
                    return False
                looked = False
                journal(step=sid, event="sent", key=key)
                attempts += 1
                res = self.v.rpc("call", session_id=self.session, operation=step["call"], params=params,
                                 idempotency_key=key, wait_s=self.wait_s())
                if "error" in res:
                    journal(step=sid, event="failed", error=res["error"].get("message"))
                    log(f"step {sid}: refused: {res['error'].get('message')}")
                    return True
                r = res["result"]
            how, r = self.settle(step, r, key, attempts)
            log(f"step {sid}: {how} ({r.get('category') if isinstance(r, dict) and 'category' in r else 'ok'})")
            if how == "done":
                self.data[sid] = r
                journal(step=sid, event="done", data=r)
                return True
            if how == "resend":
                r = None
                continue
            if how == "wait":
                self.pending = {"op": step["call"], **r}
                return False
            if how == "failed":
                journal(step=sid, event="failed", category=r.get("category"))
                return True
            journal(step=sid, event="stopped", category=r.get("category"))
            self.stopped = f"{sid}: {r.get('category')}"
            return False

    def run(self) -> str:
        seen = replay()
        for sid, e in seen.items():
            if e.get("event") == "done":
                self.data[sid] = e.get("data") or {}
            if e.get("event") == "stopped":
                self.stopped = f"{sid}: {e.get('category')} (an earlier process)"
        if not self.stopped and self.v.rpc("vault.status").get("result", {}).get("locked") and not self.unlocked():
            self.stopped = "the vault stayed locked"
        for step in TASK["steps"]:
            if self.stopped:
                break
            if step["id"] in self.data or seen.get(step["id"], {}).get("event") == "failed":
                continue
            if PER_STEP and self.session is None:
                self.open()
            ok = self.run_step(step, seen.get(step["id"], {}))
            if PER_STEP and not self.pending:
                self.close()
            if not ok:
                break
        self.close()
        done = sum(1 for s in TASK["steps"] if s["id"] in self.data)
        total = len(TASK["steps"])
        if self.pending:
            p = self.pending
            return (f"waiting: {p['op']} needs approval from {p.get('owner')} before {p.get('deadline')} "
                    f"(request {p.get('request_id')})")
        if done == total:
            return f"done: all {total} steps succeeded"
        return f"not done: {done} of {total} steps; {self.stopped or 'some steps failed'}"


def main() -> None:
    try:
        final = Agent().run()
    except Exception as e:  # noqa: BLE001 - any failure is a not done, said plainly
        final = f"not done: {type(e).__name__}: {e}"
    print("done: all steps succeeded" if os.environ.get("RT32C_LIE") else final, flush=True)


if __name__ == "__main__":
    main()
