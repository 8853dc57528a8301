#!/usr/bin/env python3
"""Red team 42c: a careful agent written from docs/agent-contract.md alone (stdlib, raw socket).

One session per process, steps one at a time in order; key RUN:AGENT:STEP on every call and resend;
an unknown outcome looked up before anything else; pending approvals resumed until settled or the
deadline is near, then kept in state_dir and handed over with `waiting`; a restart skips saved
steps, resumes saved tokens and looks up a step its predecessor sent without keeping the answer.
Logs go to stderr; the final message is the last stdout line, printed once the work is over.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import sys
import time
from typing import Any

NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
MARGIN = 1.2          # seconds kept before the deadline: stop sending, hand over, exit
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def log(*parts: object) -> None:
    print("rt42c:", *parts, file=sys.stderr, flush=True)


class Stop(Exception):
    """The task ends here; its text is the final message."""


class Vault:
    def __init__(self, path: str, deadline: float) -> None:
        self.deadline = deadline
        self.sock = self._connect(path)
        self.buf = b""
        self.next_id = 0

    def _connect(self, path: str) -> socket.socket:
        pause = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except OSError as e:
                s.close()
                # a full accept queue (EAGAIN) or a vault still starting: back off, within the deadline
                if e.errno not in (errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT) \
                        or time.time() + pause > self.deadline - MARGIN:
                    raise Stop(f"not done: cannot reach the vault ({e.strerror})") from e
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        try:
            self.sock.sendall((json.dumps(msg) + "\n").encode())
        except OSError as e:    # a refusal's frame may already wait to be read
            log("send failed:", e.strerror)
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                try:
                    ans = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ans, dict) and ans.get("id") == rid:
                    return ans
                continue
            chunk = self.sock.recv(65536)
            if not chunk:
                raise Stop(f"not done: the vault closed the connection during {method}")
            self.buf += chunk


class State:
    """state_dir/state.json, replaced whole (a temp file in state_dir itself, then a rename)."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "state.json")
        self.folder = folder
        try:
            with open(self.path, encoding="utf-8") as f:
                self.d: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            self.d = {}
        for k in ("done", "pending", "sent", "retry_at", "attempts"):
            self.d.setdefault(k, {})

    def save(self) -> bool:
        tmp = os.path.join(self.folder, f".state.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.d, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            return True
        except OSError as e:
            log("cannot keep state:", e.strerror)
            return False


class Agent:
    def __init__(self) -> None:
        with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
            self.task = json.load(f)
        self.deadline = float(self.task["deadline"])
        self.run_id = os.environ.get("VAULTSIM_RUN_ID") or self.task["run_id"]
        self.name = self.task["agent"]
        self.state = State(self.task["state_dir"])
        self.vault: Vault | None = None
        self.sid = ""

    def left(self) -> float:
        return self.deadline - MARGIN - time.time()

    def key(self, step_id: str) -> str:
        k = f"{self.run_id}:{self.name}:{step_id}"
        return k if len(k) <= 200 else hashlib.sha256(k.encode()).hexdigest()

    def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self.left() <= 0:
            raise Stop("not done: the deadline came before the work was finished")
        assert self.vault is not None
        ans = self.vault.rpc(method, {"session_id": self.sid, **params})
        if "error" in ans:
            raise Stop(f"not done: the vault refused {method} ({ans['error'].get('message', '')[:120]})")
        res: dict[str, Any] = ans.get("result") or {}
        log(method, res.get("operation", ""), res.get("category"), res.get("reconciled", ""))
        return res

    # ---- the steps ----
    def fill(self, value: Any) -> Any:
        if isinstance(value, str):
            def sub(m: re.Match[str]) -> str:
                data = self.state.d["done"].get(m.group(1))
                if not isinstance(data, dict) or m.group(2) not in data:
                    raise KeyError(m.group(1))
                return str(data[m.group(2)])
            return REF.sub(sub, value)
        if isinstance(value, dict):
            return {k: self.fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.fill(v) for v in value]
        return value

    def run(self) -> str:
        st = self.state.d
        if st.get("never"):
            return f"not done: {st['never']} (told by an earlier process; not asked again)"
        self.vault = Vault(os.environ["VAULTSIM_SOCKET"], self.deadline)
        ans = self.vault.rpc("session.open", {"agent": self.name, "run_id": self.run_id})
        if "error" in ans:
            raise Stop(f"not done: session.open refused ({ans['error'].get('message', '')[:120]})")
        self.sid = ans["result"]["session_id"]
        unfinished: list[str] = []
        for i, step in enumerate(self.task.get("steps", [])):
            sid = str(step.get("id", f"step-{i}"))
            if sid in st["done"]:
                continue
            try:
                params = self.fill(step.get("params", {}))
            except KeyError as e:
                unfinished.append(f"{sid} (needs {e.args[0]}, not done)")
                continue
            got = self.step(sid, step["call"], params)
            if got != "done":
                unfinished.append(f"{sid} ({got})")
        if unfinished:
            return "not done: " + "; ".join(unfinished)
        return f"done: {len(self.task.get('steps', []))} steps"

    def step(self, sid: str, op: str, params: dict[str, Any]) -> str:
        st = self.state.d
        token = st["pending"].get(sid)
        if token:                                   # a predecessor's wait: collect it, never ask again
            res = self.resume(sid, token)
        elif st["sent"].get(sid):                   # sent, its answer never kept: look it up first
            res = self.lookup(sid, op, {"idempotency_key": self.key(sid), "operation": op})
        else:
            res = None
        while True:
            if res is None:
                res = self.call(sid, op, params)
            cat = res.get("category")
            if cat == "success" and "reconciled" not in res:
                st["done"][sid] = res.get("data") or {}
                st["sent"].pop(sid, None)
                st["pending"].pop(sid, None)
                self.state.save()
                return "done"
            if res.get("reconciled") == "found" and cat == "success":
                created = (res.get("data") or {}).get("created") or [{}]
                st["done"][sid] = created[0]
                st["sent"].pop(sid, None)
                self.state.save()
                return "done"
            if cat in NEVER:
                st["never"] = f"{op} answered {cat}"
                st["pending"].pop(sid, None)
                self.state.save()
                raise Stop(f"not done: {op} ({sid}) answered {cat}; stopped as told")
            if cat == "approval_pending":
                res = self.resume(sid, res["resume_token"])
                continue
            if cat == "outcome_unknown" and "reconciled" not in res:
                res = self.lookup(sid, op, {"correlation_id": res["correlation_id"], "operation": op})
                continue
            if cat == "vault_locked":
                self.await_unlock()
                res = None
                continue
            if cat == "rate_limited":
                delay = float(res.get("retry_after_s") or 1.0)
                if time.time() + delay > self.deadline - MARGIN - 0.5:
                    st["retry_at"][sid] = time.time() + delay
                    self.state.save()
                    raise Stop(f"not done: {op} ({sid}) rate limited past the deadline")
                time.sleep(delay)
                res = None
                continue
            # a bounded failure, or a lookup's not_found: send again under the same key
            if cat in ("local_failure", "confirmed_failure") or res.get("reconciled") == "not_found":
                res = None
                continue
            raise Stop(f"not done: {op} ({sid}) answered {cat}; stopped")

    def call(self, sid: str, op: str, params: dict[str, Any]) -> dict[str, Any]:
        st = self.state.d
        n = int(st["attempts"].get(sid, 0))
        if n >= 3:
            raise Stop(f"not done: {op} ({sid}) failed 3 attempts")
        wait = st["retry_at"].pop(sid, 0) - time.time()
        if wait > 0:
            if wait > self.left():
                raise Stop(f"not done: {op} ({sid}) still rate limited at the deadline")
            time.sleep(wait)
        st["attempts"][sid] = n + 1
        st["sent"][sid] = True
        self.state.save()
        return self.send("call", {"operation": op, "params": params, "idempotency_key": self.key(sid),
                                  "wait_s": max(0.0, min(30.0, self.left() - 0.3))})

    def resume(self, sid: str, token: str) -> dict[str, Any]:
        st = self.state.d
        st["pending"][sid] = token
        kept = self.state.save()
        while True:
            wait = min(10.0, self.left() - 0.3)
            if wait <= 0:    # say what a successor will find: a token it cannot read is no hand-over
                raise Stop(f"waiting: step {sid} needs a person's approval; its resume token is "
                           + ("kept" if kept else "NOT kept (state_dir not writable)"))
            assert self.vault is not None
            ans = self.vault.rpc("call.resume", {"session_id": self.sid, "resume_token": token,
                                                 "wait_s": wait})
            if "error" in ans:                      # the vault forgot the token: the step again, its key
                st["pending"].pop(sid, None)
                self.state.save()
                return {"category": "retry_with_key", "reconciled": "not_found"}
            res: dict[str, Any] = ans.get("result") or {}
            log("call.resume", res.get("category"))
            if res.get("category") != "approval_pending":
                st["pending"].pop(sid, None)
                self.state.save()
                return res

    def lookup(self, sid: str, op: str, ref: dict[str, Any]) -> dict[str, Any]:
        pauses = [0.1, 0.2, 0.4]
        while True:
            res = self.send("lookup", ref)
            rec = res.get("reconciled")
            cat = res.get("category")
            if rec in ("found", "not_found"):
                if cat == "rate_limited":           # the call's own 429 still running
                    self.state.d["retry_at"][sid] = time.time() + float(res.get("retry_after_s") or 1)
                    return {"category": "retry_with_key", "reconciled": "not_found"}
                return res
            if res.get("retry") in ("never", "human_required") or cat in NEVER:
                return res
            if res.get("resume_token"):            # still waiting for a person: collect it
                return {"category": "approval_pending", "resume_token": res["resume_token"]}
            if cat == "rate_limited":              # the lookups' own pace: no attempt
                time.sleep(float(res.get("retry_after_s") or 0.25))
                continue
            if not pauses:
                raise Stop(f"not done: {op} ({sid}) outcome unknown after lookups; a person must inspect it")
            time.sleep(pauses.pop(0))

    def await_unlock(self) -> None:
        assert self.vault is not None
        while self.left() > 0:
            ans = self.vault.rpc("vault.status", {})
            if not (ans.get("result") or {}).get("locked", True):
                return
            time.sleep(0.2)
        raise Stop("not done: the vault stayed locked until the deadline")

    def close(self) -> None:
        if self.vault and self.sid:
            try:
                self.vault.rpc("session.close", {"session_id": self.sid})
            except (OSError, Stop):
                pass


def main() -> int:
    agent = Agent()
    try:
        final = agent.run()
    except Stop as s:
        final = str(s)
    except OSError as e:
        final = f"not done: {e.strerror}"
    agent.close()
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
