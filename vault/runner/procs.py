"""Processes and temporary homes the runner starts, and how they always end.

Every process is started in its own session (its pid is its process group),
so ending it ends whatever it started (the daemon's ssh clients, an agent's
child). `Registry` remembers every live group and every temporary trial
directory; `reap()` ends and removes them. The CLI calls it from a signal
handler path and from `finally`, so Ctrl-C, a crashed agent or a runner bug
leaves no process and no vault home behind.

Two launchers share one interface: `ExecLauncher` (a plain fork+exec, for any
command) and the fork server in `vault.runner.forkserver` (daemon and
agent_stub processes forked from a pre-imported interpreter; still real,
separate, fresh processes, just without paying the import cost every time).
Either starts an agent under a keeper (vault.jail.keeper), the agent's parent,
which runs no agent code: in its jail when given one (`jail=`, a
vault.jail.JailSpec), else as a subreaper (`keep=`, the keeper's report
file). The fork server makes its forked child the keeper, `ExecLauncher`
starts `python -m vault.jail`. The pid either returns is the keeper's; its
group ends both, and the keeper ends whatever the agent left elsewhere,
counting what left the group (`read_left_running`). At a deadline
`stop_agent` asks the keeper to do that at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vault.runner.thaw import thaw_group


class Proc(Protocol):
    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class Launcher(Protocol):
    async def spawn(self, kind: str, args: list[str], *, env: dict[str, str], cwd: str, stdout: Path,
                    stderr: Path, jail: Any = None, keep: str | None = None) -> Proc: ...

    async def aclose(self) -> None: ...


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop_agent(proc: Proc, timeout: float = 5.0) -> None:
    """An agent past its deadline: its keeper kills it and everything it started at once, and
    reports what had left its group. A keeper that does not end in time (stopped by the agent,
    which runs as the same user) is killed with its group."""
    from vault.jail.keeper import STOP_SIGNAL

    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, STOP_SIGNAL)
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        kill_group(proc.pid, signal.SIGKILL)
        # a frozen process does not die of SIGKILL until thawed: the agent may have frozen its keeper
        await asyncio.to_thread(thaw_group, proc.pid)
        await proc.wait()


async def keeper_finishes(proc: Proc, exited: float | None, by: float, slack: float = 2.0) -> bool:
    """The runner's wait for an agent's keeper ran out; did the agent itself exit by `by` (its
    deadline and the grace the runner gives it), the keeper only waiting out ESCAPE_GRACE_S for a
    helper ending by itself (an MCP server in a session of its own)? Then that wait, and `slack`
    for a loaded host, is let run rather than the agent graded as running: True when the keeper
    ended within it. The agent exited when the keeper said so, before its grace (vault.jail.keeper)."""
    from vault.jail.spec import ESCAPE_GRACE_S

    if exited is None or exited > by:
        return False
    try:
        await asyncio.wait_for(proc.wait(), max(0.1, exited + ESCAPE_GRACE_S + slack - time.time()))
    except TimeoutError:
        return False
    return True


def end_escaped(task_file: Path, group: int) -> int:
    """End the processes an agent left running outside its process group (a grandchild that
    called setsid), found by the task file in their environment; how many there were. One that
    ends on its own within ESCAPE_GRACE_S (an MCP server whose client closed its stdin) was not
    left running.

    The second net: the agent's keeper (vault.jail.keeper) has already ended and counted every
    process the agent started, in a jail or not. What this finds escaped the keeper too (the
    agent killed its keeper, which it can do without a jail: it runs as the same user)."""
    import psutil

    from vault.jail.keeper import threads_run
    from vault.jail.spec import ESCAPE_GRACE_S
    from vault.lineage import lineage, unasked

    def agents(proc: psutil.Process) -> bool:
        # its task file, or one the runner's fork server started on a request the agent wrote (a
        # root agent's copy of its socket): below the runner, not the keeper, with an environment
        # of its choosing
        return proc.environ().get("VAULTSIM_TASK") == str(task_file) or unasked(lineage(proc.pid))

    found = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"].real != os.getuid() or os.getpgid(proc.pid) == group:
                continue
            if agents(proc):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    if not found:
        return 0
    _, alive = psutil.wait_procs(found, timeout=ESCAPE_GRACE_S)
    left = 0
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            if not agents(proc):  # a fork the runner asked for (another trial's, registered a moment after it)
                continue
            if proc.status() != psutil.STATUS_ZOMBIE or threads_run(proc.pid):  # its main thread ended, not it
                left += 1
            proc.kill()
    return left


# how often an agent's command lines are read while it runs, and how many distinct ones are kept
ARGV_POLL_S = 0.05
ARGV_KEPT = 256


def command_lines(pid: int, seen: dict[str, bytes]) -> None:
    """Add to `seen` the command line of `pid` and of every process below it, keyed by process:
    what `ps` shows every user of the machine (a credential put there is shown to all). Sampled,
    so a process that lives less than ARGV_POLL_S can be missed."""
    import psutil

    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        try:
            data: bytes | None = "\0".join(proc.cmdline()).encode(errors="replace")
        except psutil.Error:  # gone, or a zombie: one whose main thread ended may run threads on
            data = None
        # no process name in the label (it is in the report): the name is the agent's to set too
        if data is not None:
            _keep(seen, f"the command line of its process {proc.pid}", data)
        # its name and its threads' (prctl PR_SET_NAME, pthread_setname_np): what `ps -e`, `ps -L`
        # and `top` show every user, 15 bytes each
        names = []
        with contextlib.suppress(OSError):
            for task in sorted(os.listdir(f"/proc/{proc.pid}/task"))[:64]:
                with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/task/{task}/comm", "rb") as f:
                    names.append(f.read(64).rstrip(b"\n"))
        if names:
            _keep(seen, f"the name (comm) of its process {proc.pid} or its threads", b"\n".join(names))
        # the paths of its Unix sockets: /proc/net/unix (`ss -x`, `netstat -x`, `lsof -U`) shows every
        # user each socket's path while it is open, an abstract one (no file at all) or one whose file
        # was removed at once alike
        paths = socket_paths(proc.pid)
        if paths:
            _keep(seen, f"the path of a Unix socket of its process {proc.pid}", b"\n".join(paths))


# at most this many of a process's descriptors are looked at per sample
FDS_READ = 512


def socket_paths(pid: int) -> list[bytes]:
    """The paths (`@` and the name for an abstract one) of the bound Unix sockets process `pid` holds,
    as its network namespace's /proc/net/unix lists them for every user. Read through its threads: a
    process whose main thread ended (pthread_exit) shows no descriptors and no network namespace as
    /proc/PID, while the threads running on hold them."""
    try:
        tasks = sorted(os.listdir(f"/proc/{pid}/task"), key=lambda t: t != str(pid))[:8]
    except OSError:
        return []
    inodes: set[bytes] = set()
    net = ""
    for task in tasks:
        with contextlib.suppress(OSError), os.scandir(f"/proc/{pid}/task/{task}/fd") as fds:
            for i, fd in enumerate(fds):
                if i >= FDS_READ:
                    break
                with contextlib.suppress(OSError):
                    link = os.readlink(fd.path)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1].encode())
                        net = net or f"/proc/{pid}/task/{task}/net/unix"
        if inodes:
            break  # threads share their descriptors
    if not inodes:
        return []
    out = []
    with contextlib.suppress(OSError), open(net, "rb") as f:
        for line in f:
            # Num RefCount Protocol Flags Type St Inode Path
            fields = line.rstrip(b"\n").split(None, 7)
            if len(fields) == 8 and fields[6] in inodes:
                out.append(fields[7])
    return out


def _keep(seen: dict[str, bytes], label: str, data: bytes) -> None:
    had = seen.get(label)
    if had is None and len(seen) < ARGV_KEPT:
        seen[label] = data
    elif had is not None and data not in had.split(b"\n"):  # it exec'd or renamed: both were shown
        seen[label] = had + b"\n" + data


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@dataclass
class Registry:
    """Live process groups and trial directories of this runner."""

    groups: set[int] = field(default_factory=set)
    dirs: dict[Path, Any] = field(default_factory=dict)  # dir -> cleanup callable or None
    # the backstop if this runner dies without reaping (vault.runner.reaper): started with the first dir
    reaper: Any = None

    def add_group(self, pid: int) -> None:
        from vault.lineage import started_here
        self.groups.add(pid)
        started_here(pid)
        if self.reaper is not None:
            self.reaper.tell("+g", pid)

    def done_group(self, pid: int) -> None:
        from vault.lineage import ended_here
        self.groups.discard(pid)
        ended_here(pid)
        if self.reaper is not None:
            self.reaper.tell("-g", pid)

    def add_dir(self, path: Path, cleanup: Any = None) -> None:
        if self.reaper is None:
            from vault.runner.reaper import Reaper
            self.reaper = Reaper()
            for pid in list(self.groups):
                self.reaper.tell("+g", pid)
        if path not in self.dirs:
            self.reaper.tell("+d", str(path))
        self.dirs[path] = cleanup

    def done_dir(self, path: Path) -> None:
        if self.dirs.pop(path, False) is not False and self.reaper is not None:
            self.reaper.tell("-d", str(path))

    def reap(self, grace_s: float = 1.0) -> None:
        """End every remembered group (TERM, then KILL) and remove every directory."""
        groups = list(self.groups)
        for pid in groups:
            kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(group_alive(p) for p in groups):
            time.sleep(0.01)  # polling the groups' exit, bounded by the grace period
        for pid in groups:
            kill_group(pid, signal.SIGKILL)
            if self.reaper is not None:
                self.reaper.tell("-g", pid)
        self.groups.clear()
        for path, cleanup in list(self.dirs.items()):
            remove_dir(path, cleanup)
            if self.reaper is not None:
                self.reaper.tell("-d", str(path))
        self.dirs.clear()
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None


def remove_dir(path: Path, cleanup: Any = None) -> None:
    if cleanup is not None:
        with contextlib.suppress(Exception):
            cleanup()
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        # shutil.rmtree recurses, holding a descriptor, once per directory level (Python 3.11):
        # an agent's state nested thousands deep raised RecursionError out of the run (exit 3)
        # and left the trial's home behind; rm(1) walks any depth
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["rm", "-rf", "--", str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=300, check=False)


PROGRAMS = {"daemon": [sys.executable, "-m", "vault.cli.main"], "agent_stub": [sys.executable, "-m", "agent_stub"]}


class _ExecProc:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()


class ExecLauncher:
    """fork+exec in a new session; stdout/stderr to files, stdin from /dev/null."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def spawn(self, kind: str, args: list[str], *, env: dict[str, str], cwd: str, stdout: Path,
                    stderr: Path, jail: Any = None, keep: str | None = None) -> Proc:
        """kind: "daemon" (`vaultsim ARGS`), "agent_stub" (`python -m agent_stub ARGS`), "exec" (ARGS).
        An agent runs under its keeper: in `jail`, else without one reporting to `keep`."""
        argv = PROGRAMS[kind] + list(args) if kind in PROGRAMS else list(args)
        if jail is not None:
            argv = [sys.executable, "-m", "vault.jail", json.dumps(jail.to_dict()), "--", *argv]
        elif keep is not None:
            argv = [sys.executable, "-m", "vault.jail", "--keep", keep, "--", *argv]
        out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err = out if stderr == stdout else os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True)
        finally:
            os.close(out)
            if err != out:
                os.close(err)
        self.registry.add_group(proc.pid)
        return _ExecProc(proc)

    async def aclose(self) -> None:
        return None
