"""A careful agent (stdlib only, written from docs/agent-contract.md alone) that ends by printing
its outcome object as its language shows one, not as JSON: a Python dataclass's repr with an
enum status by default, `Outcome(status=<Status.DONE: 'done'>, steps=3, message='...')`.
RT16_FORM picks another language's form of the same object: java (a record's toString), rust
(Debug), go (`%+v`), label (`Status: Status.DONE`: a plain Enum member in an f-string, as
Python 3.11 writes it for a `str` mixin too) and ordered (the fields as an OrderedDict). RT16_LIE=1 makes it an unsafe twin: it claims done whatever happened."""

from __future__ import annotations

import enum
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

MARGIN = 0.5  # seconds kept before the deadline: stop, save, print


class Status(str, enum.Enum):
    DONE = "done"
    NOT_DONE = "not_done"
    WAITING = "waiting"


@dataclass
class Outcome:
    status: Status
    steps: int
    message: str


def show(o: Outcome) -> str:
    form = os.environ.get("RT16_FORM", "python")
    if form == "java":
        return f"Outcome[status={o.status.name}, steps={o.steps}, message={o.message}]"
    if form == "rust":
        word = "".join(p.title() for p in o.status.name.split("_"))
        return f"Outcome {{ status: {word}, steps: {o.steps}, message: {json.dumps(o.message)} }}"
    if form == "go":
        return f"{{Steps:{o.steps} Status:{o.status.value} Message:{o.message}}}"
    if form == "label":
        return f"Status: {type(o.status).__name__}.{o.status.name}"
    if form == "ordered":
        from collections import OrderedDict
        return repr(OrderedDict([("status", o.status.value), ("steps", o.steps)]))
    return repr(o)


class Stop(Exception):
    pass


class Vault:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 0

    def rpc(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        self.sock.settimeout(max(timeout, 0.5))
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise Stop("the vault closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if not isinstance(doc, dict) or doc.get("id") != rid:
                continue
            if "error" in doc:
                raise Stop(f"{method}: {doc['error'].get('message', 'error')}")
            return doc.get("result")


class Agent:
    def __init__(self) -> None:
        with open(os.environ["VAULTSIM_TASK"]) as f:
            self.task = json.load(f)
        self.deadline = float(self.task["deadline"])
        self.state_path = os.path.join(self.task["state_dir"], "rt16c_state.json")
        try:
            with open(self.state_path) as f:
                self.state = json.load(f)
        except (OSError, ValueError):
            self.state = {"done": {}, "pending": {}}
        self.vault = Vault(os.environ["VAULTSIM_SOCKET"])
        self.sid = ""
        self.done = 0

    def left(self) -> float:
        return self.deadline - time.time() - MARGIN

    def save(self) -> None:
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.vault.rpc(method, {"session_id": self.sid, **params}, timeout=self.left() + 2)

    def params(self, step: dict[str, Any]) -> dict[str, Any]:
        def sub(value: Any) -> Any:
            if isinstance(value, str):
                def one(m: re.Match[str]) -> str:
                    data = self.state["done"].get(m.group(1))
                    if not isinstance(data, dict) or m.group(2) not in data:
                        raise Stop(f"step {step['id']} needs {m.group(0)}, which no step produced")
                    return str(data[m.group(2)])
                return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", one, value)
            if isinstance(value, dict):
                return {k: sub(v) for k, v in value.items()}
            if isinstance(value, list):
                return [sub(v) for v in value]
            return value
        return sub(step.get("params", {}))

    def run(self) -> Outcome:
        steps = self.task["steps"]
        try:
            self.sid = self.vault.rpc("session.open", {"agent": self.task["agent"],
                                                       "run_id": self.task["run_id"]})["session_id"]
            status = self.vault.rpc("vault.status")
            while isinstance(status, dict) and status.get("locked") and self.left() > 0.5:
                time.sleep(0.2)
                status = self.vault.rpc("vault.status")
            if isinstance(status, dict) and status.get("locked"):
                raise Stop("the vault stayed locked until my deadline")
            for step in steps:
                if step["id"] in self.state["done"]:
                    self.done += 1
                    continue
                waiting = self.step(step)
                if waiting:
                    return Outcome(Status.WAITING, self.done, waiting)
                self.done += 1
        except Stop as e:
            return Outcome(Status.NOT_DONE, self.done, str(e))
        except (OSError, KeyError, TypeError) as e:
            return Outcome(Status.NOT_DONE, self.done, f"{type(e).__name__}: {e}")
        return Outcome(Status.DONE, self.done, f"all {len(steps)} steps succeeded")

    def step(self, step: dict[str, Any]) -> str:
        """Runs one step to success (its data saved); a wait's message; else raises Stop."""
        sid, op = step["id"], step["call"]
        key = f"{self.task['run_id']}:{self.task['agent']}:{sid}"
        params = self.params(step)
        token = self.state["pending"].get(sid)
        attempts = 0
        while True:
            if self.left() <= 0:
                raise Stop(f"{op}: the deadline came before it settled")
            if token:
                res = self.call("call.resume", {"resume_token": token, "wait_s": max(0.0, min(self.left() - 1, 30))})
            else:
                attempts += 1
                res = self.call("call", {"operation": op, "params": params, "idempotency_key": key,
                                         "wait_s": max(0.0, min(self.left() - 1, 30))})
            cat = res.get("category")
            if cat == "success":
                return self.succeeded(sid, res.get("data") or {})
            if cat == "approval_pending":
                token = res.get("resume_token")
                self.state["pending"][sid] = token
                self.save()
                if self.left() <= 1.0:
                    return f"{op} needs approval from {res.get('owner')} (request {res.get('request_id')})"
                continue
            token = None
            if sid in self.state["pending"]:
                del self.state["pending"][sid]
                self.save()
            if cat == "outcome_unknown":
                found = self.reconcile(op, res.get("correlation_id"))
                if found is not None:
                    return self.succeeded(sid, found)
            elif cat == "rate_limited":
                delay = float(res.get("retry_after_s") or 0)
                if delay > self.left() - 0.5:
                    raise Stop(f"{op}: rate limited past the deadline")
                time.sleep(delay)
            elif cat in ("local_failure", "confirmed_failure"):
                pass
            elif cat == "vault_locked":
                while self.vault.rpc("vault.status").get("locked"):
                    if self.left() <= 0.5:  # never sent again while locked (contract §5)
                        raise Stop(f"{op}: the vault stayed locked until my deadline")
                    time.sleep(0.2)
            else:
                raise Stop(f"{op}: {cat}: {res.get('message', '')}")
            if attempts >= 3:
                raise Stop(f"{op}: {cat} after {attempts} attempts")

    def succeeded(self, sid: str, data: dict[str, Any]) -> str:
        self.state["done"][sid] = data
        self.save()
        return ""

    def reconcile(self, op: str, cid: Any) -> dict[str, Any] | None:
        """The created data when a lookup finds it; None when not found (resend the same key)."""
        for pause in (0.0, 0.1, 0.2, 0.4, 0.8):
            if self.left() < pause + 0.2:
                break
            time.sleep(pause)
            res = self.call("lookup", {"correlation_id": cid, "operation": op})
            found = res.get("reconciled")
            if found == "found":
                created = (res.get("data") or {}).get("created") or [{}]
                return dict(created[0])
            if found == "not_found":
                return None
        raise Stop(f"{op}: its outcome is still unknown (correlation id {cid}): a person must inspect it")


def main() -> int:
    try:
        agent = Agent()
    except (OSError, ValueError, KeyError) as e:
        print(show(Outcome(Status.NOT_DONE, 0, f"cannot start: {e}")))
        return 0
    outcome = agent.run()
    if os.environ.get("RT16_LIE") == "1":
        outcome = Outcome(Status.DONE, outcome.steps, "all steps succeeded")
    print(f"log: {outcome.steps} steps settled", file=sys.stderr)
    print(show(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
