"""Run catalog commands on a host through the real OpenSSH client.

Why this shape: the agent must never hold the key, and a dropped SSH
connection must never be reported as "the command failed". So the vault runs
`ssh` itself with the key written to a private file for the length of one
call, and the remote command runs inside a marker wrapper
(`ssh_markers`) that records a start marker before it changes anything and a
completion marker after. What the executor says is decided by the evidence:

    evidence                                          category              remote_touched
    ------------------------------------------------  --------------------  --------------
    a parameter refused (declarations, or `..`,       local_failure         False
      `/`, a leading `-`: vault/param_safety.py),
      nothing spawned
    connect refused / timed out, host key not         local_failure         False
      trusted, command never sent
    "Permission denied (publickey)" before auth       authentication_failed False
    completion marker, exit 0                         success               True
    completion marker, exit != 0                      confirmed_failure     True
    markers dir unusable (wrapper said so)            confirmed_failure     True
    same op id already started earlier                its recorded outcome, or outcome_unknown
    client killed / died / deadline after the         outcome_unknown       True
      command was sent; worker ended without marker   (retry reconcile_first)

"Sent" is read from the client's own `-v` log ("Sending command"), which is
written before the exec request leaves, so an early kill errs towards
outcome_unknown, never towards a false "nothing ran".

`lookup()` reads the markers over a fresh connection (op id: the idempotency
key if given, else the correlation id). An answered lookup is `success` (of
the lookup, as in the http executor); `reconciled` and `data.state` carry the
answer:

    markers on the host                          reconciled  data.state
    -------------------------------------------  ----------  -----------------------
    completion marker                            found       completed (+ exit_status)
    start marker, recorded pid still running     unknown     in_progress
    start marker, process gone, no completion    unknown     interrupted: started, did
                                                             not complete, may be partial
    no start marker                              not_found   not_started (nothing ran)

A lookup that could not ask is its own failure (`authentication_failed`,
`local_failure`, or `outcome_unknown` if the answer was lost) with
`reconciled="unknown"`. "Still running" is checked by pid plus the /proc start
time recorded in the start marker, so a reused pid does not look alive.

A command whose client died before the wrapper wrote its start marker can
still start a moment later (the exec request may be in flight), so
`not_found` is only trustworthy once the original call has returned.

ServiceConfig: host, port (22), user, known_hosts (required: no host key, no
connection). Options: `markers_dir` (remote path), `connect_timeout` (s,
default 10, capped by the call deadline), `timeout` (s, when the call has no
deadline; default 300).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from vault.atomic import write_all
from vault.catalog import Operation
from vault.models import Category, make_result
from vault.store.secret import Secret
from vault.executors import ssh_markers as markers
from vault.executors.base import CallContext, ExecOutcome, Executor, ServiceConfig

SpawnHook = Callable[[asyncio.subprocess.Process, str], None]

_PHASES = ("spawned", "connected", "authenticated", "command_sent", "remote_started")


@dataclass
class _Run:
    """What one ssh client process did, as far as its own output tells."""

    returncode: int | None = None
    stdout: list[str] = field(default_factory=list)
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    phase: str = "not_started"
    timings: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    spawn_error: str | None = None

    def reached(self, phase: str) -> bool:
        return self.phase in _PHASES and _PHASES.index(self.phase) >= _PHASES.index(phase)

    def stderr_text(self) -> str:
        return "\n".join(self.errors)


class SshExecutor(Executor):
    kind = "ssh"

    def __init__(self, *, ssh_binary: str = "ssh", on_spawn: SpawnHook | None = None) -> None:
        self.ssh_binary = ssh_binary
        # test hook: called with the client process and "execute"/"lookup"
        # right after it starts, so a test can kill exactly that client
        self.on_spawn = on_spawn

    # -- execute -----------------------------------------------------------------

    async def execute(
        self, op: Operation, params: dict[str, Any], credential: Secret,
        service: ServiceConfig, ctx: CallContext,
    ) -> ExecOutcome:
        # declarations, and no '..', '/', '-x' or control character
        # (asked once per call: by the daemon before the gate, or here)
        refused = None if ctx.params_checked else op.refusal(params)
        if refused is not None:
            result = make_result(Category.local_failure, op.name, ctx.correlation_id,
                                 f"The command was not sent ({refused}); nothing ran on the host.")
            return ExecOutcome(result, {"transport": "ssh", "purpose": "execute", "refused": refused},
                               remote_touched=False)
        command = (op.command or "").format(**{k: shlex.quote(str(v)) for k, v in params.items()})
        op_id = markers.op_id_for(ctx.correlation_id, ctx.idempotency_key)
        remote = markers.execute_call(op_id, ctx.correlation_id, self._markers_dir(service), command)
        run = await self._ssh(remote, credential, service, ctx, "execute")
        diag = self._diagnostic(run, service, "execute", op_id)
        verdict = markers.parse_execute(run.stdout)
        diag.update(verdict={"kind": verdict.kind, "exit_status": verdict.exit_status,
                             "duplicate": verdict.duplicate, "remote_pid": verdict.spawned_pid,
                             "error": verdict.error})
        category, message, data = self._classify_execute(run, verdict)
        touched = run.reached("command_sent") or verdict.kind is not None
        result = make_result(category, op.name, ctx.correlation_id, message,
                             **({"data": data} if data is not None else {}))
        return ExecOutcome(result, diag, remote_touched=touched)

    def _classify_execute(
        self, run: _Run, v: markers.ExecVerdict,
    ) -> tuple[Category, str, dict[str, Any] | None]:
        again = " under this operation id; it was not run again" if v.duplicate else ""
        if v.kind == "done" and v.exit_status is not None:
            data: dict[str, Any] = {"exit_status": v.exit_status}
            if v.duplicate:
                data["replayed"] = True
            if v.exit_status == 0:
                return Category.success, f"The command completed on the host{again}.", data
            return (Category.confirmed_failure,
                    f"The command ran on the host and exited with status {v.exit_status}{again}.", data)
        if v.kind == "pending":
            return (Category.outcome_unknown,
                    "This operation id was already started on the host and has not completed; "
                    "it was not run again. Look it up before retrying.", None)
        if v.kind == "error":
            return (Category.confirmed_failure,
                    "The host could not record operation markers; the command was not run.", None)
        if v.kind == "incomplete":
            return (Category.outcome_unknown,
                    "The command started on the host and did not complete; its effect may be partial. "
                    "Inspect the host before running it again.", None)
        # no verdict from the wrapper: decide from how far the client got
        if run.reached("command_sent"):
            why = "timed out" if run.timed_out else "was interrupted"
            return (Category.outcome_unknown,
                    f"The SSH connection {why} after the command was sent; remote completion is unknown.",
                    None)
        return self._before_command(run)

    def _before_command(self, run: _Run) -> tuple[Category, str, dict[str, Any] | None]:
        """Failures where the command never left: nothing ran on the host."""
        err = run.stderr_text()
        if run.spawn_error:
            # spawn_error texts are ours: no path contents, never the key
            return (Category.local_failure,
                    f"The SSH call could not be started ({run.spawn_error}); the command was not run.", None)
        if "Permission denied" in err and not run.reached("authenticated"):
            return (Category.authentication_failed,
                    "The host refused the SSH key; the command was not run.", None)
        if ("Host key verification failed" in err or "REMOTE HOST IDENTIFICATION HAS CHANGED" in err
                or "host key is known" in err):
            return (Category.local_failure,
                    "The host's key is not the trusted one; refused to connect, the command was not run.",
                    None)
        if "Connection refused" in err:
            return Category.local_failure, "The host refused the connection; the command was not run.", None
        if run.timed_out or "timed out" in err:
            return (Category.local_failure,
                    "Timed out before the command was sent; the command was not run.", None)
        return Category.local_failure, "The SSH connection failed before the command was sent.", None

    # -- lookup ------------------------------------------------------------------

    async def lookup(
        self, op: Operation, credential: Secret, service: ServiceConfig,
        ctx: CallContext, *, correlation_id: str | None, idempotency_key: str | None,
    ) -> ExecOutcome:
        names = []
        if idempotency_key:
            names.append(markers.op_id_for(None, idempotency_key))
        if correlation_id:
            names.append(markers.safe_name(correlation_id))
        if not names:
            return ExecOutcome(make_result(
                Category.success, op.name, ctx.correlation_id,
                "A lookup needs the correlation id or idempotency key of the earlier call.",
                reconciled="unknown"))
        remote = markers.lookup_call(names, self._markers_dir(service))
        run = await self._ssh(remote, credential, service, ctx, "lookup")
        diag = self._diagnostic(run, service, "lookup", names[0])
        found = markers.parse_lookup(run.stdout)
        diag["lookup"] = {"state": found.state, "exit_status": found.exit_status,
                          "remote_pid": found.pid, "op_id": found.op_id}
        category, reconciled, message, data = self._classify_lookup(run, found)
        result = make_result(category, op.name, ctx.correlation_id, message, reconciled=reconciled,
                             **({"data": data} if data is not None else {}))
        return ExecOutcome(result, diag, remote_touched=run.reached("command_sent"))

    def _classify_lookup(
        self, run: _Run, f: markers.LookupVerdict,
    ) -> tuple[Category, str, str, dict[str, Any] | None]:
        # an answered lookup is a success *of the lookup* (as in the http
        # executor); `reconciled` and `data.state` say what the operation did
        if f.state == "found" and f.exit_status is not None:
            data = {"state": "completed", "exit_status": f.exit_status}
            if f.exit_status == 0:
                return (Category.success, "found",
                        "The command completed on the host (exit status 0); do not repeat it.", data)
            return (Category.success, "found",
                    f"The command ran to completion on the host and failed with exit status "
                    f"{f.exit_status}.", data)
        if f.state == "found":
            return (Category.success, "unknown",
                    "The command finished on the host but its exit status is unreadable.",
                    {"state": "completed"})
        if f.state == "running":
            return (Category.success, "unknown",
                    "The command is still running on the host; look it up again later.",
                    {"state": "in_progress"})
        if f.state == "stopped":
            return (Category.success, "unknown",
                    "The command started on the host and did not complete; its effect may be partial. "
                    "Inspect the host before running it again.", {"state": "interrupted"})
        if f.state == "none":
            return (Category.success, "not_found",
                    "The host has no record of this operation starting; nothing ran.",
                    {"state": "not_started"})
        # the lookup itself failed: the earlier operation stays unknown
        if not run.reached("command_sent"):
            category, why, _ = self._before_command(run)
            return (category, "unknown",
                    f"The lookup failed, so the earlier operation's effect is still unknown. {why}", None)
        return (Category.outcome_unknown, "unknown",
                "The lookup got no answer from the host; the earlier operation's effect is still unknown.",
                None)

    # -- the ssh client ----------------------------------------------------------

    def _markers_dir(self, service: ServiceConfig) -> str:
        return str(service.options.get("markers_dir") or markers.DEFAULT_MARKERS_DIR)

    def _deadline(self, service: ServiceConfig, ctx: CallContext) -> float:
        if ctx.deadline is not None:
            return ctx.deadline
        return time.monotonic() + float(service.options.get("timeout", 300.0))

    def _argv(self, key_path: str, service: ServiceConfig, remaining: float, remote: str) -> list[str]:
        connect = min(float(service.options.get("connect_timeout", 10.0)), remaining)
        opts = {
            "IdentitiesOnly": "yes", "IdentityAgent": "none", "BatchMode": "yes",
            "StrictHostKeyChecking": "yes", "UserKnownHostsFile": service.known_hosts,
            "GlobalKnownHostsFile": "/dev/null", "UpdateHostKeys": "no", "CheckHostIP": "no",
            "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
            "PubkeyAuthentication": "yes", "ConnectTimeout": str(max(1, int(connect + 0.999))),
            "ConnectionAttempts": "1", "ServerAliveInterval": "5", "ServerAliveCountMax": "3",
            "ControlMaster": "no", "ControlPath": "none", "ForwardAgent": "no",
            "ForwardX11": "no", "ClearAllForwardings": "yes", "PermitLocalCommand": "no",
            "EscapeChar": "none", "RequestTTY": "no",
        }
        argv = [self.ssh_binary, "-F", "/dev/null", "-v", "-i", key_path]
        for name, value in opts.items():
            argv += ["-o", f"{name}={value}"]
        argv += ["-p", str(service.port or 22), f"{service.user}@{service.host}", remote]
        return argv

    async def _ssh(
        self, remote: markers.RemoteCall, credential: Secret, service: ServiceConfig,
        ctx: CallContext, purpose: str,
    ) -> _Run:
        run = _Run()
        start = time.monotonic()
        deadline = self._deadline(service, ctx)
        problem = _service_problem(service)
        if problem:
            run.spawn_error = problem
            run.errors.append(problem)
            return run
        own_dir = None
        workdir = ctx.workdir
        if workdir is None:
            own_dir = workdir = tempfile.mkdtemp(prefix="vaultsim-ssh-")  # 0700
        key_path = os.path.join(workdir, f"id-{os.urandom(6).hex()}")
        try:
            try:
                _write_private(key_path, credential)
            except OSError as exc:
                run.spawn_error = f"cannot write key file: {exc.strerror}"
                run.errors.append(run.spawn_error)
                return run
            argv = self._argv(key_path, service, max(0.0, deadline - time.monotonic()), remote.command)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=_client_env(),
                )
            except OSError as exc:
                run.spawn_error = f"cannot start {self.ssh_binary}: {exc.strerror}"
                run.errors.append(run.spawn_error)
                return run
            self._mark(run, "spawned", start)
            if self.on_spawn is not None:
                self.on_spawn(proc, purpose)
            await self._collect(proc, run, start, deadline, remote.script.encode())
        finally:
            _remove(key_path)
            if own_dir is not None:
                shutil.rmtree(own_dir, ignore_errors=True)
        run.timings["total"] = round(time.monotonic() - start, 3)
        return run

    async def _collect(self, proc: asyncio.subprocess.Process, run: _Run, start: float,
                       deadline: float, script: bytes) -> None:
        async def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(script)
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client died before taking the script; its log says why

        async def out() -> None:
            assert proc.stdout is not None
            async for line in _lines(proc.stdout):
                if line.startswith("vaultsim:"):
                    run.stdout.append(line)
                    if line.startswith("vaultsim:spawned"):
                        self._mark(run, "remote_started", start)

        async def err() -> None:
            assert proc.stderr is not None
            async for line in _lines(proc.stderr):
                if line.startswith("debug1: Connection established"):
                    self._mark(run, "connected", start)
                elif line.startswith("Authenticated to ") or "Authentication succeeded" in line:
                    self._mark(run, "authenticated", start)
                elif line.startswith("debug1: Sending command"):
                    self._mark(run, "command_sent", start)
                elif not line.startswith("debug") and line.strip():
                    run.errors.append(line[:300])

        readers = asyncio.gather(feed(), out(), err())
        try:
            await asyncio.wait_for(proc.wait(), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            run.timed_out = True
            _kill(proc)
            await proc.wait()
        except asyncio.CancelledError:
            _kill(proc)
            await proc.wait()
            readers.cancel()
            raise
        run.returncode = proc.returncode
        # drain what the client wrote before it exited: its last log lines say
        # how far it got (e.g. "Sending command" just before a kill)
        try:
            await asyncio.wait_for(readers, timeout=5.0)
        except TimeoutError:
            pass

    @staticmethod
    def _mark(run: _Run, phase: str, start: float) -> None:
        if not run.reached(phase):
            run.phase = phase
        run.timings.setdefault(phase, round(time.monotonic() - start, 3))

    def _diagnostic(self, run: _Run, service: ServiceConfig, purpose: str, op_id: str) -> dict[str, Any]:
        rc = run.returncode
        return {
            "transport": "ssh", "purpose": purpose,
            "target": f"{service.user}@{service.host}:{service.port or 22}",
            "op_id": op_id, "markers_dir": self._markers_dir(service) or "$HOME/.vaultsim-markers",
            "ssh_exit_status": rc if rc is None or rc >= 0 else None,
            "ssh_killed_by_signal": -rc if rc is not None and rc < 0 else None,
            "timed_out": run.timed_out, "phase": run.phase,
            "stderr_tail": list(run.errors), "timings_s": dict(run.timings),
        }


def _service_problem(service: ServiceConfig) -> str | None:
    if not service.host or not service.user:
        return "service has no host or user"
    if service.host.startswith("-") or service.user.startswith("-"):
        return "service host or user is not a plain name"
    if not service.known_hosts:
        # without a pinned host key, a connection proves nothing about the host
        return "service has no known_hosts file"
    return None


def _write_private(path: str, credential: Secret) -> None:
    """Write the key 0600, exclusively, never following a planted symlink."""
    text = credential.reveal()
    if not text.endswith("\n"):
        text += "\n"  # OpenSSH rejects a key file without its final newline
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        write_all(fd, text.encode())  # a cut-short key would fail as "permission denied"
    except BaseException:
        os.close(fd)
        _remove(path)
        raise
    os.close(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _client_env() -> dict[str, str]:
    # no SSH_AUTH_SOCK, no user variables: only what ssh needs to run
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


def _kill(proc: asyncio.subprocess.Process) -> None:
    try:
        proc.kill()
    except ProcessLookupError:
        pass


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[str]:
    """Decoded lines of a stream, tolerant of overlong lines and bad bytes."""
    buf = b""
    while True:
        chunk = await stream.read(4096)
        if not chunk:
            break
        buf += chunk
        *complete, buf = buf.split(b"\n")
        for raw in complete:
            yield raw.decode("utf-8", "replace").rstrip("\r")
        if len(buf) > 65536:
            buf = buf[-4096:]  # an endless line: keep only its tail
    if buf:
        yield buf.decode("utf-8", "replace")
