"""Running a program inside a jail: bubblewrap builds it, we step in.

Why not just `bwrap ... -- CMD`: most agents the runner starts are agent_stub
processes forked from a pre-imported interpreter (vault.runner.forkserver),
because a cold Python process spends 0.4 s importing; an exec through bwrap
would pay that again for every agent. So bubblewrap builds the sandbox around
a tiny holder (vault.jail.spec) and the already-running process joins it, the
way `nsenter` and `flatpak enter` join a running sandbox:

    C (the launcher's child)                 the jail (bwrap's namespaces)
    ------------------------------------     ---------------------------------
    start bwrap + holder, wait for "ready"   holder: /bin/sh waiting on stdin
    setns: user, mnt, net, ipc, uts, cgroup, pid
    listen on the tripwire ports             (in the jail's own loopback)
    fork ------------------------------->    G: drop every capability (bounding,
                                                effective, permitted, inheritable,
                                                ambient), no_new_privs, close every
                                                inherited fd, chdir; then run the
                                                agent (a function, or exec)
    record knocks on the tripwire ports
    wait for G; close the holder's stdin --> the PID namespace ends: whatever G
    exit with G's status                      left running is killed

C stays outside the jail's PID namespace, so the agent cannot see or signal
it; C never runs agent code. Every fd C holds is closed in G before the agent
runs (an inherited directory fd would be a way out of the mount namespace).

`python -m vault.jail SPEC_JSON -- CMD ARGS` is the same for a process
that has no pre-imported parent (`--no-fork-server`). Only the standard
library is imported here, so that path stays cheap.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from vault.jail import pids
from vault.jail.keeper import (Leftovers, become_agent, descendants, exit_like, keep, open_report, stop_with_parent,
                               threads_run)
from vault.jail.ports import Tripwires
from vault.jail.spec import JailSpec

READY_TIMEOUT_S = 10.0
NAMESPACES = ("user", "mnt", "net", "ipc", "uts", "cgroup", "pid")  # user first, pid last (children only)

NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2)
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Landlock (the same numbers on x86_64 and arm64): scoping abstract Unix sockets needs ABI 6 (Linux 6.12)
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1

_libc = ctypes.CDLL(None, use_errno=True)  # libc is already mapped into the process


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class JailError(OSError):
    """The jail could not be built or entered (nothing of the agent has run)."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise JailError(err, f"{what}: {os.strerror(err)}")


# ---- the holder -----------------------------------------------------------------


@dataclass
class Holder:
    """The bwrap process that owns a sandbox's namespaces."""

    proc: subprocess.Popen[bytes]
    pid: int  # the sandbox's first process, whose namespaces are joined

    def close(self, timeout: float = 2.0) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_holder(spec: JailSpec) -> Holder:
    """bwrap with the spec; returns once the sandbox is fully built (its holder said so)."""
    info_r, info_w = os.pipe()
    try:
        proc = subprocess.Popen(spec.bwrap_argv(info_w), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                pass_fds=(info_w,), close_fds=True, start_new_session=False)
    except OSError as exc:
        os.close(info_r)
        raise JailError(exc.errno or 0, f"cannot start bwrap: {exc.strerror}") from None
    finally:
        os.close(info_w)
    try:
        with os.fdopen(info_r, "rb") as info:
            text = info.read()  # EOF when bwrap closes it, right after writing
        pid = int(json.loads(text)["child-pid"]) if text else 0
        assert proc.stdout is not None
        ready = _read_ready(proc.stdout.fileno(), READY_TIMEOUT_S)
    except (ValueError, KeyError, OSError):
        ready, pid = False, 0
    if not ready or not pid:
        proc.kill()
        proc.wait()
        raise JailError(0, f"bwrap could not build the sandbox (exit {proc.returncode})")
    return Holder(proc, pid)


def _read_ready(fd: int, timeout: float) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return False
        return os.read(fd, 16) == b"\n"
    finally:
        sel.close()


# ---- stepping in ----------------------------------------------------------------


def join(pid: int) -> None:
    """setns into every namespace of `pid` that differs from ours (single-threaded caller).

    bwrap --disable-userns runs the sandbox in a user namespace nested in the one
    that owns its other namespaces; capabilities in the inner one do not reach
    the outer one's, so the outer user namespace is joined first, then the
    others, then the inner one."""
    fds: dict[str, int] = {}
    users: list[int] = []
    try:
        for name in NAMESPACES[1:]:
            theirs = f"/proc/{pid}/ns/{name}"
            if os.readlink(theirs) != os.readlink(f"/proc/self/ns/{name}"):
                fds[name] = os.open(theirs, os.O_RDONLY | os.O_CLOEXEC)
        users = _user_chain(pid)
        for fd in users[:-1]:
            _check(_libc.setns(fd, 0), "setns user (outer)")
        for name in NAMESPACES[1:]:
            if name in fds:
                _check(_libc.setns(fds[name], 0), f"setns {name}")
        if users:
            _check(_libc.setns(users[-1], 0), "setns user")
    finally:
        for fd in [*fds.values(), *users]:
            os.close(fd)


def _user_chain(pid: int) -> list[int]:
    """fds of the user namespaces from just below ours down to pid's, outermost first."""
    ours = os.stat("/proc/self/ns/user").st_ino
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    chain = []
    try:
        while os.fstat(fd).st_ino != ours:
            chain.append(fd)
            fd = fcntl.ioctl(fd, NS_GET_PARENT)  # EPERM above our own: not a descendant of ours
        os.close(fd)
    except OSError as exc:
        for x in chain:
            os.close(x)
        raise JailError(exc.errno or 0, "the sandbox's user namespace is not inside ours") from None
    return chain[::-1]


def drop_privileges() -> None:
    """No capability of any kind, now or after exec; no setuid gains (as bwrap --cap-drop ALL)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop a bounding capability")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    return max(0, int(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)))


def scope_abstract_sockets() -> bool:
    """No connecting to an abstract Unix socket made outside the jail. Abstract sockets belong
    to a network namespace, so with the host's network (`--agent-network host`) the host's are
    reachable, a D-Bus bus on an abstract address among them; a mount namespace does not hide
    them. Best effort: False where the kernel has no Landlock ABI 6. Needs no_new_privs."""
    if landlock_abi() < 6:
        return False
    attr = _RulesetAttr(0, 0, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
    fd = int(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0))
    if fd < 0:
        return False
    try:
        return int(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0)) == 0
    finally:
        os.close(fd)


# ---- the whole run ---------------------------------------------------------------


def run_jailed(spec: JailSpec, target: Callable[[], int] | list[str],
               env: dict[str, str] | None = None) -> int:
    """Run `target` (a function returning an exit status, or an argv to exec) in a jail built
    from `spec`; returns its exit status, -N when signal N ended it (`exit_like` passes that
    on). Call from a single-threaded process: it joins the jail's namespaces itself and stays
    there. This process is the agent's keeper (vault.jail.keeper) with namespaces added."""
    if spec.pids_cgroup:
        with contextlib.suppress(OSError):  # gone or not ours: no cap (the runner reports none refused)
            pids.enter(spec.pids_cgroup)
    log_fd = open_report(spec.port_log)
    holder = start_holder(spec)
    try:
        join(holder.pid)
        wires = Tripwires(spec.ports if spec.network == "none" else (), log_fd)
        before = _jail_pids()  # the holder's own

        inner: list[int] = []  # the agent's pid inside the jail: /proc there shows groups by it

        def fork_agent() -> int:
            rfd, wfd = os.pipe2(os.O_CLOEXEC)
            pid = os.fork()
            if pid == 0:
                os.close(rfd)
                os.write(wfd, str(os.getpid()).encode())
                os.close(wfd)
                become_agent(target, env, functools.partial(_prepare, spec))
            os.close(wfd)
            with contextlib.suppress(ValueError, OSError):
                inner.append(int(os.read(rfd, 32)))
            os.close(rfd)
            return pid

        # the end of the PID namespace (holder.close) kills whatever is left, as the keeper
        # without a jail does; the runner grades both the same way (FAIL_DEADLINE), so it is told
        def outside(_agent: int) -> int:
            return _left_group(_jail_pids() - before, set(inner))

        def let_go(_agent: int) -> int:  # by the agent's pid in the jail, where this /proc shows it
            below = set(descendants(inner[0])) if inner else set()
            return _left_group(_jail_pids() - before - below, set(inner))

        # the agent's stat is read where this process's /proc shows it: the jail's, by its pid there
        return keep(fork_agent, Leftovers(outside=outside, let_go=let_go), log_fd, wires,
                    proc_pid=lambda _pid: inner[0] if inner else -1)
    finally:
        holder.close()
        if log_fd is not None:
            os.close(log_fd)


def _prepare(spec: JailSpec) -> None:
    drop_privileges()
    scope_abstract_sockets()
    os.chdir(spec.cwd)


def _jail_pids() -> set[int]:
    """Every process of the jail's PID namespace: once joined, /proc is the jail's own."""
    try:
        return {int(n) for n in os.listdir("/proc") if n.isdigit()}
    except OSError:
        return set()


def _left_group(pids: set[int], agent: set[int]) -> int:
    """How many of `pids` left the agent's process group (setsid, setpgid). The agent's group is
    led by this keeper, outside the jail's PID namespace, so a process still in it shows
    process group 0 there; what stayed in the group is ended silently, as without a jail. So is
    what is in a group the agent's own process made and leads (`agent`: its pid in the jail), as a
    wrapper such as `timeout` makes for itself and what it runs (vault.jail.keeper.Leftovers)."""
    found = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, pgrp = fields[0], int(fields[2])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        # a zombie has ended (the jail's init reaps it), unless only its main thread did (pthread_exit)
        if pgrp != 0 and pgrp not in agent and (state not in ("Z", "X") or threads_run(pid)):
            found += 1
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m vault.jail SPEC_JSON -- CMD ARGS`"""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m vault.jail SPEC_JSON -- CMD [ARGS...]", file=sys.stderr)
        return 2
    spec = JailSpec.from_dict(json.loads(args[0]))
    stop_with_parent()
    try:
        return exit_like(run_jailed(spec, args[2:]))
    except JailError as exc:
        print(f"vaultsim jail: {exc.strerror or exc}", file=sys.stderr)
        return 126
