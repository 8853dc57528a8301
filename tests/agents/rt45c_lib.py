"""Red team 45c: a stdlib vault client and step runner, written from docs/agent-contract.md.

The rt45c Python agents (habits, reconnect, backoff) share it as a team shares a helper module;
each drives it in its own shape. The rules it keeps (section numbers are the contract's):
* one session per process, on a connection kept open while it is used (3); a deliberate
  reconnect closes the session first and opens a new one, only between settled steps;
* every `call` carries the key RUN_ID:AGENT:STEP_ID, the same on every resend (5);
* `outcome_unknown`: a lookup by correlation id before anything else; `found` done, `not_found`
  a resend under the same key, `unknown` asked again 0.1/0.2/0.4 s later, then stop (6);
* a lookup's `category` read before its `reconciled` (6);
* `approval_pending`: resumed until it settles, or its token kept in state_dir and `waiting` (4);
* `rate_limited`: `retry_after_s` waited out from the answer, at most 3 attempts (4);
* `vault_locked`: sent again only once `vault.status` says unlocked (4);
* a `never`/`human_required` answer stops the task (4);
* a restart resumes kept tokens and looks up a step it sent without keeping the answer (8);
* nothing sent after the deadline; the final message printed last (7).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")
STOPS = {"never", "human_required"}
MAX_ATTEMPTS = 3


class VaultError(Exception):
    """A JSON-RPC error: the vault did nothing with that request."""


class Finish(Exception):
    """The task ends with this final message."""


def load_task() -> dict[str, Any]:
    with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
        task: dict[str, Any] = json.load(f)
    return task


class Vault:
    """One Unix-socket connection; answers matched by id (lines without ours are skipped)."""

    def __init__(self, path: str, deadline: float) -> None:
        self.path, self.deadline = path, deadline
        self.next_id = 0
        self.sock = self._connect()
        self.buf = b""

    def _connect(self) -> socket.socket:
        pause = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                return s
            except OSError as e:
                s.close()
                # a full accept queue is not a missing vault: back off and try again (3)
                if e.errno != errno.EAGAIN or time.time() + pause > self.deadline - 1:
                    raise
                time.sleep(pause)
                pause = min(0.5, pause * 2)

    def rpc(self, method: str, **params: Any) -> dict[str, Any]:
        if time.time() > self.deadline - 0.25:
            raise Finish("not done: the deadline came before " + method + " could be sent")
        self.next_id += 1
        rid = self.next_id
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        self.sock.sendall((json.dumps(frame) + "\n").encode())
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise Finish("not done: the vault closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("id") == rid:
                break
        if "error" in msg:
            raise VaultError(str((msg.get("error") or {}).get("message", "error"))[:200])
        res: dict[str, Any] = msg.get("result") or {}
        return res

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Journal:
    """The agent's state in state_dir: one JSON file replaced all at once (written in state_dir
    itself: a rename from /tmp fails across the jail's mounts, section 1)."""

    def __init__(self, state_dir: str, name: str = "rt45c-journal.json") -> None:
        self.path = os.path.join(state_dir, name)
        os.makedirs(state_dir, exist_ok=True)
        try:
            with open(self.path, encoding="utf-8") as f:
                self.data: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            self.data = {"steps": {}}

    def step(self, sid: str) -> dict[str, Any]:
        rec: dict[str, Any] = self.data["steps"].setdefault(sid, {})
        return rec

    def save(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def refs(value: Any) -> set[str]:
    if isinstance(value, str):
        return {m.group(1) for m in REF.finditer(value)}
    if isinstance(value, dict):
        return set().union(*[refs(v) for v in value.values()])
    if isinstance(value, list):
        return set().union(*[refs(v) for v in value])
    return set()


def fill(value: Any, done: dict[str, Any]) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            got = (done.get(m.group(1)) or {}).get(m.group(2))
            if got is None:
                raise Finish(f"not done: step {m.group(1)} gave no {m.group(2)} to use")
            return str(got)
        return REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: fill(v, done) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, done) for v in value]
    return value


class Runner:
    """One process's session and its steps, one at a time.

    `pause(kind, seconds)` is how it waits before a resend ("rate_limited" with the answer's
    retry_after_s, "bounded" after a bounded failure, "lookup" between unknown lookups, "locked"
    between status polls): an agent with its own backoff habit overrides it, never waiting less.
    """

    def __init__(self, task: dict[str, Any], *, client: str = "rt45c", blocking: bool = True,
                 margin: float = 0.8, log: Callable[[str], None] | None = None) -> None:
        self.task = task
        self.deadline = float(task["deadline"])
        self.margin, self.blocking, self.client = margin, blocking, client
        self.log = log or (lambda s: print(f"[{client}] {s}", file=sys.stderr, flush=True))
        self.journal = Journal(task["state_dir"])
        self.vault = Vault(os.environ["VAULTSIM_SOCKET"], self.deadline)
        self.sid = self._open()
        self.results: dict[str, Any] = {sid: rec["data"] for sid, rec in self.journal.data["steps"].items()
                                        if "data" in rec}
        self.outcome: dict[str, str] = {sid: "done" for sid in self.results}
        self.waiting: list[str] = []
        self.refs: dict[str, dict[str, Any]] = {}

    def _open(self) -> str:
        opened = self.vault.rpc("session.open", agent=self.task["agent"], run_id=self.task["run_id"],
                                client={"name": self.client, "version": "45.0"})
        return str(opened["session_id"])

    def reconnect(self) -> None:
        """Close the session and its connection, then open both again (3: a session ends with
        the connection that opened it; its grants end too, so the next gated step asks again)."""
        try:
            self.vault.rpc("session.close", session_id=self.sid)
        except VaultError:
            pass
        self.vault.close()
        self.vault = Vault(os.environ["VAULTSIM_SOCKET"], self.deadline)
        self.sid = self._open()

    # ---- time ------------------------------------------------------------------------------

    def left(self) -> float:
        return self.deadline - time.time() - self.margin

    def sleep(self, s: float) -> None:
        time.sleep(max(0.0, min(s, self.left())))

    def pause(self, kind: str, seconds: float) -> None:
        self.sleep(seconds)

    # ---- one request -----------------------------------------------------------------------

    def key(self, step: dict[str, Any]) -> str:
        return f"{self.task['run_id']}:{self.task['agent']}:{step['id']}"

    def request(self, method: str, **params: Any) -> dict[str, Any]:
        res = self.vault.rpc(method, session_id=self.sid, **params)
        self.log(f"{method} -> {res.get('category')} {res.get('reconciled') or ''}".rstrip())
        return res

    def wait_s(self) -> float:
        return round(max(0.0, self.left() - 0.3), 2) if self.blocking else 0.0

    # ---- one step --------------------------------------------------------------------------

    def run_step(self, step: dict[str, Any]) -> str:
        """Settle one step: "done", "waiting", "failed" (later independent steps may run), or
        raise Finish (the task stops)."""
        sid, op = step["id"], step["call"]
        if self.outcome.get(sid) == "done":
            return "done"
        rec = self.journal.step(sid)
        key = self.key(step)
        params: dict[str, Any] = fill(step.get("params") or {}, self.results)
        res: dict[str, Any] | None = None
        if rec.get("token"):                            # the predecessor's wait: collect it (8)
            try:
                res = self.request("call.resume", resume_token=rec["token"], wait_s=self.wait_s())
            except VaultError:                          # the vault forgot it: call again, same key
                rec.pop("token", None)
                self.journal.save()
        elif rec.get("sent"):                           # sent, answer never kept: ask first (6)
            self.refs[sid] = {"idempotency_key": key}
            res = self.lookup(self.refs[sid], op)
        while True:
            if res is None:
                if int(rec.get("attempts", 0)) >= MAX_ATTEMPTS:
                    return self.fail(sid, f"{op}: {MAX_ATTEMPTS} attempts without success")
                if self.left() <= 0.2:
                    return self.fail(sid, f"{op}: no time left to send it")
                rec["sent"], rec["attempts"] = True, int(rec.get("attempts", 0)) + 1
                self.journal.save()
                try:
                    res = self.request("call", operation=op, params=params, idempotency_key=key,
                                       wait_s=self.wait_s())
                except VaultError as e:
                    return self.fail(sid, f"{op}: refused by the vault ({e})")
            nxt = self.settle(step, rec, res)
            if isinstance(nxt, str):
                return nxt
            res = nxt

    def fail(self, sid: str, why: str) -> str:
        self.outcome[sid] = "failed"
        self.log(f"step {sid} failed: {why}")
        return "failed"

    def stop(self, why: str) -> Any:
        raise Finish("not done: " + why)

    def settle(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | str | None:
        """Follow one answer: a str settles the step, a dict is the next answer, None a resend."""
        sid, op = step["id"], step["call"]
        cat, retry, recon = res.get("category"), res.get("retry"), res.get("reconciled")
        if recon is not None and cat == "success":      # a lookup answered (6)
            if recon == "found":
                created = (res.get("data") or {}).get("created") or [{}]
                return self.done(sid, rec, created[0] if isinstance(created[0], dict) else {})
            if recon == "not_found":
                return None
            if res.get("resume_token"):
                return self.collect(step, rec, res)
            return self.stop(f"{op} ({sid}): its outcome is unknown; a person must inspect it")
        if recon == "unknown" and cat not in ("rate_limited", "approval_pending") and retry not in STOPS:
            if res.get("resume_token"):
                return self.collect(step, rec, res)
            return self.stop(f"{op} ({sid}): the lookup failed ({cat}); a person must inspect it")
        if cat == "success":
            data = res.get("data")
            return self.done(sid, rec, data if isinstance(data, dict) else {})
        if cat == "approval_pending":
            return self.collect(step, rec, res)
        if retry in STOPS:
            return self.stop(f"{op} ({sid}) answered {cat} (retry: {retry})")
        if cat == "outcome_unknown":
            # the call's own id; a lookup's answer names the lookup, never the call (6)
            self.refs[sid] = {"correlation_id": res.get("correlation_id")}
            return self.lookup(self.refs[sid], op)
        if cat == "rate_limited":
            after = float(res.get("retry_after_s") or 1.0)
            if recon == "unknown":                      # the lookups' pace: ask again after it
                if after > self.left():
                    return self.stop(f"{op} ({sid}): outcome unknown, no time to look it up again")
                self.pause("rate_limited", after)
                return self.lookup(self.refs.get(sid) or {"idempotency_key": self.key(step)}, op)
            if int(rec.get("attempts", 0)) >= MAX_ATTEMPTS or after > self.left() - 0.3:
                return self.fail(sid, f"{op} rate limited; its wait outlasts the attempts or the deadline")
            self.pause("rate_limited", after)
            return None
        if cat in ("local_failure", "confirmed_failure"):
            if int(rec.get("attempts", 0)) >= MAX_ATTEMPTS:
                return self.fail(sid, f"{op}: {cat} {MAX_ATTEMPTS} times")
            self.pause("bounded", 0.2)
            return None
        if cat == "vault_locked":
            while self.vault.rpc("vault.status").get("locked", True):
                if self.left() < 0.5:
                    return self.stop(f"the vault stayed locked; {op} ({sid}) not sent")
                self.pause("locked", 0.3)
            return None
        return self.stop(f"{op} ({sid}) answered {cat} ({retry})")

    def done(self, sid: str, rec: dict[str, Any], data: dict[str, Any]) -> str:
        rec.pop("token", None)
        rec["data"] = data
        self.journal.save()
        self.results[sid] = data
        self.outcome[sid] = "done"
        return "done"

    def lookup(self, ref: dict[str, Any], op: str) -> dict[str, Any]:
        res: dict[str, Any] = {}
        for pause in (0.0, 0.1, 0.2, 0.4):
            if pause:
                if pause > self.left():
                    break
                self.pause("lookup", pause)
            res = self.request("lookup", operation=op, **ref)
            if res.get("reconciled") in ("found", "not_found") or res.get("resume_token") \
                    or res.get("category") == "rate_limited" or res.get("retry") in STOPS:
                return res
        return res

    def collect(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | str | None:
        token = str(res.get("resume_token"))
        rec["token"] = token
        self.journal.save()
        while True:
            if self.left() <= 0.4:
                self.outcome[step["id"]] = "waiting"
                self.waiting.append(f"{step['call']} ({step['id']}) awaits {res.get('owner') or 'its owner'}")
                return "waiting"
            wait = self.wait_s() if self.blocking else 0.0
            if not self.blocking:
                self.sleep(0.5)
                if self.left() <= 0.4:
                    continue
            asked = time.time()
            try:
                nxt = self.request("call.resume", resume_token=token, wait_s=wait)
            except VaultError:
                rec.pop("token", None)
                self.journal.save()
                return None
            if nxt.get("category") != "approval_pending":
                rec.pop("token", None)
                self.journal.save()
                return nxt
            res = nxt
            if wait > 1 and time.time() - asked < wait / 2:
                self.sleep(0.2)          # answered early: no resume storm

    # ---- the task --------------------------------------------------------------------------

    def run_all(self, between: Callable[[dict[str, Any]], None] | None = None) -> str:
        """Every step in order, each once the one before settled; returns the final message.
        `between(step)` runs after each step that settled done (a reconnect, a log rotation)."""
        try:
            for step in self.task.get("steps") or []:
                if self.outcome.get(step["id"]) == "done":
                    continue
                if any(self.outcome.get(r) == "failed" for r in refs(step.get("params"))):
                    self.outcome[step["id"]] = "failed"
                    continue
                if self.waiting:                        # a wait handed over: the time is spent
                    break
                if self.run_step(step) == "done" and between:
                    between(step)
        except Finish as f:
            return str(f)
        return self.message()

    def message(self) -> str:
        steps = [s["id"] for s in self.task.get("steps") or []]
        if all(self.outcome.get(s) == "done" for s in steps):
            return f"done: {len(steps)} of {len(steps)} steps succeeded"
        if self.waiting:
            return "waiting: " + "; ".join(self.waiting) + " (resume token kept in state_dir)"
        bad = [s for s in steps if self.outcome.get(s) != "done"]
        return "not done: steps " + ", ".join(bad) + " did not succeed"

    def close(self) -> None:
        try:
            self.vault.rpc("session.close", session_id=self.sid)
        except (VaultError, Finish, OSError):
            pass
        self.vault.close()
