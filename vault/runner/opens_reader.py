"""The process that reads the runner's fanotify events (vault.runner.opens).

Why a process of its own: the opener's ancestry must be read from /proc while
the opener still runs, and a shell agent's `cat` lives a millisecond. A thread
of the runner waits for the interpreter lock behind the runner's loop (5 ms
a switch): nearly every `cat` was gone. This process does nothing else.

    python -m vault.runner.opens_reader FD RUNNER_PID
    stdout: one JSON object a line per event
        {"dev", "ino", "pid", "chain", "comm", "host", "mask", "pdev", "pino", "name"}
                                                  an open or write (chain: vault.lineage, at the
                                                  event; host: the opener is in this process's PID
                                                  namespace, i.e. the runner's: in no jail; pdev,
                                                  pino, name: the directory it is in and its name
                                                  there, for a write, watched on a directory's
                                                  children: vault.runner.neighbour_state)
        {"overflow": true}                        the kernel's queue overflowed: events lost
        {"ready": true}                           first: it reads from now on

It exits when its parent (the runner) is gone, or its stdout is.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import sys
from typing import Any

from vault.lineage import lineage

_META = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
FAN_Q_OVERFLOW = 0x4000
FAN_WRITES = 0x2 | 0x8  # FAN_MODIFY, FAN_CLOSE_WRITE: the only events a directory's place is wanted for
PARENT_CHECK_S = 1.0


def main(argv: list[str]) -> int:
    fd, runner = int(argv[0]), int(argv[1])
    with contextlib.suppress(OSError, AttributeError):
        # woken first: the ancestry of a `cat` must be read within the millisecond it lives (root
        # may; it blocks on its fd between events, and the kernel caps a realtime task's share)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    os.set_blocking(fd, False)
    here = _pid_ns("self")
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")  # the runner starts no watch before this
    out.flush()
    while os.getppid() == runner:
        ready, _, _ = select.select([fd], [], [], PARENT_CHECK_S)
        if not ready:
            continue
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            continue
        lines: list[dict[str, Any]] = []
        i = 0
        while i + _META.size <= len(data):
            length, _, _, _, mask, efd, pid = _META.unpack_from(data, i)
            i += max(length, _META.size)
            if mask & FAN_Q_OVERFLOW:
                lines.append({"overflow": True})
            if efd < 0:
                continue
            try:
                # the opener's ancestry first: it may end any moment
                names: list[str] = []
                chain = lineage(pid, names) if pid != runner else []
                # read while the chain was there to read (a gone opener's pid is told nothing)
                host = bool(chain) and here is not None and _pid_ns(str(pid)) == here
                comm = names[0][:40] if names else ""
                st = os.fstat(efd)
                lines.append({"dev": st.st_dev, "ino": st.st_ino, "pid": pid, "chain": chain, "comm": comm,
                              "host": host, "mask": mask, **(_where(efd) if mask & FAN_WRITES else {})})
            except OSError:
                pass
            finally:
                os.close(efd)
        try:
            out.write("".join(json.dumps(line) + "\n" for line in lines))
            out.flush()
        except (BrokenPipeError, OSError):
            return 0
    return 0


def _where(fd: int) -> dict[str, Any]:
    """The directory the file is in (its device and inode) and its name there; {} if gone."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
        parent = os.stat(os.path.dirname(path))
    except OSError:
        return {}
    return {"pdev": parent.st_dev, "pino": parent.st_ino, "name": os.path.basename(path)[:255]}


def _pid_ns(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
