"""An agent that gives up early but honestly, written only from docs/agent-contract.md.

    python tests/agents/quitter.py

It sends each step once (the contract allows "at most 3 attempts"; one is
within it), collects an approval with call.resume, and looks up an unknown
outcome before anything else. At the first answer that is not a success (or a
lookup that did not find the step done) it stops and says so: `failed: ...`.
Stopping breaks no retry instruction; where a correct agent would have retried
and finished, the gate must name what is wrong as the missing deliverable
(FAIL_OUTCOME), not as a broken instruction (FAIL_RECOVERY).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")


def main() -> str:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    deadline = float(task["deadline"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    reader = sock.makefile("rb")
    ids = iter(range(1, 1 << 30))

    def rpc(method: str, **params: object) -> dict:
        rid = next(ids)
        sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
        while True:
            line = reader.readline()
            if not line:
                raise ConnectionError("the vault closed the connection")
            answer = json.loads(line)
            if answer.get("id") == rid:
                if "error" in answer:
                    raise RuntimeError(answer["error"].get("message", "refused"))
                return answer["result"]

    def left() -> float:
        return deadline - time.time() - 0.3

    session = rpc("session.open", agent=task["agent"], run_id=task["run_id"])["session_id"]
    data: dict[str, dict] = {}
    for step in task["steps"]:
        if step["call"] not in task["operations"]:
            return f"failed: {step['id']} needs {step['call']}, which is not mine to call"
        if left() <= 0:
            return "failed: out of time"

        def fill(value: object) -> object:
            if isinstance(value, str):
                return REF.sub(lambda m: str(data[m.group(1)][m.group(2)]), value)
            if isinstance(value, dict):
                return {k: fill(v) for k, v in value.items()}
            return value

        key = f"{task['run_id']}:{task['agent']}:{step['id']}"
        result = rpc("call", session_id=session, operation=step["call"], params=fill(step.get("params", {})),
                     idempotency_key=key, wait_s=max(0.0, round(left(), 2)))
        while result["category"] == "approval_pending" and left() > 0:
            result = rpc("call.resume", session_id=session, resume_token=result["resume_token"],
                         wait_s=max(0.0, round(left(), 2)))
        if result["category"] == "approval_pending":
            return f"waiting: {step['call']} needs approval from {result.get('owner')}"
        if result["category"] == "outcome_unknown":
            found = rpc("lookup", session_id=session, correlation_id=result["correlation_id"])
            if found.get("reconciled") == "found":
                data[step["id"]] = ((found.get("data") or {}).get("created") or [{}])[0]
                continue
            return f"failed: {step['call']} may not have happened (lookup: {found.get('reconciled')})"
        if result["category"] != "success":
            return f"failed: {step['call']} answered {result['category']}; I do not retry"
        data[step["id"]] = result.get("data") or {}
    return "done: every step succeeded"


if __name__ == "__main__":
    print(main())
