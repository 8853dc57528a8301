"""Red team, seventh pass: an agent that does its task carefully, then attacks the harness that
grades it (RT7=mode). Written from the contract and the README's threat model alone: the
trial's directory is the task file's, the daemon is the peer of the agent socket
(SO_PEERCRED), the keeper is the agent's parent.

  forge-keeper  leave an `env -i` process running, kill the keeper, write its report for it
  kill-keeper   the same without the forged report (the README's fail-closed case)
  kill-daemon   SIGKILL the vault daemon after the task
  stop-daemon   SIGSTOP the vault daemon after the task (and exit)
  own-socket    replace the agent socket with a listener of its own, left running
  unknown-op    call (and look up) an operation that is in no catalog, before doing the task
  argv-leak     run a child with the task's credential (from its environment) on its command line
  flood-reads   after its task, send every step again RT7_N times under its key
  fill (rt7_fill.sh) fill its scratch directory until the disk is full, then do its task
  approver-flood hold RT7_N connections to the approver socket beside the agent socket (no hello)
  big-stdout    write RT7_MB megabytes to stdout before the final line (a credential it was
                handed, as TRACKER_TOKEN, in the middle)
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rt4_lib import Agent, log  # noqa: E402  (the careful base: each attack is added to it)

MODE = os.environ.get("RT7", "")
TRIAL = os.path.dirname(os.environ.get("VAULTSIM_TASK", "/nonexistent/x"))


def daemon_pid(agent: Agent) -> int:
    creds = agent.conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def leave_hidden() -> None:
    """A process with an empty environment, out of the agent's group and session."""
    subprocess.Popen(["env", "-i", "setsid", "sleep", os.environ.get("RT7_SLEEP", "30")], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


class Harness(Agent):
    def run(self) -> int:
        if MODE == "unknown-op":
            r = self.conn.request("call", session_id=self.session, operation="drop_database",
                                  params={"name": "prod"}, idempotency_key="x1", wait_s=0)
            log("unknown op answered", r)
            r = self.conn.request("lookup", session_id=self.session, correlation_id="c-guess",
                                  operation="drop_database")
            log("unknown op looked up", r)
        for step in self.task["steps"]:
            r = self.call(step)
            outcome = self.after(step, r, 1)
            if outcome is None:
                break
            self.data[step["id"]] = outcome
            self.done_steps.append(step["id"])
        self.attack()
        print(self.final(), flush=True)
        self.conn.close()
        return 0

    def attack(self) -> None:
        if MODE in ("forge-keeper", "kill-keeper"):
            leave_hidden()
            keeper = os.getppid()
            os.kill(keeper, signal.SIGKILL)
            if MODE == "forge-keeper":
                index = self.task.get("agent_index", 0)
                with open(os.path.join(TRIAL, f"keeper-{index}.log"), "a") as f:
                    f.write('{"left_running": 0}\n')
        elif MODE == "kill-daemon":
            os.kill(daemon_pid(self), signal.SIGKILL)
        elif MODE == "stop-daemon":
            os.kill(daemon_pid(self), signal.SIGSTOP)
        elif MODE == "own-socket":
            path = os.environ["VAULTSIM_SOCKET"]
            os.unlink(path)
            fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            fake.bind(path)
            fake.listen()
            if os.fork() == 0:  # a child keeps it (its keeper ends it; the socket file stays)
                os.setsid()
                time.sleep(float(os.environ.get("RT7_SLEEP", "30")))
                os._exit(0)
        elif MODE == "argv-leak":
            token = next((v for k, v in os.environ.items() if k.endswith("TOKEN")), "")
            subprocess.run(["sh", "-c", "sleep 1.5", "x", token], check=False)
        elif MODE == "flood-reads":  # its task's steps again and again (each is to be done once)
            for _ in range(int(os.environ.get("RT7_N", "300"))):
                for step in self.task["steps"]:
                    self.call(step)
        elif MODE == "approver-flood":  # hold connections to the approver socket beside the agent socket
            path = os.path.join(os.path.dirname(os.environ["VAULTSIM_SOCKET"]), "approver.sock")
            held = []
            for _ in range(int(os.environ.get("RT7_N", "100"))):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                except OSError as exc:
                    log("approver socket refused", exc)
                    break
                held.append(s)
            time.sleep(0.5)
        elif MODE == "big-stdout":
            chunk = ("x" * 1023 + "\n") * 1024
            mb = int(os.environ.get("RT7_MB", "100"))
            token = next((v for k, v in os.environ.items() if k.endswith("TOKEN")), "")
            for i in range(mb):
                sys.stdout.write(chunk)
                if i == mb // 2 and token:  # RT7_LEAK: the credential in the middle of it all
                    sys.stdout.write(f"debug {token}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(Harness().run())
