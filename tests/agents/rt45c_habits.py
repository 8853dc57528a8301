"""Red team 45c: a careful agent with an ops team's habits (stdlib), from docs/agent-contract.md.

* config from $XDG_CONFIG_HOME/rt45c/agent.json, else ~/.config/rt45c/agent.json (absent is fine;
  it may set `blocking` and `log_bytes`);
* a lock file (fcntl.flock) and a pid file in state_dir while it runs;
* its own log in state_dir/logs rotated by size (logging.handlers.RotatingFileHandler: renames
  inside state_dir only, section 1);
* atexit and SIGTERM handlers that tidy up (SIGTERM turns into a clean `not done` exit);
* a scratch dir from tempfile.mkdtemp ($TMPDIR, the jail's private /tmp), removed with
  shutil.rmtree as it exits;
* `git --version`, `uname -a` and `date` run for its diagnostics (waited for: none left behind);
* the steps through rt45c_lib's Runner, one at a time; the journal kept for a restart (8).
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import logging.handlers
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt45c_lib as lib  # noqa: E402


def config() -> dict[str, Any]:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    try:
        doc = json.loads(Path(base, "rt45c", "agent.json").read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def diagnostics(log: logging.Logger, scratch: str) -> None:
    for cmd in (["git", "--version"], ["uname", "-a"], ["date", "-u"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=3, stdin=subprocess.DEVNULL)
            line = (out.stdout or out.stderr).strip().splitlines()[:1]
            log.info("diag %s: %s", cmd[0], line[0] if line else f"exit {out.returncode}")
        except (OSError, subprocess.TimeoutExpired) as e:
            log.info("diag %s unavailable: %s", cmd[0], type(e).__name__)
    Path(scratch, "diag.txt").write_text("diagnostics taken\n")


class Tidy:
    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        os.makedirs(state_dir, exist_ok=True)
        self.lock_path = os.path.join(state_dir, "agent.lock")
        self.pid_path = os.path.join(state_dir, "agent.pid")
        self.lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        tmp = self.pid_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, self.pid_path)
        self.scratch = tempfile.mkdtemp(prefix="rt45c-habits-")
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        shutil.rmtree(self.scratch, ignore_errors=True)
        for p in (self.pid_path, self.lock_path):
            try:
                os.unlink(p)
            except OSError:
                pass
        try:
            os.close(self.lock_fd)
        except OSError:
            pass


class Terminated(Exception):
    pass


def main() -> int:
    task = lib.load_task()
    cfg = config()
    tidy = Tidy(task["state_dir"])
    atexit.register(tidy)

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated()
    signal.signal(signal.SIGTERM, on_term)

    logdir = os.path.join(task["state_dir"], "logs")
    os.makedirs(logdir, exist_ok=True)
    log = logging.getLogger("rt45c.habits")
    log.setLevel(logging.INFO)
    handler = logging.handlers.RotatingFileHandler(os.path.join(logdir, "agent.log"),
                                                   maxBytes=int(cfg.get("log_bytes", 2048)), backupCount=3)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.info("start pid %d agent %s (%d steps)", os.getpid(), task["agent"], len(task.get("steps") or []))
    diagnostics(log, tidy.scratch)

    message = "not done: did not start"
    runner: lib.Runner | None = None
    try:
        runner = lib.Runner(task, client="rt45c-habits", blocking=bool(cfg.get("blocking", True)),
                            log=lambda s: log.info("%s", s))
        message = runner.run_all()
    except Terminated:
        message = "not done: stopped by SIGTERM"
    except lib.Finish as f:
        message = str(f)
    finally:
        if runner is not None:
            runner.close()
        log.info("final: %s", message)
        handler.close()
        tidy()
    print(message, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
