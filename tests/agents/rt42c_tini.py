#!/usr/bin/env python3
"""A tini-like supervisor users put in front of an agent: forks it, forwards signals, reaps every
child, exits with the agent's status (red team 42c). It restarts nothing."""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    argv = sys.argv[1:]
    pid = os.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if got == pid:
            return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
