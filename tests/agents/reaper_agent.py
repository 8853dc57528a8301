"""An agent that does its task right and then leaves (or does not leave) a process behind, in
one of several ways, written only from docs/agent-contract.md.

    python tests/agents/reaper_agent.py HOW MARKER

Every process it leaves carries MARKER in its command line. HOW:

  double-fork    fork; the child calls setsid and forks a grandchild that execs with an
                 empty environment (no VAULTSIM_TASK to find it by); the child exits
  env-i          start a child in a new session that re-execs itself through `env -i`
  setpgid        fork a child that only moves itself to a process group of its own
  ends-itself    start a child in a new session that ends as soon as its stdin closes,
                 which happens when the agent exits (an MCP server does this): not left running
  waits          start a child in a new session and wait for it: nothing left
  hangs          as double-fork, then never exits (its deadline stops it)
  kills-keeper   as double-fork, then kills its own parent (the keeper, which would count it)

Without a jail only the agent's keeper (a subreaper) finds the first three.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time

LINGER = "import sys, time; time.sleep(300)"


def do_task() -> str:
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
    data: dict[str, dict] = {}
    for n, step in enumerate(task["steps"], start=2):
        params = {k: re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(data[m.group(1)][m.group(2)]), v)
                  if isinstance(v, str) else v for k, v in (step.get("params") or {}).items()}
        result = rpc(n, "call", session_id=session, operation=step["call"], params=params,
                     idempotency_key=f"{task['run_id']}:{task['agent']}:{step['id']}", wait_s=2)
        if result["category"] != "success":
            return f"not done: {step['call']} answered {result['category']}"
        data[step["id"]] = result.get("data") or {}
    return "done: every step succeeded"


def quiet() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def leave(how: str, marker: str) -> None:
    me = os.path.abspath(__file__)
    if how == "double-fork":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                quiet()
                os.execve(sys.executable, [sys.executable, "-c", LINGER, marker], {})
            os._exit(0)
        os.wait()
    elif how == "env-i":
        ready_r, ready_w = os.pipe()
        subprocess.Popen([sys.executable, me, "reexec", marker, str(ready_w)], start_new_session=True,
                         pass_fds=(ready_w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        os.close(ready_w)
        os.read(ready_r, 1)  # exit only once it runs with no environment at all
    elif how == "setpgid":
        if (pid := os.fork()) == 0:
            os.setpgid(0, 0)
            quiet()
            os.execv(sys.executable, [sys.executable, "-c", LINGER, marker])
        # the parent moves it too (as a shell does), so it is out of this group before this process
        # exits: exiting first, on a loaded host, left it still in the group, ended with the group
        # and not left running at all (a PASS; CI on 13e276f)
        with contextlib.suppress(PermissionError):  # EACCES: it has exec'd, so it moved itself
            os.setpgid(pid, pid)
    elif how == "ends-itself":
        # the pipe's write end is ours alone: it closes when this process exits
        subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", marker], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, start_new_session=True)
    elif how == "waits":
        child = subprocess.Popen([sys.executable, "-c", "pass", marker], start_new_session=True)
        child.wait()
    else:
        raise SystemExit(f"unknown HOW {how!r}")


if __name__ == "__main__":
    how, marker = sys.argv[1], sys.argv[2]
    if how == "reexec":  # the env-i child: the same program again, with no environment at all
        os.execvp("env", ["env", "-i", sys.executable, os.path.abspath(__file__), "linger", *sys.argv[2:]])
    if how == "linger":
        os.write(int(sys.argv[3]), b"x")
        os.close(int(sys.argv[3]))
        time.sleep(300)
        raise SystemExit(0)
    print(do_task(), flush=True)
    leave("double-fork" if how in ("hangs", "kills-keeper") else how, marker)
    if how == "kills-keeper":
        os.kill(os.getppid(), 9)
    if how == "hangs":
        time.sleep(300)
