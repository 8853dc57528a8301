"""The world's processes for synchronous callers: daemon, fake remote, approver and agents.

`vault.runner.world.World` sets a whole trial up on the runner's event loop
(in-process remote, daemon through the launcher, scripted approver on the
loop). Tests of the daemon, its CLI and the remote, the demo's agents and the
benchmarks need the same parts one at a time, with the very arguments under
test, from synchronous code, as separate real processes. This module is where
they are started, so there is one way to start each (and tests/test_one_world.py
checks that nothing else starts them):

    vaultsim_argv / daemon_argv / agent_stub_argv / python_argv   the command lines
    home_env / agent_env          the environment of a home's daemon and CLI, of an agent
    Processes                     the processes one world started: start_daemon,
                                  start_remote, start_approver, start_agent, spawn;
                                  close() ends each by its own process group
    run_cli / run_agent           a command run to its end (its group ended after it)
    start_agent_async             an agent with pipes, for code on an event loop
    start_agent_relay             a relay agent process (the pytest plugin's clients)
    daemon_status                 whether (and what) a home's daemon answers

Every process starts in its own session, so ending its group ends whatever it
started. Readiness is polled with a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from vault.atomic import write_private
from vault.resources import IMPORT_ROOT as ROOT
from vault.runner.procs import PROGRAMS

READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.02
KEYRING_BACKEND = "vault.store.keyring_backend.FileKeyring"

# a child's stdin/stdout/stderr as subprocess takes it: a constant, a file descriptor or a file
Stream = int | IO[Any] | None


# ---- command lines and environments ----------------------------------------------------

def vaultsim_argv(*args: str) -> list[str]:
    """`vaultsim ARGS` as this interpreter runs it."""
    return [*PROGRAMS["daemon"], *args]


def daemon_argv(*args: str, unlocked: bool = True) -> list[str]:
    """`vaultsim daemon --foreground ARGS [--unlocked]`."""
    return vaultsim_argv("daemon", "--foreground", *args, *(["--unlocked"] if unlocked else []))


def agent_stub_argv(*args: str) -> list[str]:
    return [*PROGRAMS["agent_stub"], *args]


def python_argv(code: str, *args: str) -> list[str]:
    """A few lines of Python as a fresh process (the tests' scripted agents)."""
    return [PROGRAMS["daemon"][0], "-c", code, *args]


def home_env(root: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon and CLI serving `root/h`, its data key in the file keyring `root/kr`."""
    env = dict(os.environ if base is None else base)
    env.update({"VAULTSIM_HOME": str(root / "h"), "VAULTSIM_KEYRING_DIR": str(root / "kr"),
                "PYTHON_KEYRING_BACKEND": KEYRING_BACKEND, "PYTHONUNBUFFERED": "1"})
    env.pop("VAULTSIM_SOCKET", None)
    return env


def agent_env(base: Mapping[str, str], socket: Path, run_id: str | None = None,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An agent's environment under the agent contract: its socket, its run id."""
    env = {**base, "VAULTSIM_SOCKET": str(socket)}
    if run_id is not None:
        env["VAULTSIM_RUN_ID"] = run_id
    return {**env, **(extra or {})}


def daemon_status(agent_sock: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """The daemon's `vault.status` on its agent socket, or None while nothing answers."""
    from vault.client import RpcClient
    from vault.errors import VaultError
    try:
        with RpcClient(agent_sock, timeout=timeout) as client:
            status = client.request("vault.status")
    except (VaultError, OSError):
        return None
    return status if isinstance(status, dict) else None


# ---- ending processes ------------------------------------------------------------------

def kill_group(pid: int, sig: int) -> bool:
    """Signal a process group; False when it is gone (or not ours)."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> None:
    """`sig` to the process's group (SIGKILL after `timeout`), then reap it; a no-op once it was
    reaped (its pid may belong to someone else by now)."""
    if proc.poll() is not None:
        return
    if not kill_group(proc.pid, sig):
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    # reaped just now, so the group is still its own: whatever the leader left in it goes too
    kill_group(proc.pid, signal.SIGKILL)


def wait_until(pred: Callable[[], object], *, timeout: float, what: str,
               proc: subprocess.Popen[Any] | None = None, log: Path | None = None) -> None:
    """Poll `pred` until it is truthy; fail naming `what` (and the log's tail) at the deadline or
    when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while not pred():
        if proc is not None and proc.poll() is not None:
            raise WorldError(f"{what}: the process exited ({proc.returncode})", log)
        if time.monotonic() > deadline:
            raise WorldError(f"{what}: not within {timeout:g}s", log)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POLL_S)  # wakes at once if it dies
        else:
            time.sleep(POLL_S)  # polling, bounded by the deadline


class WorldError(AssertionError):
    """A part of the world did not come up; says which, with the tail of its log.

    An AssertionError, so a test whose set-up fails reads as a failure, not an error."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        if log is not None:
            with contextlib.suppress(OSError):
                message += "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        super().__init__(message)


# ---- processes run to their end --------------------------------------------------------

def run_to_end(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path = ROOT, input: str | None = None,
               timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a command in its own session to its end, its output captured; whatever it left in
    its group is killed afterwards. subprocess.TimeoutExpired at `timeout` (the group killed)."""
    proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, text=True, start_new_session=True,
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    finally:
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_cli(args: Sequence[str], *, env: Mapping[str, str], input: str | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`vaultsim ARGS` to its end. A background `vaultsim daemon` detaches into a session of its
    own, so killing this command's group after it leaves such a daemon running, as a user's would."""
    return run_to_end(vaultsim_argv(*args), env=env, input=input, timeout=timeout)


def run_agent(argv: Sequence[str], *, env: Mapping[str, str], timeout: float = 60.0,
              input: str | None = None) -> subprocess.CompletedProcess[str]:
    """An agent (`agent_stub_argv(...)`, `python_argv(...)`, any command) to its end."""
    return run_to_end(argv, env=env, input=input, timeout=timeout)


async def start_agent_async(argv: Sequence[str], *, env: Mapping[str, str], stderr: Stream = None,
                            cwd: Path = ROOT) -> asyncio.subprocess.Process:
    """An agent for code on an event loop: stdin and stdout are pipes, its own session."""
    return await asyncio.create_subprocess_exec(
        *argv, env=dict(env), cwd=cwd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=stderr, start_new_session=True)


def start_agent_relay(listen: Path, upstream: Path, *, env: Mapping[str, str],
                      cwd: Path) -> subprocess.Popen[bytes]:
    """A relay process (vault.agent_relay) that forwards `listen` to the agent socket `upstream`: the
    vault sees the relay as the agent, so its caller stays able to approve. Returns once it listens;
    RuntimeError with its stderr if it fails to."""
    proc = subprocess.Popen([PROGRAMS["daemon"][0], "-m", "vault.agent_relay", str(listen), str(upstream)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=dict(env), cwd=cwd)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "ready" once it listens; EOF if it failed
    if line.strip() != b"ready":
        proc.kill()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        proc.wait()
        raise RuntimeError(f"the agent relay did not start: {err.strip()}")
    return proc


# ---- a world's long-running processes ---------------------------------------------------

@dataclass(frozen=True)
class RemoteProcess:
    """The fake remote as a process: its URL and the token of its control API (/_sim/...)."""

    proc: subprocess.Popen[str]
    url: str
    sim_token: str

    @property
    def sim_headers(self) -> dict[str, str]:
        return {"X-Sim-Token": self.sim_token}


class Processes:
    """The processes one world started under `root`, each in its own session.

    `env` is the environment they get unless told otherwise (a home's: `home_env(root)`);
    `procs` lists them in start order; close() ends them, newest first."""

    def __init__(self, root: Path, env: Mapping[str, str], *, cwd: Path = ROOT,
                 procs: list[subprocess.Popen[Any]] | None = None) -> None:
        self.root = root
        self.env = dict(env)
        self.cwd = cwd
        self.procs: list[subprocess.Popen[Any]] = [] if procs is None else procs

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, text: bool = True,
              **popen: Any) -> subprocess.Popen[Any]:
        """Start any command of this world (popen: stdin/stdout/stderr and the like)."""
        proc: subprocess.Popen[Any] = subprocess.Popen(
            list(argv), env=dict(self.env if env is None else env), cwd=popen.pop("cwd", self.cwd), text=text,
            start_new_session=True, **popen)
        self.procs.append(proc)
        return proc

    def _log(self, name: str) -> IO[Any]:
        return open(self.root / name, "ab")

    def start_daemon(self, argv: Sequence[str], *, ready: Callable[[], object], log: str = "daemon.stderr",
                     env: Mapping[str, str] | None = None, timeout: float = READY_TIMEOUT_S) -> subprocess.Popen[str]:
        """A daemon command (`daemon_argv(...)`, or a test's own daemon script), its output to `log`;
        returns once `ready()` is truthy. WorldError, with the log's tail, if it exits first."""
        with self._log(log) as out:
            proc = self.spawn(argv, env=env, stdout=out, stderr=out)
        wait_until(ready, timeout=timeout, what="the daemon did not answer", proc=proc, log=self.root / log)
        return proc

    def start_remote(self, credentials: Mapping[str, str], *, fault: str | None = None,
                     timeout: float = READY_TIMEOUT_S) -> RemoteProcess:
        """`python -m vault.remote` accepting `credentials`, its events under root; returns once it listens."""
        creds = self._private("remote-creds.json", json.dumps(dict(credentials)))
        token = secrets.token_urlsafe(16)
        token_file = self._private("remote-sim-token", token)
        argv = [PROGRAMS["daemon"][0], "-m", "vault.remote", "--port", "0", "--credentials", str(creds),
                "--events", str(self.root / "remote-events.jsonl"), "--sim-token-file", str(token_file)]
        if fault:
            argv += ["--fault", fault]
        with self._log("remote.stderr") as err:
            proc = self.spawn(argv, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        line = _readline(proc, timeout)  # "... listening on URL" once it serves
        if "listening on " not in line:
            stop(proc)
            raise WorldError("the fake remote did not start", self.root / "remote.stderr")
        return RemoteProcess(proc, line.split("listening on ", 1)[1].strip(), token)

    def start_approver(self, script: Path, *, log: Path, subscribed: Callable[[], object],
                       timeout: float = READY_TIMEOUT_S) -> subprocess.Popen[str]:
        """`vaultsim approve --script SCRIPT --log LOG`; returns once `subscribed()` is truthy."""
        with self._log("approver.stderr") as err:
            proc = self.spawn(vaultsim_argv("approve", "--script", str(script), "--log", str(log)),
                              stdout=subprocess.DEVNULL, stderr=err)
        wait_until(subscribed, timeout=timeout, what="the approver did not subscribe", proc=proc,
                   log=self.root / "approver.stderr")
        return proc

    def start_agent(self, argv: Sequence[str], *, env: Mapping[str, str], log: str | None = None,
                    **popen: Any) -> subprocess.Popen[Any]:
        """An agent (`agent_stub_argv`, `python_argv`, any command) left running; with `log`, its
        stdout and stderr go to that file under root, stdin from /dev/null."""
        if log is None:
            return self.spawn(argv, env=env, **popen)
        with self._log(log) as out:
            return self.spawn(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              **popen)

    def _private(self, name: str, data: str) -> Path:
        path = self.root / name
        write_private(path, data.encode())  # 0600, all or nothing
        return path

    def running(self) -> int:
        return sum(1 for proc in self.procs if proc.poll() is None)

    def close(self) -> int:
        """End every process, newest first, each by its group; returns how many were still running.
        Idempotent: a reaped pid is never signalled again."""
        procs, self.procs[:] = list(self.procs), []
        running = sum(1 for proc in procs if proc.poll() is None)
        for proc in reversed(procs):
            with contextlib.suppress(Exception):
                stop(proc)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close()
        return running


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """One line of the process's stdout, or "" at EOF or after `timeout`."""
    import selectors
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline()
