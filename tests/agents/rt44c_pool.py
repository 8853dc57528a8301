"""Red team 44c: a multiprocessing.Pool agent with a health-check thread (stdlib).

Written from docs/agent-contract.md alone, as a data team writes a job:
* the main process opens its session first, then starts a health thread that asks `vault.status`
  on a connection of its own every 0.5 s (no session: status needs none) and stops before exit;
* then a `multiprocessing.Pool(3)` (the platform's default start method: fork on Linux before Python 3.14,
  so the workers inherit the main connection's descriptor and never use it); each worker opens its own
  connection and session in the pool's initializer (section 3: a child opens its own);
* consecutive steps of `auto`, non-mutating operations that name no result of the run and are
  not alike are mapped onto the pool side by side; every other step (gated, mutating) the main
  process does itself, in order, so its session holds the grants (section 3);
* a `never` answer or an unknown outcome in a worker stops the task: nothing more is handed out;
* the pool is closed and joined (`with` ends it), the health thread stopped, the session closed,
  then the final message printed.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402

_worker: lib.Runner | None = None


def _init(task: dict[str, Any]) -> None:
    global _worker
    try:
        _worker = lib.Runner(task, client="rt44c-pool-worker",
                             journal=lib.Journal(task["state_dir"], "rt44c-pool-init.json"),
                             log=lambda s: print(f"[pool:{os.getpid()}] {s}", file=sys.stderr, flush=True))
    except lib.Finish:      # too late to open a session: the worker answers "failed" (a raise
        _worker = None      # here would have the pool start workers again and again)


def _read(job: tuple[dict[str, Any], dict[str, Any]]) -> tuple[str, str, Any]:
    step, results = job
    if _worker is None:
        return step["id"], "failed", None
    _worker.journal = lib.Journal(_worker.task["state_dir"],
                                  "rt44c-pool-" + hashlib.sha256(step["id"].encode()).hexdigest()[:16] + ".json")
    _worker.results.update(results)
    try:
        got = _worker.run_step(step)
        return step["id"], got, _worker.results.get(step["id"])
    except lib.Finish as f:
        return step["id"], "stop", str(f)


class Health(threading.Thread):
    def __init__(self, deadline: float) -> None:
        super().__init__(daemon=True)
        self.vault = lib.Vault(os.environ["VAULTSIM_SOCKET"], deadline)
        self.halt = threading.Event()
        self.locked: bool | None = None

    def run(self) -> None:
        while not self.halt.wait(0.5):
            try:
                self.locked = bool(self.vault.rpc("vault.status").get("locked"))
            except (lib.Finish, lib.VaultError, OSError):
                return

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=2)
        self.vault.close()


def main() -> int:
    task = lib.load_task()
    try:
        runner = lib.Runner(task, client="rt44c-pool")
    except lib.Finish as f:
        print(f, flush=True)
        return 0
    # a restart's finished steps, kept by workers in files of their own
    for name in os.listdir(task["state_dir"]):
        if name.startswith("rt44c-pool-") and name.endswith(".json"):
            for sid, rec in lib.Journal(task["state_dir"], name).data["steps"].items():
                if "data" in rec:
                    runner.results[sid], runner.outcome[sid] = rec["data"], "done"
    health = Health(runner.deadline)
    health.start()
    ops = {o.get("name"): o for o in runner.vault.rpc("catalog").get("operations") or [] if isinstance(o, dict)}

    def batchable(s: dict[str, Any]) -> bool:
        op = ops.get(s["call"]) or {}
        return (op.get("approval") or {}).get("mode") == "auto" and op.get("mutates") is False

    steps = task.get("steps") or []
    stop: str | None = None
    with multiprocessing.Pool(3, initializer=_init, initargs=(task,)) as pool:
        try:
            i = 0
            while i < len(steps) and stop is None and not runner.waiting:
                s = steps[i]
                if runner.outcome.get(s["id"]) == "done":
                    i += 1
                    continue
                if any(runner.outcome.get(r) != "done" for r in lib.refs(s.get("params"))):
                    runner.outcome[s["id"]] = "failed"
                    i += 1
                    continue
                if not batchable(s):
                    runner.run_step(s)
                    i += 1
                    continue
                group = [s]
                i += 1
                while i < len(steps) and batchable(steps[i]) and runner.outcome.get(steps[i]["id"]) != "done":
                    t = steps[i]
                    if lib.refs(t.get("params")) & {g["id"] for g in group} or any(
                            g["call"] == t["call"] and g.get("params") == t.get("params") for g in group):
                        break
                    group.append(t)
                    i += 1
                jobs = [(g, {r: runner.results[r] for r in lib.refs(g.get("params")) if r in runner.results})
                        for g in group]
                for sid, got, data in pool.map(_read, jobs):
                    if got == "stop":
                        stop = stop or str(data)
                        runner.outcome[sid] = "failed"
                    else:
                        runner.outcome[sid] = got
                        if got == "done":
                            runner.results[sid] = data or {}
            final = stop or runner.message()
        except lib.Finish as f:
            final = str(f)
        pool.close()
        pool.join()
    health.stop()
    runner.close()
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
