"""The daemon that holds a home's lock but answers on none of its sockets: who, and why.

`status` and `stop` use this when no socket answers. The holder is known from the kernel's
lock table (instance.lock_holder); it is taken for a vaultsim daemon only when the home's pid
file names it (every daemon writes it right after taking the lock, however it was started:
one forked by the runner's fork server has the server's command line, with no "daemon" word)
or its command line is `vaultsim daemon`. Why it does not answer:

* ``stopped``: SIGSTOPped (or held by a debugger): it answers nothing until continued;
* ``starting``: it listens on neither of its socket paths yet (it is still starting up:
  a keyring to unlock, an audit log to recover);
* ``stopping``: it listens there no more, on its way out (calls settling, its log being
  signed): the daemon names itself so (instance.STOPPING_COMM) when it begins to stop;
* ``cut off``: it listens there, but the socket files were removed or replaced.

Decided from the kernel's tables (/proc/PID/stat via psutil, /proc/net/unix), without
connecting: a stopped daemon would hold a client for its whole timeout.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal

from vault.home import VaultHome

State = Literal["stopped", "starting", "stopping", "cut off"]

_ACCEPTCON = 0x10000  # /proc/net/unix Flags: a listening socket
_PID_FILE_WAIT_S = 1.0  # between taking the lock and writing the pid file: moments


@dataclass(frozen=True)
class HeldBy:
    pid: int
    state: State

    def why(self, what: str = "it") -> str:
        """Why it answers nothing; `what` names the home (`it` after "no daemon serves HOME")."""
        if self.state == "stopped":
            return (f"daemon pid {self.pid} holds {what} and is stopped (SIGSTOP or a debugger) and answers "
                    f"nothing until continued (`kill -CONT {self.pid}`); `vaultsim stop` stops it")
        if self.state == "starting":
            return (f"daemon pid {self.pid} holds {what} and is still starting (not listening on its sockets "
                    "yet); try again in a moment")
        if self.state == "stopping":
            return (f"daemon pid {self.pid} holds {what} and is stopping (its calls settling, its audit log "
                    "being signed); it will be gone in a moment")
        return (f"daemon pid {self.pid} holds {what} and answers on no socket (its socket files were "
                "removed or replaced); `vaultsim stop` stops it")


def held_by(home: VaultHome, wait_s: float = _PID_FILE_WAIT_S) -> HeldBy | None:
    """The vaultsim daemon holding `home` and why it does not answer; None when there is none.
    `wait_s`: how long a holder not named yet by the pid file may take to write it."""
    import psutil

    from vault.daemon.instance import live_pid, lock_holder
    pid = lock_holder(home)
    if pid is None or pid == os.getpid():
        return None
    deadline = time.monotonic() + wait_s
    while live_pid(home) != pid and not _called_daemon(pid):
        if time.monotonic() > deadline or lock_holder(home) != pid:
            return None  # only a vaultsim daemon is named (and stopped), never another process
        time.sleep(0.02)
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return None
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return HeldBy(pid, "stopped")
    from vault.daemon.instance import is_stopping
    if is_stopping(pid):
        return HeldBy(pid, "stopping")
    return HeldBy(pid, "cut off" if _listening(home) else "starting")


def _called_daemon(pid: int) -> bool:
    import psutil
    try:
        words = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "daemon" in words and any("vault" in w for w in words)


def _listening(home: VaultHome) -> bool:
    """Is a socket listening at one of the home's socket paths (its file there or not)?"""
    names = {home.agent_sock.name, home.approver_sock.name}
    try:
        root = os.path.realpath(home.root)
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read(64 << 20).splitlines()[1:]
    except OSError:
        return True  # cannot tell: the older answer (cut off) stands
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) < 8 or not int(fields[3], 16) & _ACCEPTCON:
            continue
        path = fields[7]
        if os.path.basename(path) in names and (
                path in (str(home.agent_sock), str(home.approver_sock))
                or os.path.realpath(os.path.dirname(path)) == root):
            return True
    return False
