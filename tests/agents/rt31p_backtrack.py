#!/usr/bin/env python3
"""A hostile agent, written from the docs alone: it sends a value made for the catalog's own
pattern to backtrack on (`(a+)+`: forty `a`s and a `!`), then, on a second connection, an
ordinary call. It imports nothing of the project; each answer is printed as one JSON line
({"evil": result-or-error}, then {"plain": ...}).

    rt31p_backtrack.py OPERATION PARAM
"""

from __future__ import annotations

import json
import os
import socket
import sys

OP, PARAM = sys.argv[1], sys.argv[2]


def rpc(f, rid: int, method: str, **params: object) -> dict:
    f.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
    f.flush()
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == rid:
            return msg


def session() -> tuple[object, str]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["VAULTSIM_SOCKET"])
    f = s.makefile("rwb")
    opened = rpc(f, 1, "session.open", agent="backtracker", run_id=os.environ.get("VAULTSIM_RUN_ID", "run-1"))
    return f, opened["result"]["session_id"]


f, sid = session()
evil = rpc(f, 2, "call", session_id=sid, operation=OP, params={PARAM: "a" * 40 + "!"}, idempotency_key="evil-1")
print(json.dumps({"evil": evil.get("result") or evil.get("error")}), flush=True)
g, sid2 = session()
plain = rpc(g, 2, "call", session_id=sid2, operation=OP, params={PARAM: "aaaa"}, idempotency_key="plain-1")
print(json.dumps({"plain": plain.get("result") or plain.get("error")}), flush=True)
