"""Red team 44c: a coordinator and subprocess workers, each worker with its own session (stdlib).

Written from docs/agent-contract.md alone. The coordinator opens no session: it reads the task
and the vault's `catalog` (no session needed), then hands steps to workers over pipes (one JSON
line each way; a worker's stdout is its answer channel, its stderr the agent's log):
* one long-lived "main" worker (`python3 THIS --worker main`) takes every gated or mutating step,
  in order, each once the one before settled, so its one session holds the grants (section 3);
* consecutive steps of `auto`, non-mutating operations that name no result of the group and are
  not alike go to short-lived "read" workers (`--worker read`), up to three side by side, each
  with a session of its own (section 3: a child opens its own; none is ever handed on).
A worker keeps its journal in state_dir (the main worker one file, a read worker one per step), so
a restart resumes and looks up as section 8 says. A `never` answer, an unknown outcome or a wait
handed over stops the dispatch (section 4); the coordinator waits for every worker to exit before
it prints the final message. SIGTERM: the coordinator stops dispatching and forwards it; a worker
finishes its current request and exits; the final message says `not done: stopped`.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402

THIS = os.path.abspath(__file__)
TERM = threading.Event()


def worker(kind: str) -> int:
    """Serve steps read from stdin, one JSON line each, answering one line each on stdout."""
    signal.signal(signal.SIGTERM, lambda *_: TERM.set())
    task = lib.load_task()
    out = sys.stdout
    runner: lib.Runner | None = None
    for line in sys.stdin:
        job = json.loads(line)
        step = job["step"]
        name = "rt44c-coord-main.json" if kind == "main" else \
            "rt44c-coord-" + hashlib.sha256(step["id"].encode()).hexdigest()[:16] + ".json"
        try:
            if runner is None:
                runner = lib.Runner(task, client=f"rt44c-coord-{kind}", journal=lib.Journal(task["state_dir"], name),
                                    log=lambda s: print(f"[coord:{kind}:{os.getpid()}] {s}", file=sys.stderr, flush=True))
            runner.results.update(job["results"])
            got = runner.run_step(step)
            answer = {"id": step["id"], "outcome": got, "data": runner.results.get(step["id"]),
                      "why": "; ".join(runner.waiting) if got == "waiting" else ""}
        except lib.Finish as f:
            answer = {"id": step["id"], "outcome": "stop", "why": str(f)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if TERM.is_set():
            break
    if runner is not None:
        runner.close()
    return 0


class Coordinator:
    def __init__(self) -> None:
        self.task = lib.load_task()
        self.steps: list[dict[str, Any]] = list(self.task.get("steps") or [])
        self.results: dict[str, Any] = {}
        self.outcome: dict[str, str] = {}
        self.why: list[str] = []
        self.main: subprocess.Popen[str] | None = None
        self.children: set[subprocess.Popen[str]] = set()
        self.mu = threading.Lock()
        vault = lib.Vault(os.environ["VAULTSIM_SOCKET"], float(self.task["deadline"]))
        try:
            cat = vault.rpc("catalog")
        finally:
            vault.close()
        self.ops = {o.get("name"): o for o in cat.get("operations") or [] if isinstance(o, dict)}
        # a predecessor's finished steps, from the workers' journals
        for name in sorted(os.listdir(self.task["state_dir"])) if os.path.isdir(self.task["state_dir"]) else []:
            if name.startswith("rt44c-coord-") and name.endswith(".json"):
                for sid, rec in lib.Journal(self.task["state_dir"], name).data["steps"].items():
                    if "data" in rec:
                        self.results[sid], self.outcome[sid] = rec["data"], "done"

    def batchable(self, step: dict[str, Any]) -> bool:
        op = self.ops.get(step["call"]) or {}
        return (op.get("approval") or {}).get("mode") == "auto" and op.get("mutates") is False

    def spawn(self, kind: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, THIS, "--worker", kind], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        with self.mu:
            self.children.add(p)
        return p

    def ask(self, p: subprocess.Popen[str], step: dict[str, Any]) -> dict[str, Any]:
        needs = {r: self.results[r] for r in lib.refs(step.get("params")) if r in self.results}
        assert p.stdin and p.stdout
        p.stdin.write(json.dumps({"step": step, "results": needs}) + "\n")
        p.stdin.flush()
        line = p.stdout.readline()
        if not line:
            return {"id": step["id"], "outcome": "stop", "why": f"not done: the worker for {step['id']} died"}
        ans: dict[str, Any] = json.loads(line)
        return ans

    def read_worker(self, step: dict[str, Any]) -> dict[str, Any]:
        p = self.spawn("read")
        try:
            return self.ask(p, step)
        finally:
            assert p.stdin
            p.stdin.close()
            p.wait()
            with self.mu:
                self.children.discard(p)

    def take(self, ans: dict[str, Any]) -> bool:
        """Keep one answer; False when the task must stop."""
        self.outcome[ans["id"]] = ans["outcome"]
        if ans["outcome"] == "done":
            self.results[ans["id"]] = ans.get("data") or {}
        if ans["outcome"] in ("stop", "waiting"):
            self.why.append(ans.get("why") or "")
            return False
        return True

    def runnable(self, step: dict[str, Any]) -> bool:
        missing = [r for r in lib.refs(step.get("params")) if r not in self.results]
        if missing:
            self.outcome[step["id"]] = "failed"
        return not missing

    def run(self) -> str:
        i, going = 0, True
        with ThreadPoolExecutor(max_workers=3) as pool:
            while i < len(self.steps) and going and not TERM.is_set():
                step = self.steps[i]
                if self.outcome.get(step["id"]) == "done":
                    i += 1
                    continue
                if self.batchable(step):
                    group = [step]
                    i += 1
                    while i < len(self.steps) and self.batchable(self.steps[i]):
                        s = self.steps[i]
                        if lib.refs(s.get("params")) & {g["id"] for g in group} or any(
                                g["call"] == s["call"] and g.get("params") == s.get("params") for g in group):
                            break
                        group.append(s)
                        i += 1
                    todo = [s for s in group if self.outcome.get(s["id"]) != "done" and self.runnable(s)]
                    for ans in pool.map(self.read_worker, todo):
                        going = self.take(ans) and going
                    continue
                i += 1
                if not self.runnable(step):
                    continue
                if self.main is None:
                    self.main = self.spawn("main")
                going = self.take(self.ask(self.main, step))
        self.shutdown()
        if TERM.is_set():
            return "not done: stopped (SIGTERM) before the task was finished"
        if self.why:
            return self.why[0] if self.why[0].startswith("not done") else "waiting: " + self.why[0] + \
                " (resume token kept in state_dir)"
        undone = [s["id"] for s in self.steps if self.outcome.get(s["id"]) != "done"]
        return f"not done: {', '.join(undone)} did not succeed" if undone else \
            f"done: {len(self.steps)} steps by {1 + len(self.steps)} processes at most"

    def shutdown(self) -> None:
        if self.main is not None and self.main.stdin:
            self.main.stdin.close()
            self.main.wait()

    def on_term(self, *_: Any) -> None:
        TERM.set()
        with self.mu:
            for p in self.children:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    coord = Coordinator()
    signal.signal(signal.SIGTERM, coord.on_term)
    print(coord.run(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
