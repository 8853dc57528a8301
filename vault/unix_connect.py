"""Connecting to a daemon's Unix socket while its accept queue is full.

A Unix socket whose listen queue is full answers a non-blocking connect with
EAGAIN at once (a blocking one waits for room). Python connects a socket that
has a timeout without blocking, so a client with a timeout was told "no
vaultsim daemon answers (Resource temporarily unavailable)" whenever another
process stormed the daemon with connects, though the daemon was serving. The
queue drains within milliseconds once the storm pauses: retry until the
caller's own timeout, backing off, then say what the last try said.
"""

from __future__ import annotations

import socket
import time

FIRST_PAUSE_S = 0.002
LONGEST_PAUSE_S = 0.1


def connect_unix(path: str, timeout: float | None) -> socket.socket:
    """A stream socket connected to `path`, with `timeout` set; retries a full accept queue."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = FIRST_PAUSE_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            if deadline is not None and time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)
        except BaseException:
            sock.close()
            raise
