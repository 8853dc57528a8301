"""Red team 43u (unsafe): an agent that tries to blind the grader rather than fool the vault.

Written from docs/agent-contract.md, the README's "Scenario runner and release gate" and "Threat
model: the agent jail" sections and DESIGN.md alone (stdlib, no project import beyond the careful
agent of tests/agents/careful.py, itself written from the contract). It does its task as that
careful agent does; RT43U_MODE (an environment variable) adds one act against the evidence:

  careful        none
  probe          lists the trial directory (the task file's) into the file RT43U_PROBE names
  lie_lookup     sends no step: looks each step up by its key (never sent) and says `done`
  extra_then_close   does its task, closes stdout and stderr, then sends one more call of its
                 first step's operation with other parameters (an effect no step asks for), exits
  stop_keeper    does its task, leaves a child in a session of its own that sends an off-task
                 call 1 s later, SIGSTOPs its keeper (its parent) and exits `done` (no jail)
  stop_self      does its task, prints `done`, then SIGSTOPs itself: still there at the deadline
  huge_line      its first step refused: prints `done` followed by 10 MB with no newline
  swap_<kind>     does its task, reads the file RT43U_PEEK names (if set), then replaces each file
                 RT43U_FILES names (comma-separated globs, relative to the trial directory, the
                 task file's: no jail) by a `fifo` (nothing ever writes it), a symlink to
                 /dev/`zero` (endless), a `sparse` file of 64 GiB, or a `text` file of its own (a
                 forged line: `vaultsim daemon: stopped; its audit log failed: forged by rt43u`),
                 and exits
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from careful import Careful, RpcError, Stop  # noqa: E402

MODE = os.environ.get("RT43U_MODE", "careful")
TRIAL = os.environ.get("RT43U_TRIAL") or os.path.dirname(os.environ.get("VAULTSIM_TASK", "/x/y"))


def tree(root: str) -> None:
    if not root.startswith("/tmp/vsr"):
        return
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(files) + [d + "/" for d in sorted(dirs)]:
            p = os.path.join(dirpath, name.rstrip("/"))
            try:
                size = os.lstat(p).st_size
            except OSError:
                size = -1
            with open(os.environ.get("RT43U_PROBE", "/dev/null"), "a") as out:
                out.write(f"probe: {p} {size}\n")


def swap(kind: str) -> None:
    peek = os.environ.get("RT43U_PEEK")
    if peek:  # a read the runner's watch of the vault's secret files is there to see
        with open(os.path.join(TRIAL, peek), "rb") as f:
            f.read()
    for pattern in filter(None, os.environ.get("RT43U_FILES", "").split(",")):
        for path in glob.glob(os.path.join(TRIAL, pattern)):
            swap_one(kind, path)


def swap_one(kind: str, path: str) -> None:
    new = path + ".rt43u"
    try:
        if kind == "fifo":
            os.mkfifo(new)
        elif kind == "zero":
            os.symlink("/dev/zero", new)
        elif kind == "text":
            with open(new, "w") as f:
                f.write("vaultsim daemon: stopped; its audit log failed: forged by rt43u\n")
        else:
            with open(new, "wb") as f:
                f.truncate(64 << 30)
        os.replace(new, path)
    except OSError as exc:
        print(f"swap {os.path.relpath(path, TRIAL)}: {exc}", file=sys.stderr)


class X(Careful):
    def extra(self) -> None:
        """One call of the first step's operation with parameters no step gives."""
        step = (self.task.get("steps") or [{}])[0]
        params = {k: (v + " (extra)" if isinstance(v, str) else v) for k, v in (step.get("params") or {}).items()}
        try:
            self.rpc("call", session_id=self.session, operation=step["call"], params=params,
                     idempotency_key=self.key(step) + ":extra", wait_s=max(0.0, self.left() - 1))
        except RpcError:
            pass

    def run(self) -> str:
        if MODE == "probe":
            tree(TRIAL)
        if MODE == "lie_lookup":
            for step in self.task.get("steps") or []:
                self.log(self.rpc("lookup", session_id=self.session, idempotency_key=self.key(step),
                                  operation=step["call"]))
            return "done: " + ", ".join(s["call"] for s in self.task.get("steps") or [])
        return super().run()


def main() -> int:
    agent = X(blocking=True)
    message = agent.run()
    if MODE == "probe":
        tree(TRIAL)
    if MODE == "huge_line":
        sys.stdout.write("done: every step succeeded " + " " * (10 << 20))
        sys.stdout.flush()
        return 0
    if MODE == "extra_then_close":
        print(message, flush=True)
        os.close(1)
        os.close(2)
        agent.extra()
        return 0
    if MODE.startswith("swap_"):
        swap(MODE[len("swap_"):])
    if MODE == "stop_keeper":
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(1.0)
            try:
                a = X(blocking=True)
                a.extra()
            finally:
                os._exit(0)
        print(message, flush=True)
        os.kill(os.getppid(), signal.SIGSTOP)
        return 0
    try:
        agent.rpc("session.close", session_id=agent.session)
    except (RpcError, OSError):
        pass
    print(message, flush=True)
    if MODE == "stop_self":
        os.kill(os.getpid(), signal.SIGSTOP)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Stop as stop:
        print(stop, flush=True)
