"""Red team, sixth pass: a careful agent that does each step in a worker process of its own.

The parent never opens a session: it splits the task into one-step tasks (references to earlier
steps' data filled in from what the workers reported), and starts rt6_agent.py for each with
its own task file, so every worker opens its own session (contract section 3: "a child opens
its own session"). RT6_WORKERS: seq (one after another) | par (the steps whose inputs are known
run at once, in waves) | fork (os.fork, the child execs the worker). The parent's final message
sums up the workers'. Each worker keeps its own state file in state_dir, so a restart resumes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
MODE = os.environ.get("RT6_WORKERS", "seq")
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def refs(value: object) -> set[str]:
    if isinstance(value, str):
        return {m.group(1) for m in REF.finditer(value)}
    if isinstance(value, dict):
        return set().union(*(refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(refs(v) for v in value)) if value else set()
    return set()


def saved(step_id: str) -> dict:
    try:
        with open(os.path.join(TASK["state_dir"], f"rt6-state-{step_id}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def start(step: dict, done: dict) -> subprocess.Popen | int:
    sub = dict(TASK, steps=[step])
    # the worker resolves ${ID.FIELD} from its own state: give it the data it needs as done steps
    state = saved(step["id"])
    for dep in refs(step.get("params", {})):
        state["done"][dep] = done[dep]
    with open(os.path.join(TASK["state_dir"], f"rt6-state-{step['id']}.json"), "w") as f:
        json.dump(state, f)
    fd, path = tempfile.mkstemp(prefix=f"task-{step['id']}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(sub, f)
    env = dict(os.environ, VAULTSIM_TASK=path, RT6_STATE=f"rt6-state-{step['id']}.json", RT6_EXIT="nonzero")
    argv = [sys.executable, os.path.join(HERE, "rt6_agent.py")]
    if MODE == "fork":
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.dup2(out_w, 1)
            os.close(out_r)
            os.execve(argv[0], argv, env)
        os.close(out_w)
        return (pid, os.fdopen(out_r))
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


STOPPED: list[str] = []


def finish(step: dict, proc: subprocess.Popen | tuple) -> str:
    if isinstance(proc, tuple):
        pid, pipe = proc
        out = pipe.read()
        pipe.close()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    else:
        out, _ = proc.communicate()
        code = proc.returncode
    if code == 4:  # the worker stopped the task (a retry: never, an unknown outcome, ...)
        STOPPED.append(step["id"])
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main() -> int:
    steps = TASK["steps"]
    done: dict[str, dict] = {}
    finals: dict[str, str] = {}
    remaining = list(steps)
    while remaining:
        ready = [s for s in remaining if refs(s.get("params", {})) <= set(done)]
        if not ready:
            break
        if MODE != "par":
            ready = ready[:1]
        running = [(s, start(s, done)) for s in ready]
        for s, proc in running:
            finals[s["id"]] = finish(s, proc)
            remaining.remove(s)
            data = saved(s["id"])["done"].get(s["id"])
            if data is not None:
                done[s["id"]] = data
        if any(f.startswith("waiting") for f in finals.values()):
            break
        if STOPPED:
            break
        if time.time() > TASK["deadline"] - 0.5:
            break
    waits = [f for f in finals.values() if f.startswith("waiting")]
    if waits:
        print(waits[0])
    elif len(done) == len(steps):
        print(f"done: {len(steps)} steps, one worker each")
    else:
        print("not done: " + "; ".join(f"{k}: {v}" for k, v in finals.items() if not v.startswith("done")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
