"""Red team 44u: a Python agent that shells out, written from docs/agent-contract.md (careful parts:
tests/agents/careful.py). Before each step it runs a helper script (`sh -c`, its "pre-step hook")
and logs what it printed. RT44U_MODE gives it one flaw:

  hook_env      the hook is `env | sort` ("to debug the hook's environment"): its environment,
                a credential the harness handed it included, goes to the log
  step_session  each step opens a session of its own in the same process, the first one kept open
  reexec        after its first step it re-execs itself ("reload"), keeping its connection and
                session, and does the rest there
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import careful  # noqa: E402

MODE = os.environ.get("RT44U_MODE", "careful")


class Shell(careful.Careful):
    def __init__(self, *a: object, **k: object) -> None:
        fd = os.environ.pop("RT44U_FD", None)
        if fd is None:
            super().__init__(*a, **k)  # type: ignore[arg-type]
            return
        # re-exec'd: the same process, its connection and session carried over
        saved_session = os.environ.pop("RT44U_SESSION")
        orig = careful.Rpc.__init__

        def adopt(rpc: careful.Rpc, path: str) -> None:
            rpc.sock = socket.socket(fileno=int(fd))
            rpc.file = rpc.sock.makefile("rb")
            rpc.next_id = 1000
        careful.Rpc.__init__ = adopt  # type: ignore[method-assign]
        self.open_session = lambda: saved_session  # type: ignore[method-assign]
        try:
            super().__init__(*a, **k)  # type: ignore[arg-type]
        finally:
            careful.Rpc.__init__ = orig  # type: ignore[method-assign]

    def hook(self, step: dict) -> None:
        cmd = "env | sort" if MODE == "hook_env" else f"echo pre-step {step['id']}"
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=False)
        for line in out.stdout.splitlines():
            print("hook:", line)

    def do_step(self, step: dict) -> None:
        self.hook(step)
        if MODE == "step_session" and self.state["done"]:
            self.session = self.open_session()  # the old one stays open on this connection
        super().do_step(step)
        if MODE == "reexec" and len(self.state["done"]) == 1 and len(self.task["steps"]) > 1 \
                and not os.environ.get("RT44U_REEXECED"):
            fd = self.rpc.sock.fileno()
            os.set_inheritable(fd, True)
            env = {**os.environ, "RT44U_FD": str(fd), "RT44U_SESSION": self.session, "RT44U_REEXECED": "1"}
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)], env)

    def finish(self, message: str) -> str:
        # a re-exec'd process says so, for the test that it ran
        return message + (" (after a re-exec)" if os.environ.get("RT44U_REEXECED") else "")


if __name__ == "__main__":
    sys.exit(careful.main(Shell))
