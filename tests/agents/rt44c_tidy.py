"""Red team 44c: an agent that keeps its own progress files and logs, and tidies up (stdlib).

Written from docs/agent-contract.md alone, as an ops team writes a batch job:
* a lock file (fcntl.flock) and a pid file in state_dir while it runs;
* a progress file in state_dir (`progress.json`, replaced by a rename within state_dir) rewritten
  after every step and by a heartbeat thread every half second;
* a scratch directory in $TMPDIR (tempfile.mkdtemp) holding a debug log (logging.FileHandler) and
  a copy of each answer's category, and a run log in state_dir/logs/;
* the work itself through rt44c_lib's Runner, one step at a time;
* at exit (atexit and a `finally`): the heartbeat stopped, the scratch directory removed, the
  lock, pid and progress files removed, the run log kept only when the task is not done (for a
  person to read), the journal kept for a restart (section 8).
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402


class Progress:
    def __init__(self, state_dir: str, steps: int) -> None:
        self.path = os.path.join(state_dir, "progress.json")
        self.doc: dict[str, Any] = {"pid": os.getpid(), "steps": steps, "done": 0, "current": None,
                                    "started": time.time()}
        self.mu = threading.Lock()
        self.stopped = threading.Event()
        self.beat = threading.Thread(target=self._heartbeat, daemon=True)

    def write(self, **fields: Any) -> None:
        with self.mu:
            if self.stopped.is_set():
                return
            self.doc.update(fields, heartbeat=time.time())
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.doc, f)
            os.replace(tmp, self.path)

    def _heartbeat(self) -> None:
        while not self.stopped.wait(0.5):
            self.write()

    def stop(self) -> None:
        with self.mu:
            self.stopped.set()
        self.beat.join(timeout=1)


def main() -> int:
    task = lib.load_task()
    state_dir = task["state_dir"]
    os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="rt44c-tidy-")
    lock_path, pid_path = os.path.join(state_dir, "agent.lock"), os.path.join(state_dir, "agent.pid")
    run_log = os.path.join(state_dir, "logs", f"run-{os.getpid()}.log")

    log = logging.getLogger("tidy")
    log.setLevel(logging.DEBUG)
    for h, level in ((logging.FileHandler(os.path.join(scratch, "debug.log")), logging.DEBUG),
                     (logging.FileHandler(run_log), logging.INFO), (logging.StreamHandler(sys.stderr), logging.INFO)):
        h.setLevel(level)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(h)

    lock = open(lock_path, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(pid_path, "w") as f:
        f.write(f"{os.getpid()}\n")
    progress = Progress(state_dir, len(task.get("steps") or []))
    final = {"text": "not done: stopped before it began"}

    def tidy() -> None:
        progress.stop()
        for h in list(log.handlers):
            h.close()
            log.removeHandler(h)
        shutil.rmtree(scratch, ignore_errors=True)
        for p in (progress.path, progress.path + ".tmp", pid_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        os.unlink(lock_path)
        if final["text"].startswith("done"):
            shutil.rmtree(os.path.join(state_dir, "logs"), ignore_errors=True)

    atexit.register(lambda: None)  # the tidy runs in `finally`; atexit only keeps order visible
    try:
        progress.write()
        progress.beat.start()
        answers = open(os.path.join(scratch, "answers.txt"), "a", encoding="utf-8")

        def note(line: str) -> None:
            log.debug(line)
            answers.write(line + "\n")
            answers.flush()

        runner = lib.Runner(task, client="rt44c-tidy", log=note)
        count = {"n": 0}

        def before(step: dict[str, Any]) -> None:
            log.info("step %s (%s) starts", step["id"], step["call"])
            progress.write(current=step["id"], done=sum(1 for v in runner.outcome.values() if v == "done"))
            count["n"] += 1

        final["text"] = runner.run_all(before)
        progress.write(current=None, done=sum(1 for v in runner.outcome.values() if v == "done"))
        runner.close()
        answers.close()
        log.info("finished: %s", final["text"].split(":", 1)[0])
    except lib.Finish as f:
        final["text"] = str(f)
    finally:
        tidy()
    print(final["text"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
