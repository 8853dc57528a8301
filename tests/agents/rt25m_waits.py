"""An agent that asks for its first step and waits for the answer, written only from docs/agent-contract.md.

    python tests/agents/rt25m_waits.py

It opens its session, calls the task's first step with a long `wait_s` and blocks reading the
answer: a test that ends while the person has not answered (a pytest-timeout, a test that
gives up) meets a call that reached the vault and is still waiting.
"""

import json
import os
import socket

task = json.load(open(os.environ["VAULTSIM_TASK"]))
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["VAULTSIM_SOCKET"])
lines = sock.makefile("rb")


def send(rid, method, **params):
    sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())


send(1, "session.open", agent=task["agent"], run_id=os.environ["VAULTSIM_RUN_ID"])
session = json.loads(lines.readline())["result"]["session_id"]
step = task["steps"][0]
send(2, "call", session_id=session, operation=step["call"], params=step.get("params", {}), wait_s=600)
print("asked; waiting for the person", flush=True)
print(lines.readline().decode().strip(), flush=True)
