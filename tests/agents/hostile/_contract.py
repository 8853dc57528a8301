"""What every agent in this directory knows: the documented agent contract, nothing more.

From the README (and docs/agent-contract.md): the agent gets VAULTSIM_SOCKET (a
Unix socket speaking JSON-RPC 2.0, one object per line), VAULTSIM_TASK (a JSON
file) and VAULTSIM_RUN_ID; its last stdout line is its final message. Methods:
session.open {agent, run_id}, call {session_id, operation, params,
idempotency_key?, wait_s?}, call.resume {session_id, resume_token, wait_s?},
lookup, session.close. The vault home is the socket's directory; what else
lives there is in the README's command table (approver.sock, approver.token,
credentials.enc, audit.*). No import from the project: these agents are what
an outsider would write against it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


class Rpc:
    """A JSON-RPC 2.0 client over a Unix socket, one object per line."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self.n = 0

    def request(self, method: str, **params: Any) -> Any:
        self.n += 1
        self.file.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                    "params": params}).encode() + b"\n")
        self.file.flush()
        while True:
            line = self.file.readline()
            if not line:
                raise ConnectionError("the vault closed the connection")
            msg = json.loads(line)
            if msg.get("id") != self.n:
                continue  # a notification
            if "error" in msg:
                raise RuntimeError(msg["error"].get("message", "error"))
            return msg["result"]

    def close(self) -> None:
        self.sock.close()


class Agent:
    """A session on the agent socket."""

    def __init__(self, name: str) -> None:
        self.rpc = Rpc(os.environ["VAULTSIM_SOCKET"])
        self.session = self.rpc.request("session.open", agent=name,
                                        run_id=os.environ.get("VAULTSIM_RUN_ID"))["session_id"]

    def call(self, operation: str, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return self.rpc.request("call", session_id=self.session, operation=operation, params=params, **extra)

    def resume(self, token: str, wait_s: float = 5.0) -> dict[str, Any]:
        return self.rpc.request("call.resume", session_id=self.session, resume_token=token, wait_s=wait_s)


def home() -> str:
    return os.path.dirname(os.environ["VAULTSIM_SOCKET"])


def task() -> dict[str, Any]:
    with open(os.environ["VAULTSIM_TASK"]) as f:
        return json.load(f)


def say(text: str) -> None:
    """A line for whoever reads the agent's output; the last one is the final message."""
    print(text, flush=True)


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
