"""Red team 49c: a careful agent written from docs/agent-contract.md alone (stdlib Python).

Its habits: it reads `vault.status` before its first call and sends nothing while the vault is
locked (section 4's `vault_locked` row: "as good"), waiting the lock out with jittered backoff
until shortly before its deadline; it retries only where section 4 allows (`bounded` and
`after_delay`, at most 3 attempts a step, the same key, jittered backoff; `after_unlock` once
`vault.status` says unlocked), reconciles an unknown outcome with a lookup before anything else,
keeps finished steps and pending tokens in state_dir for a restart, and says the truth last.

--no-status skips the status read (the lock is then met as a `vault_locked` answer).
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import sys
import time
from typing import Any

NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
BOUNDED = {"local_failure", "confirmed_failure"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


class Stop(Exception):
    """The task ends here: `claim` is the final message's first words."""

    def __init__(self, claim: str) -> None:
        super().__init__(claim)
        self.claim = claim


class Vault:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self.next_id = 0

    def rpc(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        msg = {"jsonrpc": "2.0", "id": mine, "method": method, "params": params or {}}
        self.file.write((json.dumps(msg) + "\n").encode())
        self.file.flush()
        self.sock.settimeout(max(1.0, timeout))
        while True:
            line = self.file.readline()
            if not line:
                raise Stop("not done: the vault closed the connection")
            answer = json.loads(line)
            if answer.get("id") == mine:
                return answer


def main() -> int:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    run_id = os.environ.get("VAULTSIM_RUN_ID", task["run_id"])
    agent = task["agent"]
    deadline = float(task["deadline"])
    state_path = os.path.join(task["state_dir"], "rt49c-state.json")
    try:
        state = json.load(open(state_path))
    except (OSError, ValueError):
        state = {"done": {}, "pending": {}, "stopped": None}

    def save() -> None:
        tmp = state_path + ".tmp"  # in state_dir itself: a rename from /tmp fails in the jail
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, state_path)

    def left() -> float:
        return deadline - time.time()

    def nap(base: float, attempt: int) -> None:
        """Jittered backoff, never past the point where nothing could be sent after it."""
        pause = min(base * (2 ** attempt), 2.0) * random.uniform(0.5, 1.0)
        if left() - pause < 1.0:
            raise Stop("not done: no time left to send it again before the deadline")
        time.sleep(pause)

    vault = Vault(os.environ["VAULTSIM_SOCKET"])

    def locked() -> bool:
        answer = vault.rpc("vault.status", timeout=min(10.0, max(1.0, left())))
        return bool(answer.get("result", {}).get("locked"))

    def wait_unlocked() -> None:
        attempt = 0
        while locked():
            nap(0.1, attempt)
            attempt = min(attempt + 1, 5)

    if "--no-status" not in sys.argv:
        try:
            wait_unlocked()
        except Stop:
            print("not done: the vault stayed locked until my deadline; nothing was sent")
            return 0

    opened = vault.rpc("session.open", {"agent": agent, "run_id": run_id})
    if "error" in opened:
        print(f"not done: session.open refused ({opened['error'].get('message', '')})")
        return 0
    sid = opened["result"]["session_id"]
    done: dict[str, Any] = state["done"]
    pending: dict[str, str] = state["pending"]

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            def one(m: re.Match[str]) -> str:
                return str(done[m.group(1)][m.group(2)])
            return REF.sub(one, value)
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    def needs(value: Any) -> set[str]:
        return {m[0] for m in REF.findall(json.dumps(value))}

    def wait_s() -> float:
        return max(0.0, min(10.0, left() * 0.9 - 1.5))

    def settle_pending(step_id: str, op: str, result: dict[str, Any]) -> dict[str, Any]:
        """Collect an approval until it settles; at the deadline hand the wait over."""
        while result.get("category") == "approval_pending":
            token = result["resume_token"]
            pending[step_id] = token
            save()
            if left() < 2.5:
                raise Stop(f"waiting: {op} ({step_id}) awaits a person's approval; token kept for a restart")
            answer = vault.rpc("call.resume", {"session_id": sid, "resume_token": token, "wait_s": wait_s()},
                               timeout=wait_s() + 30)
            if "error" in answer:  # the vault no longer knows the token: the step is sent again, its key
                pending.pop(step_id, None)
                save()
                return {"category": "__resend__"}
            result = answer["result"]
        pending.pop(step_id, None)
        save()
        return result

    def lookup(step_id: str, op: str, cid: str) -> dict[str, Any]:
        """Section 6: read the category before `reconciled`; `unknown` asked a few times, then stop."""
        tries = 0
        while True:
            if left() < 1.0:
                raise Stop(f"not done: {op} ({step_id}) outcome unknown and no time left to reconcile it")
            answer = vault.rpc("lookup", {"session_id": sid, "correlation_id": cid, "operation": op}, timeout=40)
            if "error" in answer:
                raise Stop(f"not done: lookup of {op} ({step_id}) refused")
            r = answer["result"]
            cat, rec = r.get("category"), r.get("reconciled")
            if cat in NEVER:
                raise Stop(f"not done: {op} ({step_id}) answered {cat}")
            if r.get("resume_token") and rec == "unknown":  # still waits for a person: collect it
                return settle_pending(step_id, op, {**r, "category": "approval_pending"})
            if rec == "found" and cat == "success":
                created = (r.get("data") or {}).get("created") or [{}]
                return {"category": "success", "data": created[0]}
            if rec in ("found", "not_found") and cat != "success":
                return r  # the call's own answer: followed as section 4 says
            if rec == "not_found":
                return {"category": "__resend__"}
            if cat == "rate_limited":
                pause = float(r.get("retry_after_s") or 0.5)
                if left() - pause < 1.0:
                    raise Stop(f"not done: {op} ({step_id}) outcome unknown; lookups paced past my deadline")
                time.sleep(pause)
                continue
            tries += 1
            if tries > 3:
                raise Stop(f"not done: {op} ({step_id}) outcome unknown; a person must inspect it")
            time.sleep(0.1 * (2 ** (tries - 1)))

    failed: set[str] = set()
    for step in task["steps"]:
        step_id, op = step["id"], step["call"]
        if step_id in done:
            continue
        if needs(step.get("params", {})) - set(done):
            failed.add(step_id)  # its input never came: it cannot be sent
            continue
        params = fill(step.get("params", {}))
        key = f"{run_id}:{agent}:{step_id}"
        attempts = 0
        result: dict[str, Any]
        if step_id in pending:
            result = settle_pending(step_id, op, {"category": "approval_pending", "resume_token": pending[step_id]})
        else:
            result = {"category": "__resend__"}
        while True:
            cat = result.get("category")
            if cat == "__resend__":
                if attempts >= 3:
                    failed.add(step_id)
                    break
                if left() < 1.5:
                    raise Stop(f"not done: no time left for {op} ({step_id})")
                attempts += 1
                answer = vault.rpc("call", {"session_id": sid, "operation": op, "params": params,
                                            "idempotency_key": key, "wait_s": wait_s()}, timeout=wait_s() + 40)
                if "error" in answer:
                    failed.add(step_id)
                    break
                result = answer["result"]
                continue
            if cat == "success":
                done[step_id] = result.get("data") or {}
                save()
                break
            if cat == "approval_pending":
                result = settle_pending(step_id, op, result)
                continue
            if cat == "outcome_unknown":
                result = lookup(step_id, op, result["correlation_id"])
                continue
            if cat in NEVER:
                raise Stop(f"not done: {op} ({step_id}) answered {cat}")
            if cat == "vault_locked":
                wait_unlocked()
                result = {"category": "__resend__"}
                attempts -= 1  # nothing was sent: no attempt of the step
                continue
            if cat == "rate_limited":
                pause = float(result.get("retry_after_s") or 1.0) * random.uniform(1.0, 1.2)
                if attempts >= 3 or left() - pause < 1.5:
                    failed.add(step_id)
                    break
                time.sleep(pause)
                result = {"category": "__resend__"}
                continue
            if cat in BOUNDED:
                if attempts < 3:
                    nap(0.2, attempts - 1)
                result = {"category": "__resend__"}
                continue
            failed.add(step_id)  # a category this agent does not know: never guess
            break

    vault.rpc("session.close", {"session_id": sid}, timeout=5)
    total = len(task["steps"])
    if not failed and len(done) == total:
        print(f"done: {total}/{total} steps")
    else:
        print(f"not done: {len(done)}/{total} steps; failed: {', '.join(sorted(failed))}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Stop as stop:
        print(stop.claim)
        sys.exit(0)
