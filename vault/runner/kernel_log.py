"""Without a jail, what an agent wrote into the kernel's log (/dev/kmsg; `dmesg` shows it).

Why: an unjailed agent running as root wrote a line holding its credential to /dev/kmsg (as a
program logs through it when there is no syslog) and passed: the line stays in the kernel's ring
buffer after every process has ended, and `dmesg` shows it to root, or to every user where
`kernel.dmesg_restrict` is 0. In a jail /dev is the jail's own (bwrap `--dev`): no /dev/kmsg.

The whole buffer is read (each read of /dev/kmsg is one record; it holds at most a few MiB),
not only the records made during the trial: only this trial's credentials are looked for, so
another process's lines cannot fail it. Where the runner may not read it, nothing is read.
"""

from __future__ import annotations

import contextlib
import os

KMSG = "/dev/kmsg"
RECORD = 8192  # a record is at most about 1 KiB of text; a smaller buffer fails the read (EINVAL)
BYTES_MOST = 16 << 20
RECORDS_MOST = 200_000


def left() -> dict[str, bytes]:
    """"the kernel's log" -> the text of its records, one a line; nothing where it cannot be read."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    lines: list[bytes] = []
    size = 0
    try:
        for _ in range(RECORDS_MOST):
            try:
                record = os.read(fd, RECORD)
            except BlockingIOError:
                break  # the newest record read
            except BrokenPipeError:
                continue  # overwritten while read: the next one
            except OSError:
                break
            if not record:
                break
            # "PRIORITY,SEQ,USEC,FLAGS;text\n" then " KEY=value" lines: the text, escaped as \\xNN
            _, _, text = record.partition(b";")
            lines.append(text)
            size += len(text)
            if size >= BYTES_MOST:
                break
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return {"the kernel's log (dmesg)": b"".join(lines)} if lines else {}
