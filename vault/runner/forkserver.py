"""A fork server for daemon and agent_stub processes: fresh processes, no import bill.

Why: a trial starts one daemon and one or more agents, and a cold Python
process spends most of its first half second importing pydantic, aiohttp,
cryptography and keyring. Thirty scenarios on two cores cannot afford that
per process. The server is started once per run, imports those modules, and
then only forks: each child is a new process (its own pid, create time,
session, sockets and memory), set up exactly like an exec'd one (environment,
cwd, stdio files, default signals) before it runs `vaultsim daemon` or
`python -m agent_stub`. Nothing runs in the server besides imports, so no
state from one trial can reach another. An agent's child is its keeper
(vault.jail.keeper), which forks the agent: in its jail (`"jail"`, a
vault.jail JailSpec: the child builds the jail and steps into it), or
without one (`"keep"`, the keeper's report file). Arbitrary agent commands
come here only to be kept so (the agent execs the command); others are
exec'd by the runner itself. agent_stub runs without an exec, which is what
keeps an agent cheap (vault.jail.enter).

Protocol on a socketpair, one JSON object per line:

    runner -> server   {"id": N, "kind": "daemon"|"agent_stub"|"exec", "args": [...],
                        "env": {...}, "cwd": D, "stdout": F, "stderr": F, "jail": {...}?, "keep": F?,
                        "stdout_fd": I?, "stderr_fd": I?, "fds": K?}
    server -> runner   {"id": N, "pid": P} | {"id": N, "error": TEXT}
                       {"exit": P, "code": C}      (when a child ends)

A stdout or stderr that is one of the runner's own fds (`/proc/<runner>/fd/N`, an output pump's
pipe) is passed as the fd itself (SCM_RIGHTS, K of them on a second socketpair, sent just before
the request line; `stdout_fd` indexes them): the runner is non-dumpable, so its /proc/<pid>/fd is
closed to every process without CAP_SYS_PTRACE, i.e. to the server of any user but root.

The server exits when the runner's end closes; its children are asked to die
with it (PR_SET_PDEATHSIG), so even a SIGKILLed runner leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from vault.jail.adopted import become_subreaper, end_adopted
from vault.resources import IMPORT_ROOT
from vault.runner.procs import Registry, kill_group

_PRELOAD = (
    "vault.jail.enter",
    "vault.cli.main", "vault.cli.daemon", "vault.daemon.daemon", "vault.config", "vault.store.keystore", "vault.store.credentials",
    "vault.executors.http", "vault.executors.ssh", "vault.daemon.diagnostics", "vault.audit.adapter",
    "vault.audit.writer", "vault.daemon.agent_api", "vault.daemon.approver_api", "vault.client",
    "agent_stub.__main__", "agent_stub.recovery",
)
_ENTRY = {"daemon": ("vault.cli.main", "main"), "agent_stub": ("agent_stub.__main__", "main")}
_KEPT_ONLY = frozenset({"exec"})  # arbitrary commands come here only to run under a keeper
_PR_SET_PDEATHSIG = 1


# ---- the server ----------------------------------------------------------------


def serve(fd: int, fd_channel: int | None = None) -> None:
    # the runner handles Ctrl-C, TERM and a closed terminal, and ends us (our socket closes):
    # dying first would take the trials' processes with us before they were cleaned up
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for name in _PRELOAD:
        with contextlib.suppress(Exception):  # a part not landed yet is imported by the child
            importlib.import_module(name)
    # what a keeper killed by its agent leaves comes here, not to init, and is ended (vault.jail.adopted)
    become_subreaper()
    sock = socket.socket(fileno=fd)  # blocking: we only recv when the selector says readable
    channel = socket.socket(fileno=fd_channel) if fd_channel is not None else None
    if channel is not None:
        channel.settimeout(30)  # its fds are sent before their request line: they are there
    rpipe, wpipe = os.pipe()
    os.set_blocking(rpipe, False)
    os.set_blocking(wpipe, False)
    signal.set_wakeup_fd(wpipe)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(rpipe, selectors.EVENT_READ)
    with contextlib.suppress(ConnectionError):  # the runner went away (Ctrl-C): so do we, quietly
        _loop(sock, sel, (rpipe, wpipe), channel)


def _loop(sock: socket.socket, sel: selectors.BaseSelector, pipes: tuple[int, int],
          channel: socket.socket | None = None) -> None:
    rpipe = pipes[0]
    buf = b""
    out: list[bytes] = []
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is sock:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    out.append(_answer(json.loads(line), sock, pipes, channel))
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(rpipe, 4096)
        out.extend(_reap())
        if out:
            sock.sendall(b"".join(out))
            out.clear()


_FORKED: set[int] = set()  # the children the runner asked for; any other was adopted


def _reap() -> list[bytes]:
    done = []
    reaped = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped = True
        if pid not in _FORKED:
            continue  # an orphan we ended (below): nobody waits for it
        _FORKED.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        done.append(json.dumps({"exit": pid, "code": code}).encode() + b"\n")
    if reaped:  # a keeper killed by its agent (or an orphan ended here) handed us what it left
        end_adopted(_FORKED)
    return done


def _answer(req: dict[str, Any], sock: socket.socket, pipes: tuple[int, int],
            channel: socket.socket | None = None) -> bytes:
    fds: list[int] = []
    try:
        if req.get("fds"):
            if channel is None:
                raise OSError(0, "no channel for the runner's fds")
            _, fds, _, _ = socket.recv_fds(channel, 1, int(req["fds"]))
            if len(fds) != int(req["fds"]):
                raise OSError(0, "the runner's fds did not arrive")
        req["_fds"] = fds
        try:
            pid = os.fork()
        except OSError as exc:
            return json.dumps({"id": req["id"], "error": f"fork failed: {exc.strerror}"}).encode() + b"\n"
        if pid == 0:
            _child(req, sock, pipes)  # never returns
        _FORKED.add(pid)
        return json.dumps({"id": req["id"], "pid": pid}).encode() + b"\n"
    except OSError as exc:
        return json.dumps({"id": req["id"], "error": f"no stdio from the runner: {exc.strerror or exc}"}).encode() + b"\n"
    finally:
        for fd in fds:
            os.close(fd)  # the child has its own copies


def _child(req: dict[str, Any], sock: socket.socket, pipes: tuple[int, int]) -> None:
    code = 1
    redirected = False
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        # what a fresh interpreter does at startup: a peer that hangs up is an EPIPE
        # error to handle, never a signal that kills the daemon mid-shutdown
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        sock.close()
        for fd in pipes:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        outfd = _output(req, "stdout")
        errfd = outfd if req["stderr"] == req["stdout"] else _output(req, "stderr")
        for fd in req.get("_fds", ()):
            os.close(fd)  # dup'd where used: the agent inherits none of them
        os.dup2(null, 0)
        os.dup2(outfd, 1)
        os.dup2(errfd, 2)
        for fd in {null, outfd, errfd}:
            os.close(fd)
        redirected = True
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        if req.get("jail") is not None or req.get("keep") is not None:
            code = _kept(req)
        else:
            module, func = _ENTRY[req["kind"]]
            sys.argv = [module, *req["args"]]
            main = getattr(importlib.import_module(module), func)
            code = int(main(list(req["args"])) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:
        # before its stdio is redirected the child still writes to the runner's terminal: a
        # trial home already removed means that trial was stopped (Ctrl-C, -x) as this
        # process started, which needs no traceback; anything else does
        stopped = (not redirected and isinstance(exc, OSError)
                   and not os.path.isdir(os.path.dirname(str(req.get("stdout", ""))) or "."))
        if not stopped:
            with contextlib.suppress(Exception):
                traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _output(req: dict[str, Any], key: str) -> int:
    """The child's stdout or stderr: the runner's fd it was sent, else the file by its path."""
    index = req.get(f"{key}_fd")
    if index is not None:
        return os.dup(req["_fds"][int(index)])
    return os.open(req[key], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _kept(req: dict[str, Any]) -> int:
    """Become the agent's keeper (in its jail when it has one) and run it: agent_stub in-process,
    anything else exec'd."""
    from vault.jail import JailError, JailSpec, run_jailed
    from vault.jail.keeper import exit_like, open_report, run_kept, stop_with_parent

    args = list(req["args"])
    if req["kind"] in _KEPT_ONLY:
        target: Any = args
    else:
        module, func = _ENTRY[req["kind"]]
        sys.argv = [module, *args]

        def target() -> int:
            return int(getattr(importlib.import_module(module), func)(args) or 0)
    stop_with_parent()  # rather than die with the server (SIGKILL), end the agent and what it left
    if req.get("jail") is None:
        return exit_like(run_kept(target, report_fd=open_report(req["keep"])))
    try:
        return exit_like(run_jailed(JailSpec.from_dict(req["jail"]), target))
    except JailError as exc:
        print(f"vaultsim: the agent's jail could not be built: {exc.strerror or exc}", file=sys.stderr)
        return 126


# ---- the runner's side ------------------------------------------------------------


def _own_fd(path: Path | str) -> int | None:
    """N when `path` is this process's /proc/<pid>/fd/N (an output pump's writer), else None."""
    found = re.fullmatch(rf"/proc/{os.getpid()}/fd/(\d+)", str(path))
    return int(found.group(1)) if found else None


class _ForkedProc:
    def __init__(self, pid: int, done: asyncio.Future[int]) -> None:
        self.pid = pid
        self._done = done

    @property
    def returncode(self) -> int | None:
        return self._done.result() if self._done.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._done)


def _end_unheld(answer: asyncio.Future[dict[str, Any]]) -> None:
    """The answer to a spawn its caller gave up on (cancelled): end the child it names."""
    if answer.cancelled() or answer.exception() is not None:
        return
    with contextlib.suppress(KeyError, TypeError, ValueError):
        pid = int(answer.result()["pid"])
        # itself first (it may not have called setsid yet, and can fork no more), then its group;
        # the pid is the server's unreaped child until it dies, so it names no one else
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        kill_group(pid, signal.SIGKILL)


class ForkServer:
    """The runner's client: `spawn(kind=...)` forks through the server."""

    KINDS = frozenset(_ENTRY)

    def __init__(self, registry: Registry, fallback: Any) -> None:
        self.registry = registry
        self.fallback = fallback  # the launcher for any other command
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._channel: socket.socket | None = None  # the runner's own fds go this way (SCM_RIGHTS)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._early: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    def launch(self, env: dict[str, str]) -> None:
        """Start the server process now (it imports while the caller does other work)."""
        ours, theirs = socket.socketpair()
        channel, their_channel = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", "from vault.runner.forkserver import serve; "
                                       f"serve({theirs.fileno()}, {their_channel.fileno()})"],
                pass_fds=(theirs.fileno(), their_channel.fileno()), env=env, stdin=subprocess.DEVNULL,
                cwd=str(IMPORT_ROOT))
        except OSError:
            ours.close()
            channel.close()
            raise
        finally:
            theirs.close()
            their_channel.close()
        self._channel = channel
        from vault.lineage import spawner_here
        spawner_here(self._proc.pid)  # what it starts that the runner never asked for is an agent's
        self._sock = ours

    async def connect(self) -> None:
        """Attach the launched server to the running loop."""
        assert self._sock is not None
        self._reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                msg = json.loads(line)
                if "exit" in msg:
                    fut = self._exits.pop(msg["exit"], None)
                    if fut is None:
                        self._early[msg["exit"]] = msg["code"]
                    elif not fut.done():
                        fut.set_result(msg["code"])
                    continue
                waiter = self._pending.pop(msg["id"], None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(msg)
        finally:
            for request in self._pending.values():
                if not request.done():
                    request.set_exception(RuntimeError("the fork server ended"))
            # its children died with it (PR_SET_PDEATHSIG: SIGKILL); say so, as a wait() would have
            for exit_ in self._exits.values():
                if not exit_.done():
                    exit_.set_result(-signal.SIGKILL)

    async def spawn(self, kind: str, args: list[str], *, env: dict[str, str], cwd: str, stdout: Path,
                    stderr: Path, jail: Any = None, keep: str | None = None) -> Any:
        ours = kind in self.KINDS or ((jail is not None or keep is not None) and kind in _KEPT_ONLY)
        if not ours or self._writer is None:
            return await self.fallback.spawn(kind, args, env=env, cwd=cwd, stdout=stdout, stderr=stderr,
                                             jail=jail, keep=keep)
        self._ids += 1
        rid = self._ids
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = answer
        req: dict[str, Any] = {"id": rid, "kind": kind, "args": args, "env": env, "cwd": cwd,
                               "stdout": str(stdout), "stderr": str(stderr),
                               "jail": jail.to_dict() if jail is not None else None, "keep": keep}
        fds: list[int] = []
        for key, path in (("stdout", stdout), ("stderr", stderr)):
            fd = _own_fd(path)
            if fd is not None:
                if fd not in fds:
                    fds.append(fd)
                req[f"{key}_fd"] = fds.index(fd)
        if fds and self._channel is not None:
            req["fds"] = len(fds)
            # sent before the line, with nothing awaited in between: the server finds them in order
            socket.send_fds(self._channel, [b"F"], fds)
        self._writer.write(json.dumps(req).encode() + b"\n")
        try:
            await self._writer.drain()
            msg = await asyncio.shield(answer)
        except asyncio.CancelledError:
            # the server forks it all the same: a child nobody holds would outlive its trial and
            # write into (or re-create) a home being removed; it is ended the moment its pid comes
            answer.add_done_callback(_end_unheld)
            raise
        if "error" in msg:
            raise RuntimeError(msg["error"])
        pid = int(msg["pid"])
        self.registry.add_group(pid)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if pid in self._early:
            done.set_result(self._early.pop(pid))
        else:
            self._exits[pid] = done
        return _ForkedProc(pid, done)

    def kill(self) -> None:
        """Last resort (the loop is gone): end the server; its children die with it."""
        if self._sock is not None:
            self._sock.close()
        if self._channel is not None:
            self._channel.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None
        elif self._sock is not None:
            self._sock.close()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._proc is not None:
            # EOF on its socket ends it at once; poll its exit, bounded
            deadline = time.monotonic() + 5
            while self._proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        if self._task is not None:
            self._task.cancel()
