"""A runner's backstop for its trial directories when it dies without removing them.

Why: a runner that ends by `os._exit` (pytest-timeout's thread method, which calls it from its
timer thread mid-test), SIGKILL or the OOM killer runs no teardown: the pytest plugin's world
directory (its vault home, keyring and credential files) stayed behind, and without the fork
server the world's daemon and fake remote kept running. The reaper is a small process of its own
(stdlib only, its own session, deaf to the terminal's and a CI job's signals) that the Registry
tells, one JSON line each, which directories and process groups are live; when its stdin ends (the
runner's end of the pipe closes, however the runner ended) it ends the groups still listed (TERM,
then KILL a second later) and removes the directories still listed. A runner that cleans up itself
has taken everything off the list first, so the reaper then does nothing.

    runner -> reaper   ["+d", PATH] | ["-d", PATH] | ["+g", PGID] | ["-g", PGID]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

_MAIN = r'''
import json, os, shutil, signal, subprocess, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
groups, dirs = set(), set()
ops = {"+g": groups.add, "-g": groups.discard, "+d": dirs.add, "-d": dirs.discard}
for line in sys.stdin:
    try:
        op, what = json.loads(line)
        ops[op](what)
    except (ValueError, KeyError, TypeError):
        continue
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except OSError:
        return False
for g in groups:
    try:
        os.killpg(g, signal.SIGTERM)
    except OSError:
        pass
end = time.monotonic() + 1.0
while time.monotonic() < end and any(alive(g) for g in groups):
    time.sleep(0.02)
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
    if os.path.lexists(d):  # deeper than rmtree recurses
        subprocess.run(["rm", "-rf", "--", d], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
'''


class Reaper:
    """The runner's side: started on first use, told each change; never raises."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # the engine's loop thread and the main thread both tell
        self._pid = os.getpid()
        self._closed = False

    def tell(self, op: str, what: Any) -> None:
        line = (json.dumps([op, what]) + "\n").encode()
        with self._lock:
            if os.getpid() != self._pid or self._closed:
                return  # a forked child (the fork server's) is not the runner
            try:
                if self._proc is None:
                    self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _MAIN], stdin=subprocess.PIPE,
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                  start_new_session=True)
                assert self._proc.stdin is not None
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except (OSError, ValueError):
                pass  # without the backstop, cleaning up is the runner's alone, as before

    def close(self) -> None:
        """The runner cleaned up itself: the reaper ends now (with nothing listed, it does nothing),
        not after the runner, where it would look like a process the run left behind."""
        with self._lock:
            proc, self._proc, self._closed = self._proc, None, True
            if proc is None or os.getpid() != self._pid:
                return
            try:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
