"""`vaultsim daemon`, `vaultsim stop`, `vaultsim status`.

`daemon` without `--foreground` starts a detached child running the same
command in the foreground and returns once the child says, on an inherited
pipe, that its sockets serve (or prints the child's one-line error). Exit: 0
serving; 1 a daemon already serves the home (its pid named) or it failed; 2
bad input or the start was impossible (an unusable home, a full disk, a socket
path too long), always one line, never a traceback. Building the daemon's parts (keyring, store, diagnostics,
audit, executors) happens here so `vault.daemon.daemon` stays testable in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from vault.cli.main import add_home_arg, fail, interrupted_line, json_error, path_arg
from vault.cli.stdout import NO_ROOM
from vault.errors import BadInput, HomeError, RpcError, VaultError
from vault.atomic import open_append
from vault.home import VaultHome, write_private

if TYPE_CHECKING:  # imported where used: `vaultsim stop` and `status` need none of the daemon
    from vault.audit.writer import AuditWriter
    from vault.config import Resolved
    from vault.daemon.daemon import VaultDaemon
    from vault.daemon.diagnostics import Diagnostics
    from vault.executors.base import Executor
    from vault.store.keystore import KeyStore

_START_TIMEOUT_S = 20.0


def configure_daemon(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--foreground", action="store_true", help="run in this process (logs to stderr)")
    p.add_argument("--unlocked", action="store_true", help="start unlocked (default: locked)")
    p.add_argument("--config", type=path_arg, help="daemon config YAML (services, catalog, policy)")
    p.add_argument("--policy", type=path_arg, help="approval policy YAML (default: scenarios/policies/default.yaml)")
    p.add_argument("--catalog", type=path_arg, help="extra operations merged over the default catalog")
    p.add_argument("--remote", type=_base_url, help="base URL for every HTTP service not in the config")
    p.add_argument("--durability", choices=("default", "strict"),
                   help="audit log: default (a call's result record is written before the answer and synced "
                   "within 5 ms) or strict (synced before the answer); overrides the config's audit.durability")
    p.add_argument("--audit-segment-mib", type=float, metavar="MIB",
                   help="audit log: rotate segments past this size (default 64; config audit.segment_mib)")
    p.add_argument("--audit-keep-segments", type=int, metavar="N",
                   help="audit log: keep only the newest N rotated segments (default: all)")
    p.add_argument("--no-audit", action="store_true", help=argparse.SUPPRESS)
    # the runner hands the daemon its per-trial request mark here (vault.vouch); never argv
    p.add_argument("--mark-socket", help=argparse.SUPPRESS)
    # set by a background start for its foreground child: where to say "ready" or why not
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true",
                   help="once serving, print pid, home and sockets as JSON (not with --foreground)")


def _base_url(text: str) -> str:
    from vault.config import check_base_url
    try:
        return check_base_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_daemon(home: VaultHome, args: argparse.Namespace) -> VaultDaemon:
    """Assemble a VaultDaemon from CLI-style options (also used by tests and the runner)."""
    from vault.audit_events import PromptStats
    from vault.config import load_config
    from vault.daemon.daemon import VaultDaemon
    from vault.store.keystore import KeyStore
    from vault.store.credentials import CredentialStore

    def absolute(p: str | None) -> str | None:
        return str(Path(p).absolute()) if p else None

    config = load_config(absolute(args.config), home_config=home.config_file, remote_url=args.remote,
                         policy=absolute(args.policy), catalog=absolute(args.catalog))
    keystore = KeyStore(home)
    keystore.data_key()  # fail early and clearly if no keyring can hold the key
    store = CredentialStore(home, keystore)
    diagnostics = _diagnostics(home, keystore)
    audit = None if getattr(args, "no_audit", False) else _audit_log(home, keystore,
                                                                          audit_options(config, args))
    mark = None
    if getattr(args, "mark_socket", None):
        from vault.vouch import fetch
        try:
            mark = fetch(args.mark_socket)
        except OSError as exc:
            raise HomeError(f"could not get the request mark from {args.mark_socket}: "
                            f"{exc.strerror or exc}") from None
    daemon = VaultDaemon(home, config, unlocked=args.unlocked, keyring_backend=keystore.backend_name(),
                         store=store, diagnostics=diagnostics, audit=audit, executors=_executors(mark))
    if audit is not None:  # the prompt counts of runs that leave the daemon's memory go to the log
        log = audit

        def archive(run: str, counts: dict[str, Any]) -> None:
            # the counts are the stats' wire dict (vault.gate.stats): checked against the model here
            log.append_nowait(PromptStats.model_validate({"run_id": run, **counts}))
        daemon.gate.stats.archive = archive
    return daemon


def _executors(mark: str | None = None) -> dict[str, Executor]:
    # core parts, imported plainly: a broken import is a crash with a traceback at start,
    # never a daemon that answers every call with "service not configured"
    from vault.executors.http import HttpExecutor
    from vault.executors.ssh import SshExecutor
    return {"http": HttpExecutor(mark=mark), "ssh": SshExecutor()}


def _diagnostics(home: VaultHome, keystore: KeyStore) -> Diagnostics:
    from vault.daemon.diagnostics import Diagnostics
    return Diagnostics(home.diagnostics_dir, keystore.derive("diagnostics"))


def audit_options(config: Resolved, args: argparse.Namespace) -> dict[str, Any]:
    """The audit writer's options: the config's `audit` section, overridden by the command line."""
    from vault.config import AuditConfig
    base = config.audit
    changes = {name: value for name, value in (
        ("durability", getattr(args, "durability", None)),
        ("segment_mib", getattr(args, "audit_segment_mib", None)),
        ("keep_segments", getattr(args, "audit_keep_segments", None))) if value is not None}
    from pydantic import ValidationError
    try:
        chosen = AuditConfig.model_validate({**base.model_dump(), **changes})
    except ValidationError as exc:  # one line: which option, and what it must be
        from vault.catalog import format_validation_error
        raise BadInput(f"bad audit option: {format_validation_error(exc)}") from None
    return chosen.writer_options()


def _audit_log(home: VaultHome, keystore: KeyStore, options: dict[str, Any]) -> AuditWriter:
    # no fallback: a daemon whose audit package cannot load must not start without a log
    from vault.audit.adapter import open_audit
    return open_audit(home, keystore.derive("audit"), **options)


def run_daemon(args: argparse.Namespace) -> int:
    if args.json and args.foreground:
        raise BadInput("--json reports a background start; with --foreground the daemon logs to stderr")
    home = VaultHome.resolve(args.home)
    home.check_socket_paths()  # before anything is created for a start that cannot work
    home.ensure()
    if not args.foreground:
        for flag in ("config", "policy", "catalog"):
            # a FIFO or /dev/fd/N (`<(...)`) is not open in the detached child, which would wait on it
            value = getattr(args, flag)
            if value and Path(value).exists() and not Path(value).is_file():
                raise BadInput(f"--{flag}: {value} is not a regular file")
        return _spawn_background(home, args)
    from vault.proc_guard import make_undumpable
    make_undumpable()  # before any credential, key or token is read: memory closed to the same user
    report = _StartReport(getattr(args, "ready_fd", None))
    try:
        return _run_foreground(home, args, report)
    except VaultError as exc:
        # (an error raised `from None`, as the lock file's and the audit log's are, keeps its
        # OSError only as the context: a home out of inodes there was exit 1, "failed after starting")
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, OSError) and cause.errno in NO_ROOM:  # no room for its files: cannot start
            report.failed(f"cannot start: {exc.message}")
            _say(f"vaultsim daemon: cannot start: {exc.message}")
            return 2
        report.failed(exc.message)  # the background parent shows it, even if the log cannot be written
        raise
    finally:
        report.close()


def _run_foreground(home: VaultHome, args: argparse.Namespace, report: "_StartReport") -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s vaultsim[%(process)d] %(levelname)s %(message)s")
    from vault.daemon.instance import acquire_home_lock, check_home_files
    try:
        lock_fd = acquire_home_lock(home)
    except OSError as exc:
        return _cannot_start(exc, report)
    try:
        check_home_files(home)  # a directory or FIFO in place of one of its files: exit 2, left as found
    except BaseException:
        os.close(lock_fd)
        raise
    try:
        write_private(home.pid_file, f"{os.getpid()}\n".encode())
        daemon = build_daemon(home, args)
        from vault import pattern_budget
        pattern_budget.bound(pattern_budget.BUDGET_S)  # an agent's value cannot hold the event loop
        asyncio.run(_serve(daemon, report))
        if daemon.halted:  # its log failed (now or at stop): not a clean stop, whoever stopped it must know
            _say(f"vaultsim daemon: stopped; {daemon.halted}")
            return 1
        if daemon.stop_signal == signal.SIGINT:  # Ctrl-C: interrupted (130), as every command says
            _say(interrupted_line("daemon"))
            return 130
    except OSError as exc:  # a full disk, a socket that cannot be bound: one line, no traceback
        if report.ready:
            _say(f"vaultsim daemon: stopped: {_os_reason(exc)}")
            return 1
        return _cannot_start(exc, report)
    finally:
        # ours or a killed daemon's (this one holds the lock); a directory in its place is left
        # as found, and the start or stop still ends in its one line, not a traceback
        with contextlib.suppress(OSError):
            _remove_pid_file(home)
        os.close(lock_fd)
    return 0


def _remove_pid_file(home: VaultHome) -> None:
    """Remove the pid file unless it names another live process: a home that left its path
    (`umount -l`) shows another directory there, maybe with a second daemon's pid file."""
    from vault.daemon.instance import live_pid
    pid = live_pid(home)
    if pid is None or pid == os.getpid():
        home.pid_file.unlink(missing_ok=True)


async def _serve(daemon: VaultDaemon, report: "_StartReport") -> None:
    ready = asyncio.Event()
    serving = asyncio.create_task(daemon.serve(ready))
    waiting = asyncio.create_task(ready.wait())
    await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if ready.is_set():
        report.serving()
    waiting.cancel()
    await serving


def _cannot_start(exc: OSError, report: "_StartReport") -> int:
    message = f"cannot start: {_os_reason(exc)}"
    report.failed(message)
    _say(f"vaultsim daemon: {message}")
    return 2


def _say(line: str) -> None:
    """A line on stderr, which may be a log file on the very disk that is full."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def _os_reason(exc: OSError) -> str:
    why = exc.strerror or str(exc) or type(exc).__name__
    return f"{exc.filename}: {why}" if exc.filename else why


class _StartReport:
    """The foreground daemon's word to the `vaultsim daemon` that started it, on an
    inherited pipe: `ready PID` once both sockets serve, or `error MESSAGE`. A pipe and not
    the log, because a start that fails on a full disk cannot write its log."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.ready = False

    def serving(self) -> None:
        self.ready = True
        self._send(f"ready {os.getpid()}")

    def failed(self, message: str) -> None:
        if not self.ready:
            self._send("error " + " ".join(message.split()))

    def _send(self, line: str) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, (line + "\n").encode(errors="replace")[:4000])
        except OSError:
            pass  # the parent gave up waiting; its exit already said so
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _spawn_background(home: VaultHome, args: argparse.Namespace) -> int:
    running = daemon_status(home, timeout=2)
    if running is not None:
        return fail("daemon", args, f"a vaultsim daemon (pid {running.get('pid')}) already serves "
                    f"{home.root}; stop it with `vaultsim stop` first", 1, pid=running.get("pid"))
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-m", "vault.cli.main", "daemon", "--foreground", "--home", str(home.root),
            "--ready-fd", str(write_end)]
    for flag in ("config", "policy", "catalog", "remote"):
        value = getattr(args, flag)
        if value:
            argv += [f"--{flag}", str(Path(value).absolute()) if flag != "remote" else value]
    for flag in ("durability", "audit_segment_mib", "audit_keep_segments"):
        value = getattr(args, flag, None)
        if value is not None:
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    if args.unlocked:
        argv.append("--unlocked")
    try:
        log_fd = open_append(home.daemon_log)  # a FIFO put there: an error now, not a start waiting forever
        try:
            log_st = os.fstat(log_fd)
            if not stat.S_ISREG(log_st.st_mode):  # read back below by path: a FIFO would hang that read
                os.close(read_end)
                os.close(write_end)
                return fail("daemon", args, f"cannot start: {home.daemon_log} is not a regular file; the "
                            "vault will not use or replace it: move it out of the vault home", 2)
            start = log_st.st_size  # the log is appended to: show only what this start wrote
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                     start_new_session=True, close_fds=True, pass_fds=(write_end,))
        finally:
            os.close(log_fd)
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        return fail("daemon", args, f"cannot start: {_os_reason(exc)}", 2)
    os.close(write_end)  # the child holds it now: EOF means it exited (or closed it)
    deadline = time.monotonic() + _START_TIMEOUT_S
    with os.fdopen(read_end, "rb") as pipe:
        word = _read_word(pipe, deadline)
    if word.startswith("ready "):
        status = daemon_status(home, timeout=2) or {}
        halted = status.get("halted")
        if halted:
            # its first audit record failed: it would refuse every call for good and hold the home
            # (a second start, once the disk has room, would find it "already serving"): stopped
            # here, exit 2 like any start with no room
            child.terminate()
            if _wait(child, 10.0) is None:
                child.kill()
                child.wait()
        if args.json:
            print(json.dumps({"running": not halted, "pid": child.pid, "home": str(home.root),
                              "locked": status.get("locked"), "agent_socket": str(home.agent_sock),
                              "approver_socket": str(home.approver_sock), "log": str(home.daemon_log),
                              "halted": halted},
                             indent=2, sort_keys=True))
        elif not halted:
            print(f"vaultsim daemon: serving {home.root} (pid {child.pid})")
        if halted:
            print(f"vaultsim daemon: cannot serve calls: its first audit record failed ({halted}); "
                  "stopped it, nothing was served", file=sys.stderr)
            return 2
        return 0
    # it said why, or closed the pipe: either way it is on its way out (unless it hung)
    code = _wait(child, 10.0 if time.monotonic() < deadline else 0.5)
    if word.startswith("error "):
        return fail("daemon", args, word[len('error '):], 2 if code == 2 else 1)  # bad input stays bad input
    if code is None:
        # given up on: ended, so a daemon that comes up later does not hold the home unannounced
        child.terminate()
        if _wait(child, 2.0) is None:
            child.kill()
            child.wait()
        return fail("daemon", args, f"did not come up in time (stopped it); see {home.daemon_log}", 1,
                    log=str(home.daemon_log))
    tail = _tail(home.daemon_log, start)
    if not tail:
        free = _disk(home)["disk_free_bytes"]
        room = f"; {_size(free)} free on its disk" if free is not None else ""
        tail = f"(it wrote nothing to {home.daemon_log}{room})"
    code = 2 if child.returncode == 2 else 1
    print(f"vaultsim daemon: failed to start (exit {child.returncode}); "
          f"from {home.daemon_log}:", file=sys.stderr)
    print(tail, file=sys.stderr)
    json_error(args, f"failed to start (exit {child.returncode})", code, log=str(home.daemon_log),
               log_tail=tail)
    return code


def _read_word(pipe: IO[bytes], deadline: float) -> str:
    """One line from the starting daemon, "" on EOF or when the deadline passes."""
    import select
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([pipe], [], [], left)[0]:
            return ""
        chunk = os.read(pipe.fileno(), 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")


def _wait(child: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _tail(path: Path, offset: int = 0, n: int = 8) -> str:
    """The last `n` lines written to `path` after `offset`."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-n:])


def daemon_status(home: VaultHome, timeout: float = 5) -> dict[str, Any] | None:
    """The serving daemon's status, or None when nothing answers on the agent socket (or, when
    agents hold every connection it allows them, on the approver socket)."""
    from vault.client import ApproverClient, RpcClient
    from vault.jsonrpc import LIMIT
    try:
        with RpcClient(home.agent_sock, timeout=timeout) as c:
            status: dict[str, Any] = c.request("vault.status")
            return status
    except RpcError as exc:
        if exc.rpc_code != LIMIT:
            return None
    except (VaultError, OSError):
        return None
    try:  # the approver socket keeps connections agents cannot take
        with ApproverClient.for_home(home, name="vaultsim-status", timeout=timeout) as a:
            status = a.request("status")
            return status
    except (VaultError, OSError):
        return None


# ---- stop / status -----------------------------------------------------------

def configure_stop(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the daemon to exit")


def run_stop(args: argparse.Namespace) -> int:
    from vault.cli.daemon_probe import held_by
    home = VaultHome.resolve(args.home).check()
    held = held_by(home, wait_s=0)
    # a stopped daemon holds a client for its whole timeout: stopped by its signal at once
    status = daemon_status(home) if held is None or held.state != "stopped" else None
    if status is None:
        return _stop_unreachable(home, args.timeout)
    return _stop_serving(home, status, time.monotonic() + args.timeout, args.timeout)


def _stop_serving(home: VaultHome, status: dict[str, Any], deadline: float, timeout: float) -> int:
    from vault.client import ApproverClient
    with ApproverClient.for_home(home, name="vaultsim-stop") as c:
        c.request("shutdown")
    while time.monotonic() < deadline:
        if not _pid_alive(status.get("pid")):
            # its socket files may be left (a home remounted read-only): gone is gone
            print(f"vaultsim stop: daemon (pid {status['pid']}) stopped")
            return 0
        time.sleep(0.05)
    raise HomeError(_not_stopped(status["pid"], timeout))


def _stop_unreachable(home: VaultHome, timeout: float) -> int:
    """`stop` when no socket answers: a daemon still starting is waited for and stopped through
    its socket; one stopped (SIGSTOP) or cut off from its sockets is stopped by its signal
    (SIGTERM, and SIGCONT so that it can act on it: the same clean stop); else nothing to stop."""
    from vault.cli.daemon_probe import held_by
    deadline = time.monotonic() + timeout
    held = held_by(home)
    first = held
    # "cut off" is asked once more through the socket: one that was starting may have begun to
    # listen since it last failed to answer (it was then stopped by signal as "cut off")
    while held is not None and held.state in ("starting", "cut off") and time.monotonic() < deadline:
        status = daemon_status(home, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        if status is not None:  # it serves now: the ordinary stop, through its socket
            return _stop_serving(home, status, deadline, timeout)
        if held.state == "cut off":  # it listens and did not answer: cut off indeed
            break
        time.sleep(0.1)
        held = held_by(home)
    if held is None and first is not None and not _pid_alive(first.pid):  # it was stopping: it has
        print(f"vaultsim stop: daemon (pid {first.pid}) stopped")
        return 0
    if held is None:
        print(f"vaultsim stop: no daemon serves {home.root}", file=sys.stderr)
        return 1
    pid = held.pid
    if held.state != "stopping":  # one stopping is waited for: a TERM after its handlers are gone would cut its signing short
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)  # a stopped process acts on TERM only once continued
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            how = {"stopped": "it was stopped (SIGSTOP) and answered nothing",
                   "starting": "it had not started serving",
                   "stopping": "it was already stopping",
                   "cut off": "it answered on no socket (its socket files were removed or replaced)"}
            print(f"vaultsim stop: daemon (pid {pid}) stopped; {how[held.state]}")
            return 0
        time.sleep(0.05)
    raise HomeError(_not_stopped(pid, timeout))


def _not_stopped(pid: object, timeout: float) -> str:
    # said only "did not stop": a daemon stuck on its way out (a hung disk, a remote that never
    # answers) was left with no hint of what to do next
    return (f"daemon (pid {pid}) did not stop within {timeout:g}s; wait longer (`vaultsim stop "
            f"--timeout SECONDS`), or end it now with `kill -KILL {pid}` (what it had not yet written "
            "to its audit log is lost; `vaultsim audit verify` shows where the log ends)")


# `status` warns below this much free space (a full disk stops the audit log and every call):
# 512 MiB on a big disk, a tenth of a small one, never under LOW_DISK_FLOOR. A fixed 512 MiB
# warned at once on a 32 MiB disk with 27 MiB free, room for hundreds of thousands of records.
LOW_DISK_BYTES = 512 << 20
# the headroom the vault itself needs: thousands of audit records (about 1 KiB each), a
# rotation's new segment, and the temporary copy every all-or-nothing write makes
LOW_DISK_FLOOR = 8 << 20


def low_disk_bytes(total: int | None) -> int:
    """Free bytes under which `status` warns, for a disk of `total` bytes (None: unknown)."""
    if total is None:
        return LOW_DISK_BYTES
    return max(LOW_DISK_FLOOR, min(LOW_DISK_BYTES, total // 10))


def _disk(home: VaultHome) -> dict[str, int | None]:
    """How big the audit log is and how much room its disk has left (None where unknown)."""
    try:
        usage = shutil.disk_usage(home.root)
        free: int | None = usage.free
        total: int | None = usage.total
    except OSError:
        free = total = None
    from vault.audit.files import set_bytes
    size = set_bytes(home.audit_log)  # every kept segment
    return {"audit_log_bytes": size, "disk_free_bytes": free, "disk_total_bytes": total}


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


def _pid_alive(pid: Any) -> bool:
    import psutil
    try:
        return bool(pid) and psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# `vaultsim status` answers through its exit code, as `vault status` does (sealed: 2); a daemon
# whose audit log failed serves no call either, so it answers as a locked one does
STATUS_UNLOCKED, STATUS_NOT_RUNNING, STATUS_LOCKED = 0, 1, 2


def configure_status(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.description = (f"{p.description}\n\nexit: {STATUS_UNLOCKED} running and unlocked, "
                     f"{STATUS_NOT_RUNNING} no daemon running, {STATUS_LOCKED} running but locked (or serving no "
                     "calls: its audit log failed)")


def run_status(args: argparse.Namespace) -> int:
    from vault.cli.daemon_probe import held_by
    home = VaultHome.resolve(args.home)
    held = held_by(home, wait_s=0)
    # a stopped daemon would hold each socket's client for its whole timeout: said at once
    status = daemon_status(home) if held is None or held.state != "stopped" else None
    if status is None:
        out: dict[str, Any] = {"running": False, "home": str(home.root)}
        try:  # why none could serve here (a file, a directory open to others): said, exit still 1
            home.check()
        except VaultError as exc:
            out["home_unusable"] = exc.message
        if held is None or held.state != "stopped":
            held = held_by(home)  # (it may have started meanwhile, or stopped serving)
        if held is not None:  # a daemon starting, stopped, or cut off from its sockets: there, not serving
            out["held_by_pid"], out["held_state"], out["held_why"] = held.pid, held.state, held.why()
        try:
            from vault.store.keystore import KeyStore
            out["keyring_backend"] = KeyStore(home).backend_name()
        except Exception:  # status must answer even where no keyring works
            out["keyring_backend"] = "unavailable"
    else:
        out = {"running": True, **status}
    out.update(_disk(home))
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        if out["running"]:
            print(f"vaultsim daemon running (pid {out['pid']}) for {out['home']}")
            print(f"  locked: {out['locked']}   sessions: {out['sessions']}   pending approvals: "
                  f"{out['pending']}   approvers: {out['approvers']}")
            print(f"  keyring backend: {out['keyring_backend']}   audit: {'on' if out['audit'] else 'off'}")
            if out.get("halted"):
                print(f"  NOT SERVING CALLS: {out['halted']}")
            resumed = out.get("audit_resumed") or []
            if resumed and isinstance(resumed[-1], dict):  # the newest, once room came back
                last = resumed[-1]
                print(f"  audit log resumed after a full disk: {last.get('refused_calls')} calls refused "
                      f"for {last.get('halted_s')} s" + (f" ({len(resumed)} times)" if len(resumed) > 1 else ""))
        else:
            print(f"no vaultsim daemon serves {out['home']}")
            if "held_by_pid" in out:
                print(f"  but {out['held_why']}")
            if "home_unusable" in out:
                print(f"  and none can: {out['home_unusable']}")
            print(f"  keyring backend: {out['keyring_backend']}")
        if out["disk_free_bytes"] is not None:
            print(f"  audit log {_size(out['audit_log_bytes'])}; {_size(out['disk_free_bytes'])} free on its disk")
            if out["disk_free_bytes"] < low_disk_bytes(out["disk_total_bytes"]):
                print("  WARNING: the disk is nearly full; when the audit log cannot be written, "
                      "the daemon stops serving calls until there is room again")
    if not out["running"]:
        return STATUS_NOT_RUNNING
    return STATUS_LOCKED if out["locked"] or out.get("halted") else STATUS_UNLOCKED
