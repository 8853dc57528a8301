"""Which stop signals a long-running command catches.

A signal ignored when the process started stays ignored, as for any Unix
program: `nohup` ignores SIGHUP (the command outlives its terminal), a
script's `cmd &` job ignores SIGINT (the terminal's Ctrl-C is not its own).
SIGTERM is always caught: it is how `vaultsim stop`, the runner and service
managers stop a process cleanly, and no launcher ignores it on purpose.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def caught(signals: tuple[signal.Signals, ...] = STOP_SIGNALS, *,
           keep_term: bool = True) -> list[signal.Signals]:
    """The signals of `signals` not ignored at start (SIGTERM always, unless `keep_term` is False).
    Read before any handler of ours is installed: it asks the current disposition."""
    return [sig for sig in signals
            if (keep_term and sig == signal.SIGTERM) or signal.getsignal(sig) is not signal.SIG_IGN]
