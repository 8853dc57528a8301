"""The agent's keeper: its parent, which runs no agent code and ends whatever the agent leaves.

Every agent the runner starts has one. The launcher returns the keeper's pid
(the process group the runner's deadline and Ctrl-C reach); the keeper forks
the agent into its group and waits for it.

* In a jail (vault.jail.enter) the keeper stays outside the jail's PID
  namespace; what the agent leaves dies with the namespace.
* Without one (`--isolation none`) the keeper is a child subreaper
  (PR_SET_CHILD_SUBREAPER): an orphan anywhere below the agent is re-parented
  to it instead of init, so every process the agent started stays its
  descendant, whatever session, group or environment it took.

When the agent has exited, the keeper counts the processes still running
outside the agent's process group after ESCAPE_GRACE_S (one that ends by
itself meanwhile, such as an MCP server whose stdin closed, was not left
running), ends every descendant, and writes `{"left_running": N}` to its
report file, which the runner grades (FAIL_DEADLINE).

Signals: TERM and HUP (the runner stopping) are passed to the agent, which is
killed if it has not ended HURRY_S later; STOP_SIGNAL (the runner's deadline,
or the keeper's parent dying) kills it at once. Then what it left is ended
without the grace; stopped while it ran, it is counted as leaving only what
it had let go (`Leftovers.let_go`): a process still below its own process (an
MCP host's server, its child in a session of its own) is stopped with it.
SIGINT is the agent's own (a terminal's ^C reaches it).

Only the standard library: `python -m vault.jail --keep REPORT -- CMD` (the
runner without its fork server) stays cheap.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import hmac
import json
import os
import selectors
import signal
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from vault import regular
from vault.jail import pids
from vault.jail.adopted import PR_SET_CHILD_SUBREAPER, guarded
from vault.jail.spec import ESCAPE_GRACE_S
from vault.stop_signals import caught

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
# the runner's secret for this keeper's report (without a jail): only lines carrying it are the
# keeper's. The agent runs as the same user and can write the report file; it never sees this
# value (taken out of the environment before the agent is forked, and the keeper's memory and
# environment closed to other processes)
SEAL_ENV = "VAULTSIM_KEEPER_SEAL"
PIDS_ENV = "VAULTSIM_KEEPER_PIDS"  # a pids cgroup the keeper moves into first (vault.jail.pids)
STOP_SIGNAL = signal.SIGUSR1  # "end the agent now": the runner's deadline, the keeper's parent gone
HURRY_S = 0.5  # how long a TERM'd agent may take before it is killed (the runner's reap waits 1 s)
END_TIMEOUT_S = 5.0  # bound on ending the descendants (a process stuck in the kernel cannot die)

_libc = ctypes.CDLL(None, use_errno=True)  # libc is already mapped into the process

Target = Callable[[], int] | list[str]


def prctl(option: int, arg: int, what: str) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# ---- the agent's side of the fork -------------------------------------------------


def become_agent(target: Target, env: dict[str, str] | None, prepare: Callable[[], None] | None = None) -> NoReturn:
    """In the forked child: undo the keeper's signal set-up, die with the keeper, close every
    inherited fd but stdio, then run the agent (a function, or exec an argv)."""
    code = 127
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, STOP_SIGNAL):
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # the keeper was started under nohup (keep): the agent is too, as any child would be
            signal.signal(sig, signal.SIG_DFL)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "pdeathsig")
        prctl(PR_SET_DUMPABLE, 1, "dumpable")  # the keeper is not (run_kept); the agent is as ever
        if prepare is not None:
            prepare()
        os.closerange(3, _max_fd())
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if callable(target):
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as a fresh interpreter has it
            code = int(target() or 0)
        else:
            os.execvpe(target[0], target, dict(os.environ))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - whatever happens, this process must end here
        with contextlib.suppress(Exception):
            os.write(2, f"vaultsim: {type(exc).__name__}: {exc}\n".encode())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# ---- the keeper ---------------------------------------------------------------------


@dataclass
class Leftovers:
    """How a keeper finds and ends what the agent left: `outside(agent)` counts the live processes
    outside the agent's group (`agent`: its pid as the keeper forked it), `end` ends everything
    that is left, `reap` collects exited children the keeper inherited (without a jail).

    The agent's group is the keeper's, or the one the agent's own process made and leads (`timeout`
    without `--foreground` and `setsid` run as the agent call setpgid/setsid for themselves and
    what they run): a wrapper's doing, not a process leaving the agent's group."""

    outside: Callable[[int], int]
    end: Callable[[], None] = lambda: None
    reap: Callable[[int], None] = lambda spare: None  # spare: the agent, while _supervise waits for it
    # of those, the ones no longer below the agent's own process (orphans it let go: a double fork's
    # grandchild), counted while it still runs; None: every one outside its group
    let_go: Callable[[int], int] | None = None


@dataclass
class _State:
    child: int = 0
    hurry_at: float | None = None  # kill the agent at this monotonic time
    hurried: bool = False  # the runner is stopping it: no grace for what it leaves
    running: bool = False  # the agent has not exited yet (as the keeper knows it)
    let_go: int | None = None  # at a deadline stop that found it running: what it had let go (Leftovers)


def keep(fork_agent: Callable[[], int], leftovers: Leftovers, report_fd: int | None = None,
         wires: Any = None, seal: str | None = None, proc_pid: Callable[[int], int] | None = None) -> int:
    """Fork the agent (`fork_agent` returns its pid; in the child it never returns), wait for it
    while recording `wires` (tripwire ports, in a jail), then count, end and report what it left
    (module doc). Returns the agent's exit status, -N when signal N ended it (`exit_like`)."""
    state = _State()
    said = _Said(report_fd, seal) if report_fd is not None else None
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def on_term(sig: int, _frame: Any) -> None:
        _signal(state.child, sig)
        state.hurried = True
        state.hurry_at = min(state.hurry_at or float("inf"), time.monotonic() + HURRY_S)

    def on_stop(_sig: int, _frame: Any) -> None:
        # stopped while it runs, it has left nothing: what is outside its group and still below it
        # (an MCP host's SDK-started server, its own child) ends with it; only what it had already
        # let go, orphaned below the keeper, is counted (red team 45u: a host killed at its deadline
        # was said to leave its server running)
        if state.running and state.let_go is None and leftovers.let_go is not None:
            state.let_go = leftovers.let_go(state.child)
        _signal(state.child, signal.SIGKILL)
        state.hurried = True

    # a SIGHUP ignored at start (nohup) stays ignored, for the keeper and its agent (vault.stop_signals)
    on_hup = on_term if signal.SIGHUP in caught((signal.SIGHUP,)) else signal.SIG_IGN
    handlers: dict[int, Any] = {signal.SIGTERM: on_term, signal.SIGHUP: on_hup, STOP_SIGNAL: on_stop,
                                signal.SIGINT: signal.SIG_IGN, signal.SIGCHLD: lambda *_: None}
    previous = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
    old_wakeup = signal.set_wakeup_fd(wfd)
    try:
        state.child = fork_agent()
        state.running = True
        if said is not None:
            # which process the agent is, (pid, start): the daemon's records name processes so, and an
            # orphan of the agent's has no agent among its ancestors (vault.runner.late_opens)
            start = _started(proc_pid(state.child) if proc_pid is not None else state.child)
            if start is not None:
                said.write({"agent": [state.child, start]})
        code = _supervise(state, rfd, leftovers, wires)
        state.running = False
        exited = time.time()  # the agent's end: what follows (the grace, a jail's teardown) is not its
        until = time.monotonic() + (0.0 if state.hurried else ESCAPE_GRACE_S)
        if said is not None and not state.hurried:
            # said now, before the grace: a runner whose deadline comes while a helper of the agent's
            # ends (an MCP server) lets this keeper finish it rather than grade the agent as running
            said.write({"exited": exited})
        while True:
            leftovers.reap(0)
            left = leftovers.outside(state.child)
            if not left or time.monotonic() >= until:
                break
            time.sleep(0.05)  # an MCP server whose stdin closed is still ending
        leftovers.end()
        if state.let_go is not None:
            left = state.let_go
        if said is not None:
            said.write({"left_running": left, "exited": exited})
        return code
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(rfd)
        os.close(wfd)


def _supervise(state: _State, wake: int, leftovers: Leftovers, wires: Any) -> int:
    """Wait for the agent, recording tripwire knocks meanwhile; never runs agent code."""
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(state.child)
    try:
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        sel.register(wake, selectors.EVENT_READ, "signal")
        if wires is not None:
            wires.register(sel)
        done = False
        while not done:
            timeout = None if state.hurry_at is None else max(0.0, state.hurry_at - time.monotonic())
            events = sel.select(timeout)
            if state.hurry_at is not None and time.monotonic() >= state.hurry_at:
                _signal(state.child, signal.SIGKILL)  # TERM'd and still there
                state.hurry_at = None
            for key, _ in events:
                if key.data == "exit":
                    done = True
                elif key.data == "signal":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake, 512)
                    leftovers.reap(state.child)  # an orphan the keeper inherited has ended
                else:
                    wires.on_ready(sel, key.fileobj, key.data)
        _, status = os.waitpid(state.child, 0)
        if wires is not None:
            wires.drain()
    finally:
        sel.close()
        os.close(pidfd)
    return os.waitstatus_to_exitcode(status)


def stop_with_parent() -> None:
    """The runner's keepers: when the parent (the fork server, the runner) dies, end the agent at
    once and tidily, as at a deadline. Not for `vaultsim exec`, whose program outlives a shell."""
    with contextlib.suppress(OSError):
        prctl(PR_SET_PDEATHSIG, STOP_SIGNAL, "pdeathsig")


def _signal(pid: int, sig: int) -> None:
    if pid > 0:  # 0 in the forked agent before it resets its handlers
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# ---- without a jail: the keeper as a subreaper ----------------------------------------


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every process below `root`: pid -> (process group, state), from /proc."""
    table: dict[int, tuple[int, int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            table[int(name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[int, str]] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out[pid] = (table[pid][1], table[pid][2])
        todo.extend(children.get(pid, ()))
    return out


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent, process group, state) of `pid`, None when it is gone. The state is the process's,
    not its main thread's: one whose main thread ended (pthread_exit) while another thread runs
    on reads "R" (see `threads_run`)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        state = fields[0].decode("ascii", "replace")
        if not _alive(state) and threads_run(pid):
            state = "R"
        return int(fields[1]), int(fields[2]), state
    except (OSError, ValueError, IndexError):
        return None


def _started(pid: int) -> float | None:
    """When `pid` (as this process's /proc numbers it) started, in seconds since boot, as
    vault.lineage.started reads it (the same in every PID namespace); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def threads_run(pid: int) -> bool:
    """Whether a thread of process `pid` still runs. /proc/PID/stat shows its main thread's
    state: a process whose main thread ended (pthread_exit) reads Z there, a zombie, while the
    threads it started run on (and call, write, hold the machine) for as long as they like; wait()
    does not report it ended until the last of them has. Its threads' own states tell."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                if _alive(f.read().rsplit(b")", 1)[1].split()[0].decode("ascii", "replace")):
                    return True
        except (OSError, IndexError):
            continue
    return False


def _alive(state: str) -> bool:
    return state not in ("Z", "X")  # a zombie has ended; its parent (or we) reap it


def subreaper_leftovers() -> Leftovers:
    """What a keeper without a jail finds and ends: its own descendants (it is a subreaper)."""
    me, group = os.getpid(), os.getpgrp()

    def outside(agent: int) -> int:
        # a group id stays taken while the group has members, so `agent` names only the group its
        # own process led, even after it was reaped
        return sum(1 for pgrp, state in descendants(me).values() if pgrp not in (group, agent) and _alive(state))

    def end() -> None:
        until = time.monotonic() + END_TIMEOUT_S
        while True:
            reap_children()
            found = descendants(me)
            if not found or time.monotonic() > until:
                return
            for pid, (_, state) in found.items():
                if _alive(state):
                    _kill_descendant(pid, set(found) | {me})
            time.sleep(0.002)  # SIGKILLed processes end on their way back to user space

    def let_go(agent: int) -> int:
        below = descendants(agent)  # what its own process still holds
        return sum(1 for pid, (pgrp, state) in descendants(me).items()
                   if pgrp not in (group, agent) and _alive(state) and pid not in below)

    return Leftovers(outside=outside, end=end, reap=reap_children, let_go=let_go)


def _kill_descendant(pid: int, tree: set[int]) -> None:
    """SIGKILL `pid` through a pidfd, once it is certain that fd names a process of the tree (a
    pid freed and reused since the scan would name someone else's process)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        stat = _stat(pid)
        if stat is not None and stat[0] in tree:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def reap_children(spare: int = 0) -> None:
    """Collect every child that has ended (orphans re-parented to a subreaper included), but not
    `spare` (the agent: its status is _supervise's to collect; reaped here, it was lost, and the
    keeper failed without its report when a signal and the agent's exit came together)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == spare:
            return  # nothing has ended, or the agent has: the rest waits until it is collected
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def _scrub_initial_env(name: str) -> None:
    """Blank `name=...` in the environment block the kernel keeps at the top of this process's
    stack, which /proc/PID/environ reads: taking it out of os.environ leaves it there, and a root
    agent without a jail read the seal from it and forged this keeper's report (not being
    dumpable stops other users only). Before the agent is forked."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5): fields 50, 51)
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = mem.read(end - start)
            at = block.find(name.encode() + b"=")
            while at >= 0 and (at == 0 or block[at - 1] == 0):
                stop = block.find(b"\0", at)
                stop = len(block) if stop < 0 else stop
                mem.seek(start + at)
                mem.write(b"_" * (stop - at))
                at = block.find(name.encode() + b"=", stop)
    except (OSError, ValueError, IndexError):
        pass  # no /proc here: the seal stays readable by root only (the keeper is not dumpable)


def run_kept(target: Target, env: dict[str, str] | None = None, report_fd: int | None = None) -> int:
    """Run `target` (a function returning an exit status, or an argv to exec) as a child of this
    process made a subreaper; return its exit status after ending whatever it left (module doc).
    Call from a single-threaded process with no other children."""
    prctl(PR_SET_CHILD_SUBREAPER, 1, "child subreaper")
    seal = os.environ.pop(SEAL_ENV, None)
    if seal:
        _scrub_initial_env(SEAL_ENV)
    capped = os.environ.pop(PIDS_ENV, None)
    if env is not None:
        seal = env.pop(SEAL_ENV, None) or seal
        capped = env.pop(PIDS_ENV, None) or capped
    if capped:
        with contextlib.suppress(OSError):  # gone or not ours: no cap (the runner reports none refused)
            pids.enter(capped)
    if seal:
        prctl(PR_SET_DUMPABLE, 0, "dumpable")  # its environment and memory: not the agent's to read

    def fork_agent() -> int:
        pid = os.fork()
        if pid == 0:
            become_agent(target, env)
        return pid

    try:
        return keep(fork_agent, subreaper_leftovers(), report_fd, seal=seal)
    finally:
        with contextlib.suppress(OSError):
            prctl(PR_SET_CHILD_SUBREAPER, 0, "child subreaper")


# ---- the report ---------------------------------------------------------------------


def open_report(path: str | None) -> int | None:
    """The report file, to append to. Never waited on or followed: the runner made it, and a FIFO
    or link found there instead (an agent put it) is no report (the keeper then reports nothing,
    which fails closed)."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


# far more than a keeper writes: past it, what is left is not read (a count missing fails closed)
MAX_REPORT_BYTES = 4 << 20


def _read_report(path: Path) -> str:
    """The report's text, from a regular file only. Without a jail the agent can reach the file
    (beside its task file): a FIFO put in its place was opened in the runner's event loop and
    waited on for a writer, holding every trial and the run's own stop forever (OSError)."""
    return regular.read_bytes(path, MAX_REPORT_BYTES, follow=False, cut=True).decode("utf-8", errors="replace")


def _mac(doc: dict[str, Any], seal: str) -> str:
    return hmac.new(seal.encode(), json.dumps(doc, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def report_line(doc: dict[str, Any], seal: str | None) -> bytes:
    """One line of a keeper's report: with a seal, the line's HMAC under it, never the seal itself.
    The report sits beside the agent's task file and its keeper holds it open: a seal written
    there was read back by an unjailed agent, which appended a sealed `left_running: -1` and so
    took a process it left running off the count (red team 46u)."""
    return (json.dumps({**doc, "mac": _mac(doc, seal)} if seal else doc) + "\n").encode()


class _Said:
    """A keeper's report as it writes it: each sealed line carries `at`, the bytes this keeper wrote
    before it, so a report cut short, written over or added to by anyone else reads so
    (`report_changed`); the keeper never reads its file back (its offset is the file's end, wherever
    an agent cut it)."""

    def __init__(self, fd: int, seal: str | None) -> None:
        self.fd, self.seal, self.at = fd, seal, 0

    def write(self, doc: dict[str, Any]) -> None:
        line = report_line({**doc, "at": self.at} if self.seal else doc, self.seal)
        os.write(self.fd, line)
        self.at += len(line)


def report_changed(path: Path, seal: str) -> str | None:
    """How the keeper's sealed report at `path` differs from what the keeper wrote (`_Said`), or
    None: every line its own, in its order, each at the bytes the keeper had written before it, and
    nothing else. Red team 47u: an unjailed agent cut its keeper's report to nothing, or added a line
    of its own, while it ran (the process it is, named in the first line, gone) and passed."""
    try:
        data = regular.read_bytes(path, MAX_REPORT_BYTES, follow=False, cut=True)
    except OSError:
        return None  # no regular file there: no sealed count, graded as such (keeper_unreported)
    at = 0
    for raw in data.splitlines(keepends=True):
        doc: Any = None
        with contextlib.suppress(ValueError):
            doc = json.loads(raw)
        mac = doc.pop("mac", None) if isinstance(doc, dict) else None
        if not (isinstance(mac, str) and hmac.compare_digest(mac, _mac(doc, seal))):
            return f"added a line of its own to {path.name} at byte {at}"
        if "adopted" in doc and "at" not in doc:  # its guard's, after the agent killed the keeper
            at += len(raw)
            continue
        if not isinstance(doc.get("at"), int):  # sealed, but no line of a keeper: its seal was read
            return f"added a line of its own to {path.name} at byte {at}, sealed with its keeper's seal"
        if doc.get("at") != at:
            return (f"cut {path.name} short or wrote over it (the keeper's line written at byte "
                    f"{doc.get('at')} is at {at})")
        at += len(raw)
    return None


def _report_lines(path: Path, seal: str | None) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(OSError):
        for line in _read_report(path).splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if not isinstance(doc, dict):
                    continue
                mac = doc.pop("mac", None)
                if seal is None or (isinstance(mac, str) and hmac.compare_digest(mac, _mac(doc, seal))):
                    out.append(doc)  # a copy of a line of its keeper's adds what the keeper counted
    return out


def _count(value: Any) -> bool:
    """A count a keeper writes: a whole number, never below 0 (one that is would take another off)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_exited(path: Path, seal: str | None = None) -> float | None:
    """When the agent exited, as its keeper saw it (read as `read_left_running`); None when
    the keeper reported nothing."""
    times = [float(d["exited"]) for d in _report_lines(path, seal) if isinstance(d.get("exited"), (int, float))]
    return max(times) if times else None


def read_agent(path: Path, seal: str | None = None) -> tuple[int, float] | None:
    """The agent's (pid, start) as its keeper forked it (read as `read_left_running`); None when
    the keeper reported none (an older keeper, or one that could not read it)."""
    for d in _report_lines(path, seal):
        key = d.get("agent")
        if isinstance(key, list) and len(key) == 2 and isinstance(key[0], int) and isinstance(key[1], (int, float)):
            return key[0], float(key[1])
    return None


def read_adopted(path: Path, seal: str | None = None) -> int:
    """How many processes the guard of an exec'd keeper ended after the agent killed that keeper
    (vault.jail.adopted; read as `read_left_running`)."""
    return sum(d["adopted"] for d in _report_lines(path, seal) if _count(d.get("adopted")))


def read_left_running(path: Path, seal: str | None = None) -> int | None:
    """The count a keeper reported in `path` (its report lines among others, such as tripwire
    knocks); None when it reported none (it did not finish: killed, or never started). Given the
    keeper's `seal`, only lines signed with it count (`report_line`): a report the agent wrote for
    a keeper it killed is no report."""
    total = None
    for doc in _report_lines(path, seal):
        if _count(doc.get("left_running")):
            total = (total or 0) + doc["left_running"]
    return total


# ---- exits and the command line -------------------------------------------------------


def exit_like(code: int) -> int:
    """End the way the agent did: by the same signal when one killed it, so whoever waits
    for the keeper sees what happened to the agent; else return the status to exit with."""
    if code < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler
            signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process by default
    return code


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1 << 16


def main(args: list[str]) -> int:
    """`python -m vault.jail --keep REPORT -- CMD ARGS` (REPORT may be empty: no report). The
    process the runner execs guards a forked keeper (vault.jail.adopted)."""
    if len(args) < 4 or args[0] != "--keep" or args[2] != "--":
        print("usage: python -m vault.jail --keep REPORT -- CMD [ARGS...]", file=sys.stderr)
        return 2
    stop_with_parent()
    try:
        fd = open_report(args[1])
        seal = os.environ.get(SEAL_ENV)
        if seal:  # this guard's block, which its keeper's fork copies
            _scrub_initial_env(SEAL_ENV)
            prctl(PR_SET_DUMPABLE, 0, "dumpable")

        def adopted(n: int) -> None:  # what the keeper left to us: its agent killed it
            if fd is not None:
                os.write(fd, report_line({"adopted": n}, seal))

        def keeper() -> int:
            stop_with_parent()  # its parent is now the guard
            return exit_like(run_kept(args[3:], report_fd=fd))

        # the keeper's parent, a subreaper for what the keeper leaves if its agent kills it
        return exit_like(guarded(keeper, (signal.SIGTERM, signal.SIGHUP, STOP_SIGNAL), adopted,
                                  ESCAPE_GRACE_S))
    except OSError as exc:
        print(f"vaultsim keeper: {exc.strerror or exc}", file=sys.stderr)
        return 126
