"""Red team, seventh pass: a careful agent from docs/agent-contract.md alone (raw Unix socket,
JSON lines, the task file; no project import), the base every tests/agents/rt7_*.py attack
overrides one hook of, so the verdict it gets can only come from that attack.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from typing import Any

Result = dict[str, Any]
Step = dict[str, Any]


class Conn:
    """One connection to the vault: requests by id, answers matched by id."""

    def __init__(self, path: str | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path or os.environ["VAULTSIM_SOCKET"])
        self.file = self.sock.makefile("rb")
        self.next_id = 0

    def request(self, method: str, **params: Any) -> Any:
        self.next_id += 1
        rid = self.next_id
        line = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        self.sock.sendall(json.dumps(line).encode() + b"\n")
        while True:
            raw = self.file.readline()
            if not raw:
                raise ConnectionError("the vault closed the connection")
            msg = json.loads(raw)
            if msg.get("id") != rid:
                continue
            if "error" in msg:
                return {"error": msg["error"]}
            return msg["result"]

    def close(self) -> None:
        self.sock.close()


def log(*args: Any) -> None:
    print("log:", *args, file=sys.stderr, flush=True)


class Agent:
    """A careful agent. Hooks (override one): after(step, result) decides what follows an
    answer; final() is the last line; key(step) the idempotency key."""

    def __init__(self) -> None:
        self.task: dict[str, Any] = json.load(open(os.environ["VAULTSIM_TASK"]))
        self.conn = Conn()
        self.session = self.open(self.conn)
        self.data: dict[str, Any] = {}
        self.done_steps: list[str] = []
        self.stopped: str | None = None
        self.pending: list[str] = []

    # -- the wire -------------------------------------------------------------------------------
    def open(self, conn: Conn) -> str:
        r = conn.request("session.open", agent=self.task["agent"], run_id=self.task["run_id"])
        return str(r["session_id"])

    def left(self) -> float:
        return float(self.task["deadline"]) - time.time()

    def key(self, step: Step) -> str:
        return f"{self.task['run_id']}:{self.task['agent']}:{step['id']}"

    def params(self, step: Step) -> dict[str, Any]:
        def sub(v: Any) -> Any:
            if isinstance(v, str):
                return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(self.data[m.group(1)][m.group(2)]), v)
            return v
        return {k: sub(v) for k, v in step.get("params", {}).items()}

    def call(self, step: Step, *, key: str | None = None, params: dict[str, Any] | None = None,
             session: str | None = None, conn: Conn | None = None) -> Result:
        wait = max(0.0, min(self.left() - 0.8, 30.0))
        r: Result = (conn or self.conn).request(
            "call", session_id=session or self.session, operation=step["call"],
            params=self.params(step) if params is None else params,
            idempotency_key=key or self.key(step), wait_s=wait)
        log(step["call"], r.get("category", r))
        while r.get("category") == "approval_pending" and self.left() > 1.0:
            r = self.conn.request("call.resume", session_id=self.session, resume_token=r["resume_token"],
                                  wait_s=max(0.0, min(self.left() - 0.8, 30.0)))
            log("resume", r.get("category", r))
        return r

    def lookup(self, result: Result) -> Result:
        r: Result = self.conn.request("lookup", session_id=self.session, correlation_id=result["correlation_id"],
                                      operation=result["operation"])
        log("lookup", r.get("reconciled", r))
        return r

    # -- the careful loop ----------------------------------------------------------------------
    def run(self) -> int:
        for step in self.task["steps"]:
            if self.left() < 1.0:
                self.stopped = "out of time"
                break
            r = self.call(step)
            outcome = self.after(step, r, 1)
            if outcome is None:
                break
            self.data[step["id"]] = outcome
            self.done_steps.append(step["id"])
        print(self.final(), flush=True)
        self.conn.close()
        return 0

    def after(self, step: Step, r: Result, attempt: int) -> dict[str, Any] | None:
        """The step's data when it is done, None when the task stops here."""
        if "error" in r:
            self.stopped = f"{step['call']}: error {r['error'].get('message')}"
            return None
        cat = r["category"]
        if cat == "success":
            return dict(r.get("data") or {})
        if cat == "approval_pending":
            self.pending.append(r["resume_token"])
            self.stopped = f"waiting: {step['call']} needs approval from {r.get('owner')}"
            return None
        if cat == "outcome_unknown":
            return self.reconcile(step, r, attempt)
        if cat in ("local_failure", "confirmed_failure") and attempt < 3 and self.left() > 2:
            return self.after(step, self.call(step), attempt + 1)
        if cat == "rate_limited" and attempt < 3 and self.left() > float(r.get("retry_after_s") or 1) + 1.5:
            time.sleep(float(r.get("retry_after_s") or 1))
            return self.after(step, self.call(step), attempt + 1)
        self.stopped = f"{step['call']}: {cat}"
        return None

    def reconcile(self, step: Step, r: Result, attempt: int) -> dict[str, Any] | None:
        for pause in (0.1, 0.2, 0.4, 0.8):
            lk = self.lookup(r)
            if lk.get("reconciled") == "found":
                created = (lk.get("data") or {}).get("created") or [{}]
                return dict(created[0])
            if lk.get("reconciled") == "not_found":
                if attempt < 3 and self.left() > 2:
                    return self.after(step, self.call(step), attempt + 1)
                break
            if self.left() < 2:
                break
            time.sleep(pause)
        self.stopped = f"{step['call']}: outcome unknown"
        return None

    def final(self) -> str:
        if self.pending and self.stopped and self.stopped.startswith("waiting"):
            with open(os.path.join(self.task["state_dir"], "pending.json"), "w") as f:
                json.dump(self.pending, f)
            return self.stopped
        if self.stopped:
            return f"not done: {self.stopped}"
        return f"done: {len(self.done_steps)} steps"


def main(cls: type[Agent] = Agent) -> None:
    sys.exit(cls().run())


if __name__ == "__main__":
    main()
