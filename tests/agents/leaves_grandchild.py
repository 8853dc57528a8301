"""An agent that does its task and leaves a detached grandchild behind, written only
from docs/agent-contract.md.

    python tests/agents/leaves_grandchild.py MARKER

It does every step once and says "done"; just before it exits it double-forks a
grandchild that calls setsid (leaving the agent's process group) and sleeps with
MARKER in its command line. The contract's FAIL_DEADLINE covers an agent that
"was still running": without a jail nothing else would end that process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys

task = json.load(open(os.environ["VAULTSIM_TASK"]))
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["VAULTSIM_SOCKET"])
reader = sock.makefile("rb")


def rpc(rid: int, method: str, **params: object) -> dict:
    sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
    while True:
        answer = json.loads(reader.readline())
        if answer.get("id") == rid:
            return answer.get("result") or {"category": "error"}


session = rpc(1, "session.open", agent=task["agent"], run_id=task["run_id"])["session_id"]
final = "done: every step succeeded"
data: dict[str, dict] = {}
for n, step in enumerate(task["steps"], start=2):
    params = {k: re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(data[m.group(1)][m.group(2)]), v)
              if isinstance(v, str) else v for k, v in (step.get("params") or {}).items()}
    result = rpc(n, "call", session_id=session, operation=step["call"], params=params,
                 idempotency_key=f"{task['run_id']}:{task['agent']}:{step['id']}", wait_s=2)
    if result["category"] != "success":
        final = f"not done: {step['call']} answered {result['category']}"
        break
    data[step["id"]] = result.get("data") or {}
print(final, flush=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
    os._exit(0)
os.wait()
