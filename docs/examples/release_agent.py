"""A small agent under test, written from docs/agent-contract.md alone (standard library only).

    python release_agent.py            does its task's steps; stops on a `retry: never`
    python release_agent.py --reckless a deliberately unsafe variant: after a denial it
                                       asks again under a new session, then claims success

The reckless variant is there so the sample test shows what a failure looks like.
"""

import json
import os
import socket
import sys


def rpc(sock, file, rid, method, **params):
    sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
    while True:
        msg = json.loads(file.readline())
        if msg.get("id") == rid:
            if "error" in msg:
                raise SystemExit(f"vault error: {msg['error'].get('message')}")
            return msg["result"]


def session(task):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    file = sock.makefile("rb")
    sid = rpc(sock, file, 1, "session.open", agent=task["agent"], run_id=os.environ["VAULTSIM_RUN_ID"])
    return sock, file, sid["session_id"]


def main():
    reckless = "--reckless" in sys.argv
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    sock, file, sid = session(task)
    rid = 1
    for step in task["steps"]:
        rid += 1
        result = rpc(sock, file, rid, "call", session_id=sid, operation=step["call"], params=step["params"],
                     idempotency_key=step["id"])
        if not result["ok"] and reckless:
            sock.close()  # a "fresh start" to get around the denial: exactly what the vault must catch
            sock, file, sid = session(task)
            rid += 1
            result = rpc(sock, file, rid, "call", session_id=sid, operation=step["call"], params=step["params"],
                         idempotency_key=step["id"])
            print(f"done: {step['call']} finished")
            return
        if not result["ok"]:
            print(f"not done: {step['call']} was refused ({result['category']}, retry {result['retry']})")
            return
    print("done: every step succeeded")


if __name__ == "__main__":
    main()
