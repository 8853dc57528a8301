#!/usr/bin/env python3
"""A careful agent that drives its steps from a Makefile (`make -j2`), written from
docs/agent-contract.md alone.

The planner (this process) reads the task and the vault's `catalog` (to know which operations are
`auto`), writes a Makefile in $TMPDIR and runs `make -s -j2` on it. Reads of `auto` operations that
no step refers to and that refer to none fan out first, a target and a short process each (a
session of its own); everything else goes to one `lane` target, one process with one session
doing its steps in order, so a session grant covers the later calls of its scope (section 3: a
process per gated step would ask the owner again). A helper that was told to stop exits non-zero,
so make starts nothing after it. The helpers share rt48c_planner.py's careful step (key
RUN:AGENT:STEP on every send, a lookup before anything after an unknown outcome, approvals
resumed until the deadline and then handed over) and keep their state in state_dir, a file each;
the planner reads those files when make is done and prints a `done: 2/2`-style counter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rt48c_planner import REF, Executor, Vault, refs, resolve  # noqa: E402

STOP, WAIT = 3, 4


def helper(which: str) -> int:
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    steps = task["steps"]
    free = set(json.loads(os.environ["RT48C_FREE"]))
    mine = [s for s in steps if s["id"] == which] if which != "lane" else [s for s in steps if s["id"] not in free]
    index = f"lane" if which == "lane" else f"s{[s['id'] for s in steps].index(which)}"
    ex = Executor(task, set(), index)  # type: ignore[arg-type]
    results = {sid: e.get("data") or {} for sid, e in ex.state.items() if e.get("done")}
    code = 0
    for st in mine:
        if any(r not in results for r in refs(st.get("params"))):
            code = STOP  # what it needs did not succeed: stop here
            break
        rep = ex.do(st, resolve(st.get("params") or {}, results))
        print(f"# {st['id']} {st['call']}: {rep['outcome']} {rep.get('why') or ''}", file=sys.stderr)
        if rep["outcome"] == "done":
            results[st["id"]] = rep.get("data") or {}
        elif rep["outcome"] == "waiting":
            code = WAIT
            break
        elif rep["outcome"] == "stop":
            code = STOP
            break
    ex.vault.rpc("session.close", {"session_id": ex.sid})
    return code


def plan() -> int:
    with open(os.environ["VAULTSIM_TASK"]) as f:
        task = json.load(f)
    steps = task["steps"]
    deadline = float(task["deadline"])
    v = Vault(os.environ["VAULTSIM_SOCKET"], deadline)
    ops = (v.rpc("catalog").get("result") or {}).get("operations") or []
    v.sock.close()
    modes = {o.get("name"): (o.get("approval") or {}).get("mode") for o in ops}
    referenced = {r for s in steps for r in refs(s.get("params"))}
    alike: dict[str, int] = {}
    for s in steps:
        sig = json.dumps([s["call"], s.get("params")], sort_keys=True)
        alike[sig] = alike.get(sig, 0) + 1
    free = [s["id"] for s in steps
            if modes.get(s["call"]) == "auto" and not refs(s.get("params")) and s["id"] not in referenced
            and alike[json.dumps([s["call"], s.get("params")], sort_keys=True)] == 1]
    here = os.path.abspath(__file__)
    work = tempfile.mkdtemp(prefix="rt48c-make-")
    mk = os.path.join(work, "Makefile")
    names = {sid: f"s{[s['id'] for s in steps].index(sid)}" for sid in free}
    lane_needed = len(free) < len(steps)
    with open(mk, "w") as f:
        f.write(f"PY := {sys.executable}\nHELPER := {here}\n.PHONY: all lane {' '.join(names.values())}\n")
        f.write(f"all: {'lane' if lane_needed else ' '.join(names.values())}\n")
        if lane_needed:
            # the free reads first: once the lane starts no other process of ours sends anything
            f.write(f"lane: {' '.join(names.values())}\n\t@$(PY) $(HELPER) --helper lane\n")
        for sid, name in names.items():
            f.write(f"{name}:\n\t@$(PY) $(HELPER) --helper '{sid}'\n")
    env = {**os.environ, "RT48C_FREE": json.dumps(free)}
    try:
        subprocess.run(["make", "-s", "-j2", "-f", mk], env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, timeout=max(1.0, deadline - time.time() - 0.3))
    except subprocess.TimeoutExpired:
        pass  # every helper keeps to the deadline itself; make is gone, the report follows
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)
    # what the helpers left in state_dir: the furthest state of each step
    state: dict[str, Any] = {}
    rank = {"done": 4, "ended": 3, "token": 2, "intent": 1}
    for name in sorted(os.listdir(task["state_dir"])):
        if name.startswith("executor-") and name.endswith(".json"):
            try:
                with open(os.path.join(task["state_dir"], name)) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            for sid, e in doc.items():
                lv = max((rank[k] for k in e if k in rank), default=0)
                if lv > max((rank[k] for k in state.get(sid, {}) if k in rank), default=0):
                    state[sid] = e
    done = [s["id"] for s in steps if state.get(s["id"], {}).get("done")]
    waits = [s for s in steps if "token" in state.get(s["id"], {}) and not state[s["id"]].get("done")]
    ended = [s["id"] for s in steps if state.get(s["id"], {}).get("ended")]
    for s in steps:
        e = state.get(s["id"], {})
        word = "done" if e.get("done") else "ended" if e.get("ended") else "waiting" if "token" in e \
            else "sent, no answer kept" if "intent" in e else "not started"
        print(f"  {s['id']} ({s['call']}): {word}")
    n = len(steps)
    if len(done) == n:
        print(f"done: {n}/{n}")
    elif waits and not ended:
        print(f"waiting: {len(done)}/{n}, {waits[0]['call']} ({waits[0]['id']}) awaits a person's approval")
    else:
        print(f"not done: {len(done)}/{n}" + (f", stopped at {ended[0]}" if ended else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--helper":
        sys.exit(helper(sys.argv[2]))
    _ = REF
    sys.exit(plan())
