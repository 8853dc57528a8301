"""Ending what a killed keeper leaves: the orphans the kernel hands to the subreaper above it.

Why: without a jail, a root agent can move a process of its own out of its pids cgroup
(vault.jail.pids) and SIGKILL its keeper. The keeper's children then went to init and outlived the
run (red team 24: named FAIL_DEADLINE, never ended). The kernel re-parents them to the nearest
living subreaper above the keeper instead: the fork server (vault.runner.forkserver), which forks
every keeper, or the guard of a keeper the runner execs (`--no-fork-server`, `guarded` below).
Neither has a child of its own but the ones it started, so any other child was adopted, and is
ended at once.

Only the standard library: the exec'd keeper imports this on its cheap path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Container

PR_SET_CHILD_SUBREAPER = 36  # prctl(2); vault.jail.keeper's too
END_TIMEOUT_S = 5.0  # bound on ending what was adopted (a process stuck in the kernel cannot die)


def become_subreaper() -> bool:
    """Make this process a child subreaper (not inherited by its forks); False where it cannot be."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent, process group) of `pid` while it runs; None once it has ended (a zombie) or is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else (int(fields[1]), int(fields[2]))
    except (OSError, ValueError, IndexError):
        return None


def children() -> set[int]:
    """This process's children (alive or not yet reaped), from /proc."""
    me = os.getpid()
    out: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        return out
    except (OSError, ValueError):  # a kernel without CONFIG_PROC_CHILDREN: every process's parent
        return {int(n) for n in os.listdir("/proc") if n.isdigit() and (_stat(int(n)) or (0,))[0] == me}


def end_adopted(own: Container[int]) -> dict[int, int]:
    """SIGKILL every running child of this process that is not in `own` (an orphan re-parented
    here); return their pids and process groups. Through a pidfd, once it is certain it names a
    child of ours (a pid freed and reused since the listing would name someone else's process).
    Reaping is the caller's."""
    me, ended = os.getpid(), {}
    for pid in children():
        if pid in own:
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        try:
            if (stat := _stat(pid)) is not None and stat[0] == me:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                ended[pid] = stat[1]
        except OSError:
            pass
        finally:
            os.close(fd)
    return ended


def _settle(grace_s: float) -> None:
    """Reap what was adopted as it ends by itself, for up to `grace_s` while any runs."""
    until = time.monotonic() + grace_s
    while time.monotonic() < until:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return  # none left
        if all(_stat(pid) is None for pid in children()):
            return
        time.sleep(0.01)


def guarded(run_keeper: Callable[[], int], forward: tuple[int, ...],
            said: Callable[[int], None] = lambda n: None, grace_s: float = 0.0) -> int:
    """Run `run_keeper` in a forked child (the keeper) below this process made a subreaper; pass
    it the signals in `forward` (the runner's stop, TERM and HUP reach this pid); once it has
    ended, end and reap whatever it left to us, and tell `said` how many of them were running
    outside its process group (when any) after `grace_s`: the keeper's own grace, so that a
    process on its way out (a double fork's middle child, orphaned as its agent died a moment
    before it exited) is not counted as left running;
    return its exit status (-N: killed by signal N)."""
    become_subreaper()
    keeper = os.fork()
    if keeper == 0:
        code = 1
        try:
            code = run_keeper()
        finally:
            os._exit(code & 0xFF if code >= 0 else 128 - code)

    def on_signal(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper, sig)

    for sig in forward:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup'd stays nohup'd
            signal.signal(sig, on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's own (vault.jail.keeper)
    while True:  # handlers run between the retried waits (PEP 475)
        pid, status = os.waitpid(-1, 0)
        if pid == keeper:
            break  # any other was adopted, and has ended
    _settle(grace_s)
    until = time.monotonic() + END_TIMEOUT_S
    ended: dict[int, int] = {}
    while time.monotonic() < until:
        ended |= end_adopted(())
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.002)  # SIGKILLed processes end on their way back to user space
        except ChildProcessError:
            break  # none left
    # the agent itself (its keeper's group, killed as the keeper died) left nothing by being there
    if left := sum(1 for group in ended.values() if group != os.getpgrp()):
        said(left)
    return os.waitstatus_to_exitcode(status)
