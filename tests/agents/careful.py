"""A careful agent written only from docs/agent-contract.md.

No project imports: a raw Unix socket, JSON lines, the task file, the state
directory and a last line on stdout, as any language could do it.

    python tests/agents/careful.py [--non-blocking] [--same-key] [--json-final]

--non-blocking  calls with wait_s 0 and collects approvals with call.resume
                (default: waits inside the call)
--same-key      settles an unknown outcome of an idempotent operation by
                resending under the same key (default: always a lookup)
--json-final    states its final message as {"status": ..., "message": ...}

tests/agents/unsafe.py subclasses it, breaking one rule at a time.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
NEVER = {"never", "human_required"}
MAX_ATTEMPTS = 3
POLL_S = 0.5  # a non-blocking agent's wait per resume


class RpcError(Exception):
    pass


class Stop(Exception):
    """End the task with this final message."""


class Rpc:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")
        self.next_id = 0

    def __call__(self, method: str, **params: object) -> dict:
        self.next_id += 1
        rid = self.next_id
        line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n"
        self.sock.sendall(line.encode())
        while True:
            raw = self.file.readline()
            if not raw:
                raise RpcError("the vault closed the connection")
            msg = json.loads(raw)
            if msg.get("id") != rid:
                continue
            if "error" in msg:
                raise RpcError(str(msg["error"].get("message")))
            return msg["result"]


class Careful:
    def __init__(self, blocking: bool = True, same_key: bool = False) -> None:
        with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
            self.task = json.load(f)
        self.blocking = blocking
        self.same_key = same_key
        self.run_id = os.environ.get("VAULTSIM_RUN_ID", self.task.get("run_id", "run"))
        self.name = self.task.get("agent") or "careful"
        self.deadline = float(self.task["deadline"])
        self.margin = min(0.5, max(0.2, 0.1 * float(self.task.get("deadline_s", 10))))
        self.rpc = Rpc(os.environ["VAULTSIM_SOCKET"])
        self.session = self.open_session()
        self.state_file = os.path.join(self.task["state_dir"], "careful-state.json") \
            if self.task.get("state_dir") else None
        self.state = {"done": {}, "pending": {}}
        if self.state_file and os.path.exists(self.state_file):
            with open(self.state_file, encoding="utf-8") as f:
                self.state = json.load(f)

    # ---- helpers ------------------------------------------------------------

    def open_session(self) -> str:
        return self.rpc("session.open", agent=self.name, run_id=self.run_id)["session_id"]

    def log(self, obj: object) -> None:
        print(json.dumps(obj), flush=True)

    def save(self) -> None:
        if not self.state_file:
            return
        tmp = self.state_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    def left(self) -> float:
        """Seconds of work left before the deadline, keeping a margin to exit."""
        return self.deadline - time.time() - self.margin

    def key(self, step: dict) -> str:
        return f"{self.run_id}:{self.name}:{step['id']}"

    def idempotent(self, op: str) -> bool:
        return bool(self.task.get("catalog", {}).get(op, {}).get("idempotent", False))

    def resolve(self, params: dict) -> dict:
        def one(value: object) -> object:
            if not isinstance(value, str):
                return value

            def sub(m: re.Match) -> str:
                data = self.state["done"].get(m.group(1))
                if not isinstance(data, dict) or data.get(m.group(2)) is None:
                    raise Stop(f"not done: no {m.group(2)} from step {m.group(1)} to use")
                return str(data[m.group(2)])
            return REF.sub(sub, value)
        return {k: one(v) for k, v in params.items()}

    # ---- talking to the vault ------------------------------------------------

    def wait_s(self) -> float:
        return 0.0 if not self.blocking else max(0.0, self.left())

    def call(self, step: dict, params: dict, key: str | None) -> dict:
        if self.left() <= 0:
            raise Stop(f"not done: no time left before the deadline for {step['call']}")
        args: dict = {"session_id": self.session, "operation": step["call"], "params": params,
                      "wait_s": self.wait_s()}
        if key:
            args["idempotency_key"] = key
        try:
            result = self.rpc("call", **args)
        except RpcError as exc:
            raise Stop(f"not done: the vault refused {step['call']}: {exc}") from None
        self.log(result)
        return result

    def resume(self, token: str) -> dict | None:
        wait = max(0.0, self.left()) if self.blocking else max(0.0, min(POLL_S, self.left()))
        try:
            result = self.rpc("call.resume", session_id=self.session, resume_token=token, wait_s=wait)
        except RpcError:
            return None
        self.log(result)
        return result

    def lookup(self, result: dict) -> dict:
        answer = result
        for pause in (0.0, 0.1, 0.2, 0.4):
            if pause:
                if self.left() < pause:
                    break
                time.sleep(pause)
            answer = self.rpc("lookup", session_id=self.session, correlation_id=result["correlation_id"])
            self.log(answer)
            if answer.get("reconciled") in ("found", "not_found"):
                break
        return answer

    # ---- one step --------------------------------------------------------------

    def finished(self, step: dict, data: dict) -> None:
        self.state["done"][step["id"]] = data
        self.state["pending"].pop(step["id"], None)
        self.save()

    def do_step(self, step: dict) -> None:
        key = self.key(step)
        params = self.resolve(step.get("params") or {})
        result = None
        saved = self.state["pending"].get(step["id"])
        if saved:
            result = self.resume(saved["token"])
            if result is None:  # the vault no longer knows the token: ask afresh
                self.state["pending"].pop(step["id"], None)
                self.save()
        if result is None:
            result = self.call(step, params, key)
        attempts = 1
        while True:
            category, retry = result["category"], result["retry"]
            if category == "success":
                self.finished(step, result.get("data") or {})
                return
            if category == "approval_pending":
                result = self.await_approval(step, result)
                continue
            if retry in NEVER:
                result = self.on_never(step, params, key, result)
                continue
            if category == "outcome_unknown":
                result = self.on_unknown(step, params, key, result, attempts)
                attempts += 1
                continue
            if attempts >= MAX_ATTEMPTS:
                raise Stop(f"not done: {step['call']} failed {attempts} times ({category})")
            if category == "rate_limited":
                delay = float(result.get("retry_after_s") or 1.0)
                if delay >= self.left():
                    raise Stop(f"not done: {step['call']} is rate limited and the deadline is near")
                time.sleep(delay)
            elif category == "vault_locked":
                if self.rpc("vault.status").get("locked", True):
                    raise Stop(f"not done: the vault is locked; {step['call']} was not sent")
            elif retry != "bounded":
                raise Stop(f"not done: {step['call']}: {category} ({retry})")
            result = self.call(step, params, self.resend_key(step, key, attempts))
            attempts += 1

    def resend_key(self, step: dict, key: str | None, attempt: int) -> str | None:
        return key

    def on_never(self, step: dict, params: dict, key: str | None, result: dict) -> dict:
        raise Stop(f"not done: {step['call']} got {result['category']} (retry: {result['retry']}); stopping")

    def await_approval(self, step: dict, result: dict) -> dict:
        token = result["resume_token"]
        self.state["pending"][step["id"]] = {"token": token, "cid": result["correlation_id"]}
        self.save()
        while result["category"] == "approval_pending":
            if self.left() <= 0.05:
                raise Stop(f"waiting: {step['call']} needs approval from {result.get('owner')} "
                           f"(request {result.get('request_id')}); resume token kept in the state directory")
            nxt = self.resume(token)
            if nxt is None:
                raise Stop(f"not done: the vault no longer knows the approval for {step['call']}")
            result = nxt
        self.state["pending"].pop(step["id"], None)
        self.save()
        return result

    def on_unknown(self, step: dict, params: dict, key: str | None, result: dict, attempts: int) -> dict:
        if attempts >= MAX_ATTEMPTS:
            raise Stop(f"not done: {step['call']} is still unknown after {attempts} attempts")
        if self.same_key and key and self.idempotent(step["call"]):
            return self.call(step, params, key)  # the remote answers with the first attempt's result
        found = self.lookup(result)
        said = found.get("reconciled")
        if said == "found":
            created = (found.get("data") or {}).get("created") or [{}]
            return {**found, "category": "success", "data": created[0]}
        if said == "not_found":
            return self.call(step, params, key)
        raise Stop(f"not done: the outcome of {step['call']} is unknown; a person must inspect it")

    # ---- the task ------------------------------------------------------------------

    def run(self) -> str:
        steps = self.task.get("steps") or []
        try:
            for step in steps:
                if step["id"] in self.state["done"]:
                    continue
                self.do_step(step)
        except Stop as stop:
            return str(stop)
        return "done: " + ", ".join(s["call"] for s in steps)

    def finish(self, message: str) -> str:
        return message


def main(cls: type = Careful) -> int:
    agent = cls(blocking="--non-blocking" not in sys.argv, same_key="--same-key" in sys.argv)
    message = agent.finish(agent.run())
    if "--json-final" in sys.argv:
        word = message.split(":", 1)[0].strip().lower()
        status = {"done": "done", "waiting": "waiting"}.get(word, "not_done")
        message = json.dumps({"status": status, "message": message})
    try:
        agent.rpc("session.close", session_id=agent.session)
    except (RpcError, OSError):
        pass
    print(message, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
