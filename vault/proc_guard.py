"""Processes that hold secrets keep other processes of the same user out of their memory.

Why: file modes do not separate the vault from an agent running as the same
user. Linux lets a same-user process read another's memory and environment
through `/proc/PID/mem` and `/proc/PID/environ` (and attach with ptrace)
unless the target is *non-dumpable*. `prctl(PR_SET_DUMPABLE, 0)` is what
ssh-agent and gpg-agent do for that reason: afterwards those files (and
`/proc/PID/fd`, `maps`, ...) belong to root, core dumps are off, and only a
process with CAP_SYS_PTRACE (root) can look inside.

Called first thing at the entry of every process that holds a credential, the
approver token or a runner secret: the daemon, the fake remote, the scenario
runner and its fork server, the approvers (`approve`, `lock`/`unlock`,
`stats`, the TUI) and `secret set`. The flag survives fork and is reset by
exec, so a program the runner execs (an agent) is an ordinary process again.

Out of reach of this: root, and a same-user debugger attached *before* the
call (README, threat model).
"""

from __future__ import annotations

import ctypes
import os

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4

_libc = ctypes.CDLL(None, use_errno=True)  # libc is already mapped into the process


def make_undumpable() -> None:
    """Make this process non-dumpable; OSError if the kernel refuses (it never should on Linux)."""
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(err)}")


def make_dumpable() -> None:
    """Undo `make_undumpable` (a forked child that is not a secret holder, e.g. an agent)."""
    if _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE, 1): {os.strerror(err)}")


def is_dumpable() -> bool:
    return bool(_libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
