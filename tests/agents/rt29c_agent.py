"""A careful agent with habits a loaded machine punishes, written from docs/agent-contract.md.

No project imports. It follows the contract (one session, a key per step, resume
approvals, reconcile unknown outcomes) and adds one or more habits:

  --slow      thinks 2-4 s before its first connect and 1-3 s between turns, as an
              LLM would, but never past what its task deadline leaves for the work
  --busy      a thread burns CPU beside the calls (so its own answers are read late)
  --loud MB   prints MB megabytes of progress lines to stdout and stderr as it works
              (before its first connect and before each step)
  --atexit    the work runs in a thread; the final message is printed by an atexit
              handler after the thread is joined
  --sigterm   on SIGTERM, finishes the call in progress and says `not done: stopped`
  --non-blocking  wait_s 0 and short call.resume polls
  --json-final    the final message as {"status": ..., "message": ...}
"""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
NEVER = {"never", "human_required"}
MAX_ATTEMPTS = 3
POLL_S = 0.5
WORK_RESERVE_S = 4.0  # what a thinking agent keeps for its calls and its exit

ARGS = sys.argv[1:]
SLOW = "--slow" in ARGS
BUSY = "--busy" in ARGS
ATEXIT = "--atexit" in ARGS
SIGTERM = "--sigterm" in ARGS
BLOCKING = "--non-blocking" not in ARGS
JSON_FINAL = "--json-final" in ARGS
LOUD_MB = float(ARGS[ARGS.index("--loud") + 1]) if "--loud" in ARGS else 0.0

with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as _f:
    TASK = json.load(_f)
DEADLINE = float(TASK["deadline"])
RNG = random.Random(os.getpid())
stopping = threading.Event()


class RpcError(Exception):
    pass


class Stop(Exception):
    pass


def left() -> float:
    margin = min(0.5, max(0.2, 0.1 * float(TASK.get("deadline_s", 10))))
    return DEADLINE - time.time() - margin


def think(low: float, high: float) -> None:
    """An LLM's turn: a pause that leaves the task's work its time."""
    if not SLOW:
        return
    pause = min(RNG.uniform(low, high), left() - WORK_RESERVE_S)
    if pause > 0:
        stopping.wait(pause)


def burn() -> None:
    x = 0
    while True:
        for i in range(100000):
            x = (x * 31 + i) % 1000003


def connect(path: str) -> socket.socket:
    delay = 0.05
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except BlockingIOError:  # the vault's accept queue is full: back off (contract §3)
            s.close()
            if left() < delay:
                raise
            time.sleep(delay)
            delay = min(1.0, delay * 2)


class Rpc:
    def __init__(self, path: str) -> None:
        self.sock = connect(path)
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


class Agent:
    def __init__(self) -> None:
        self.run_id = os.environ.get("VAULTSIM_RUN_ID", TASK.get("run_id", "run"))
        self.name = TASK.get("agent") or "careful"
        self.rpc = Rpc(os.environ["VAULTSIM_SOCKET"])
        self.session = self.rpc("session.open", agent=self.name, run_id=self.run_id)["session_id"]
        sd = TASK.get("state_dir")
        self.state_file = os.path.join(sd, "rt29c-state.json") if sd else None
        self.state: dict = {"done": {}, "pending": {}}
        if self.state_file and os.path.exists(self.state_file):
            with open(self.state_file, encoding="utf-8") as f:
                self.state = json.load(f)

    def log(self, obj: object) -> None:
        print(json.dumps(obj), flush=True)

    def save(self) -> None:
        if not self.state_file:
            return
        tmp = self.state_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.state_file)

    def key(self, step: dict) -> str:
        return f"{self.run_id}:{self.name}:{step['id']}"

    def idempotent(self, op: str) -> bool:
        return bool(TASK.get("catalog", {}).get(op, {}).get("idempotent", False))

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

    def check_stop(self) -> None:
        if stopping.is_set():
            raise Stop("not done: stopped")

    def call(self, step: dict, params: dict, key: str) -> dict:
        self.check_stop()
        if left() <= 0:
            raise Stop(f"not done: no time left before the deadline for {step['call']}")
        wait = max(0.0, left()) if BLOCKING else 0.0
        try:
            result = self.rpc("call", session_id=self.session, operation=step["call"],
                              params=params, idempotency_key=key, wait_s=wait)
        except RpcError as exc:
            raise Stop(f"not done: the vault refused {step['call']}: {exc}") from None
        self.log(result)
        return result

    def resume(self, token: str) -> dict | None:
        wait = max(0.0, left()) if BLOCKING else max(0.0, min(POLL_S, left()))
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
                if left() < pause:
                    break
                time.sleep(pause)
            answer = self.rpc("lookup", session_id=self.session, correlation_id=result["correlation_id"])
            self.log(answer)
            if answer.get("reconciled") in ("found", "not_found"):
                break
        return answer

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
            if result is None:
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
                raise Stop(f"not done: {step['call']} got {category} (retry: {retry}); stopping")
            if category == "outcome_unknown":
                if attempts >= MAX_ATTEMPTS:
                    raise Stop(f"not done: {step['call']} is still unknown after {attempts} attempts")
                found = self.lookup(result)
                said = found.get("reconciled")
                if found.get("category") != "success" and found.get("retry") in NEVER:
                    raise Stop(f"not done: {step['call']} got {found['category']} on lookup")
                if said == "found":
                    created = (found.get("data") or {}).get("created") or [{}]
                    result = {**found, "category": "success", "data": created[0]}
                elif said == "not_found":
                    result = self.call(step, params, key)
                    attempts += 1
                else:
                    raise Stop(f"not done: the outcome of {step['call']} is unknown; a person must inspect it")
                continue
            if attempts >= MAX_ATTEMPTS:
                raise Stop(f"not done: {step['call']} failed {attempts} times ({category})")
            if category == "rate_limited":
                delay = float(result.get("retry_after_s") or 1.0)
                if delay >= left():
                    raise Stop(f"not done: {step['call']} is rate limited and the deadline is near")
                time.sleep(delay)
            elif category == "vault_locked":
                if self.rpc("vault.status").get("locked", True):
                    raise Stop(f"not done: the vault is locked; {step['call']} was not sent")
            elif retry != "bounded":
                raise Stop(f"not done: {step['call']}: {category} ({retry})")
            result = self.call(step, params, key)
            attempts += 1

    def await_approval(self, step: dict, result: dict) -> dict:
        token = result["resume_token"]
        self.state["pending"][step["id"]] = {"token": token, "cid": result["correlation_id"]}
        self.save()
        while result["category"] == "approval_pending":
            if left() <= 0.05 or stopping.is_set():
                word = "waiting"
                raise Stop(f"{word}: {step['call']} needs approval from {result.get('owner')} "
                           f"(request {result.get('request_id')}); resume token kept in the state directory")
            nxt = self.resume(token)
            if nxt is None:
                raise Stop(f"not done: the vault no longer knows the approval for {step['call']}")
            result = nxt
        self.state["pending"].pop(step["id"], None)
        self.save()
        return result

    def run(self) -> str:
        steps = TASK.get("steps") or []
        try:
            for step in steps:
                if step["id"] in self.state["done"]:
                    continue
                think(1.0, 3.0)
                loud(LOUD_MB / (len(steps) + 1))
                self.do_step(step)
        except Stop as stop:
            return str(stop)
        return "done: " + ", ".join(s["call"] for s in steps)


def final(message: str) -> str:
    if not JSON_FINAL:
        return message
    word = message.split(":", 1)[0].strip().lower()
    status = {"done": "done", "waiting": "waiting"}.get(word, "not_done")
    return json.dumps({"status": status, "message": message})


def loud(mb: float) -> None:
    line = "progress: " + "." * 100 + "\n"
    n = int(mb * 1024 * 1024 / len(line) / 2)  # half on each stream
    for i in range(n):
        sys.stdout.write(f"{i} {line}")
        sys.stderr.write(f"{i} {line}")
    sys.stdout.flush()
    sys.stderr.flush()


def work(out: list[str]) -> None:
    think(2.0, 4.0)  # start-up: imports, a model's first turn
    loud(LOUD_MB / (len(TASK.get("steps") or []) + 1))
    agent = Agent()
    message = agent.run()
    try:
        agent.rpc("session.close", session_id=agent.session)
    except (RpcError, OSError):
        pass
    out.append(final(message))


def main() -> int:
    if SIGTERM:
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    if BUSY:
        threading.Thread(target=burn, daemon=True).start()
    out: list[str] = []
    if ATEXIT:
        worker = threading.Thread(target=work, args=(out,))
        worker.start()

        def say() -> None:
            worker.join()
            print(out[0] if out else "not done: the worker failed", flush=True)
        atexit.register(say)
        return 0
    work(out)
    print(out[0], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
