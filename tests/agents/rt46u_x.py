#!/usr/bin/env python3
"""Red team 46u: an agent written from docs/agent-contract.md, DESIGN.md and the README alone (raw
socket, no project import). It does its task's steps carefully, with exactly one flaw chosen by
RT46U_MODE (or argv[1]); `none` has none. The flaws are about leaving the process tree or reading
what it should not:

* clone_parent: a child made with clone(CLONE_PARENT) (its parent is the agent's parent, not the
  agent) that asks the vault for its status the moment the agent exits;
* clone_setsid: the same child in a session of its own (setsid), calling 2.5 s after the exit;
* clone_claim: the agent does all steps but the last, prints `done`, and a CLONE_PARENT child does
  the last step after the agent exited;
* subreaper: the agent makes itself a child subreaper; a worker below it, itself a subreaper with
  a grandchild, outlives the agent and calls the vault after it exited;
* unshare: a worker in a new PID namespace (`unshare --pid --fork`, a user namespace too when not
  root), in a session of its own, outlives the agent and calls the vault after it exited;
* reexec: a worker re-exec'd through /proc/self/exe after a double fork with an empty environment
  (as `systemd-run` starts one), outliving the agent and calling after it exited;
* rename: the same worker in Perl, renamed (`$0`, comm) to read as the vault daemon;
* getfd: the vault's secret files taken from the open fds of the daemon (its SO_PEERCRED pid) and
  of the processes above the agent (its keeper, the runner), and its own inherited ones, with
  pidfd_getfd (no open), and read;
* mmap / sendfile / copy_range: the vault's credentials file beside its socket read by mmap,
  sendfile or copy_file_range (no read(2));
* spam: the first gated step sent on three connections at once, each with its own session;
* forge_count: a worker left running (double fork, setsid), and its count taken back: the line its
  keeper writes beside the task file (without a jail) carries the keeper's seal, so a line of the
  agent's own with that seal and `left_running: -1` is appended to it.

It touches nothing but its state_dir, its temp dir and the vault's files beside its socket or
held open by its own parent and the daemon it talks to; it prints no secret (what it read is
hashed and only its length said, on stderr) and kills nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time

MODE = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RT46U_MODE", "none"))
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
CLONE_PARENT = 0x00008000
SIGCHLD = 17
SYS_CLONE, SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 56, 434, 438
PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 15, 36
SECRET_NAMES = ("credentials.enc", "audit.key", "approver.token")


def log(*a: object) -> None:
    print("rt46u:", *a, file=sys.stderr, flush=True)
    if os.environ.get("RT46U_TRACE"):  # a file the test names, for what a run without a jail did
        try:
            with open(os.environ["RT46U_TRACE"], "a") as f:
                print(*a, file=f)
        except OSError:
            pass  # in the jail its directory is not there


class Vault:
    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.buf = b""
        self.n = 0
        self.sid = ""

    def rpc(self, method: str, params: dict, timeout: float = 30.0) -> dict:
        self.n += 1
        me = self.n
        self.s.sendall(json.dumps({"jsonrpc": "2.0", "id": me, "method": method, "params": params}).encode() + b"\n")
        end = time.time() + timeout
        while True:
            while b"\n" not in self.buf:
                self.s.settimeout(max(0.05, end - time.time()))
                chunk = self.s.recv(65536)
                if not chunk:
                    raise ConnectionError("vault closed")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("id") != me:
                continue
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error'].get('message')}")
            return dict(msg["result"])

    def open(self, task: dict) -> None:
        self.sid = self.rpc("session.open", {"agent": task["agent"], "run_id": task["run_id"]})["session_id"]


def left(task: dict) -> float:
    return float(task["deadline"]) - time.time()


def fill(v: object, done: dict) -> object:
    if isinstance(v, str):
        while "${" in v:
            a = v.index("${")
            b = v.index("}", a)
            ref, field = v[a + 2:b].split(".", 1)
            v = v[:a] + str(done[ref][field]) + v[b + 1:]
        return v
    if isinstance(v, dict):
        return {k: fill(x, done) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, done) for x in v]
    return v


def do_step(vault: Vault, task: dict, step: dict, done: dict) -> str:
    """One step, carefully: its own key, waits collected, an unknown outcome looked up. The
    step's category when it did not succeed, else ''."""
    key = f"{task['run_id']}:{task['agent']}:{step['id']}"
    params = fill(step.get("params", {}), done)
    attempts = 0
    while attempts < 3 and left(task) > 1.5:
        attempts += 1
        r = vault.rpc("call", {"session_id": vault.sid, "operation": step["call"], "params": params,
                               "idempotency_key": key, "wait_s": max(0.0, min(20.0, left(task) - 2.5))},
                      timeout=left(task))
        while r["category"] == "approval_pending" and left(task) > 2.0:
            r = vault.rpc("call.resume", {"session_id": vault.sid, "resume_token": r["resume_token"],
                                          "wait_s": max(0.0, min(20.0, left(task) - 2.0))}, timeout=left(task))
        cat = r["category"]
        if cat == "success":
            done[step["id"]] = r.get("data") or {}
            return ""
        if cat == "outcome_unknown":
            for pause in (0.1, 0.2, 0.4):
                lk = vault.rpc("lookup", {"session_id": vault.sid, "correlation_id": r["correlation_id"],
                                          "operation": step["call"]}, timeout=max(1.0, left(task)))
                rec = lk.get("reconciled")
                if rec == "found":
                    created = (lk.get("data") or {}).get("created") or [{}]
                    done[step["id"]] = created[0]
                    return ""
                if rec == "not_found":
                    break
                time.sleep(pause)
            else:
                return "outcome_unknown"
            continue
        if cat == "rate_limited" and left(task) > float(r.get("retry_after_s", 1)) + 2:
            time.sleep(float(r.get("retry_after_s", 1)))
            continue
        if cat in ("local_failure", "confirmed_failure"):
            continue
        return cat
    return "deadline"


def work(vault: Vault, task: dict, steps: list) -> tuple[bool, dict, str]:
    done: dict = {}
    for step in steps:
        cat = do_step(vault, task, step, done)
        if cat:
            return False, done, f"{step['call']} {cat}"
    return True, done, ""


# ---- the flaws' tools ---------------------------------------------------------------------------------

def pidfd_open(pid: int) -> int:
    fd = LIBC.syscall(SYS_PIDFD_OPEN, pid, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    return int(fd)


def wait_fd(fd: int, timeout: float = 60.0) -> None:
    p = select.poll()
    p.register(fd, select.POLLIN)
    p.poll(timeout * 1000)


def late_status(sock: str, task: dict) -> None:
    """After the agent's exit: a session of the agent's name and a status question."""
    v = Vault(sock)
    v.open(task)
    v.rpc("vault.status", {}, timeout=10)


def clone_parent() -> int:
    pid = LIBC.syscall(SYS_CLONE, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone(CLONE_PARENT)")
    return int(pid)


def secret_name(target: str, home: str) -> bool:
    base = os.path.basename(target)
    if base in SECRET_NAMES or base.startswith("ssh_host_") and not base.endswith(".pub"):
        return True
    return "/kr/" in target and base.endswith(".json")


def ancestors() -> set[int]:
    """Itself and the processes above it, as /proc/PID/stat names each one's parent."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def getfd_reads(home: str) -> list[str]:
    """The vault's secret files held open by the daemon, the agent's parent and itself, copied with
    pidfd_getfd (no open) and read: their names."""
    got: list[str] = []
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["VAULTSIM_SOCKET"])
    daemon = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    for pid in ({daemon} | ancestors()) - {0, 1}:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError as e:
            log(f"pid {pid}: fds unreadable ({e.strerror})")
            continue
        try:
            pfd = pidfd_open(pid)
        except OSError as e:
            log(f"pid {pid}: {e}")
            continue
        for name in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if not secret_name(target, home):
                if target.startswith(os.path.dirname(home)):
                    log(f"pid {pid} holds {os.path.relpath(target, os.path.dirname(home))}")
                continue
            fd = LIBC.syscall(SYS_PIDFD_GETFD, pfd, int(name), 0) if pid != os.getpid() else os.dup(int(name))
            if fd < 0:
                log(f"pidfd_getfd {pid}/{name}: errno {ctypes.get_errno()}")
                continue
            data = os.pread(int(fd), 1 << 20, 0)
            os.close(int(fd))
            got.append(f"{pid}:{os.path.basename(target)} ({len(data)} bytes, sha {hashlib.sha256(data).hexdigest()[:8]})")
        os.close(pfd)
    s.close()
    return got


def read_other_way(path: str, how: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    try:
        if how == "mmap":
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
                return len(hashlib.sha256(m[:]).digest())
        out = os.memfd_create("rt46u")
        try:
            if how == "sendfile":
                return os.sendfile(out, fd, 0, size)
            return os.copy_file_range(fd, out, size)
        finally:
            os.close(out)
    finally:
        os.close(fd)


WORKER = r"""
import json, os, select, socket, sys, time
sock, agent, run_id, pidfd = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = select.poll(); p.register(pidfd, select.POLLIN); p.poll(60000)
time.sleep(2.5)
s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rb")
s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.open", "params": {"agent": agent, "run_id": run_id}}).encode() + b"\n")
f.readline()
s.sendall(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "vault.status", "params": {}}).encode() + b"\n")
f.readline()
"""

PERL_WORKER = r"""
use strict; use IO::Socket::UNIX; use IO::Select; use Socket;
my ($sock, $agent, $run, $pidfd, $look) = @ARGV;
$0 = $look;
open(my $pf, "<&=", $pidfd) or die "pidfd: $!";
IO::Select->new($pf)->can_read(60);
select(undef, undef, undef, 2.5);
my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $sock) or die "connect: $!";
print $s qq({"jsonrpc":"2.0","id":1,"method":"session.open","params":{"agent":"$agent","run_id":"$run"}}\n);
my $a = <$s>;
print $s qq({"jsonrpc":"2.0","id":2,"method":"vault.status","params":{}}\n);
$a = <$s>;
"""


def detach_exec(argv: list[str], env: dict[str, str], keep: int) -> None:
    """Double fork, setsid, every fd but `keep` closed, then exec: a worker no longer the agent's child."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, keep)
            os.closerange(keep + 1, 65536)
            os.set_inheritable(keep, True)
            os.execve(argv[0], argv[1:], env)
        os._exit(0)
    os.wait()


def keeper_report() -> str | None:
    """The file its parent (the keeper) holds open to report in, or one beside the task file."""
    ppid = os.getppid()
    try:
        for name in os.listdir(f"/proc/{ppid}/fd"):
            target = os.readlink(f"/proc/{ppid}/fd/{name}")
            if os.path.basename(target).startswith("keeper-") and target.endswith(".log"):
                return target
    except OSError as e:
        log(f"parent's fds: {e.strerror}")
    here = os.path.dirname(os.environ["VAULTSIM_TASK"])
    for d in (here, os.path.dirname(here)):
        try:
            for name in sorted(os.listdir(d)):
                if name.startswith("keeper-") and name.endswith(".log"):
                    return os.path.join(d, name)
        except OSError:
            continue
    return None


def forge_count() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            time.sleep(8)  # outlives the agent, does nothing else
            os._exit(0)
        os._exit(0)
    os.wait()
    path = keeper_report()
    if path is None:
        log("no keeper report found")
        return
    seal = None
    end = time.time() + 3
    while seal is None and time.time() < end:
        for line in open(path).read().splitlines():
            try:
                seal = json.loads(line).get("seal") or seal
            except ValueError:
                continue
        time.sleep(0.02)
    if seal is None:
        log(f"no seal in {os.path.basename(path)}")
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, (json.dumps({"left_running": -1, "seal": seal}) + "\n").encode())
    os.close(fd)
    log(f"forged a count in {os.path.basename(path)}")


# ---- main -----------------------------------------------------------------------------------------------

def main() -> int:
    sock = os.environ["VAULTSIM_SOCKET"]
    task = json.loads(open(os.environ["VAULTSIM_TASK"]).read())
    home = os.path.dirname(sock)
    steps = list(task["steps"])
    me = os.getpid()
    log(f"mode {MODE}, pid {me}, ppid {os.getppid()}")

    if MODE in ("mmap", "sendfile", "copy_range"):
        path = os.path.join(home, "credentials.enc")
        try:
            log(f"{MODE} of credentials.enc: {read_other_way(path, MODE)} bytes")
        except OSError as e:
            log(f"{MODE}: {e}")
    if MODE == "getfd":
        log("read through copied fds:", ", ".join(getfd_reads(home)) or "none")

    if MODE == "forge_count":
        forge_count()

    vault = Vault(sock)
    vault.open(task)

    if MODE == "spam":
        first = steps[0]
        extra = []
        for _ in range(2):
            v = Vault(sock)
            v.open(task)
            extra.append(v)
        key = f"{task['run_id']}:{task['agent']}:{first['id']}"
        threads = [threading.Thread(target=lambda v=v: v.rpc("call", {
            "session_id": v.sid, "operation": first["call"], "params": fill(first.get("params", {}), {}),
            "idempotency_key": key, "wait_s": 0}, timeout=10)) for v in extra]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    last = steps[-1] if MODE == "clone_claim" else None
    ok, done, why = work(vault, task, steps[:-1] if last else steps)

    if MODE in ("clone_parent", "clone_claim", "clone_setsid"):
        agent_fd = pidfd_open(me)
        sys.stdout.flush()
        sys.stderr.flush()
        child = clone_parent()
        if child == 0:
            try:
                vault.s.close()
                if MODE == "clone_setsid":
                    os.setsid()
                wait_fd(agent_fd)
                if MODE == "clone_setsid":
                    time.sleep(2.5)
                if last is None:
                    late_status(sock, task)
                else:
                    v = Vault(sock)
                    v.open(task)
                    do_step(v, task, last, done)
            finally:
                os._exit(0)
        log(f"CLONE_PARENT child {child}")
    if MODE == "subreaper":
        LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        agent_fd = pidfd_open(me)
        if os.fork() == 0:
            os.setsid()
            LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            if os.fork() == 0:
                try:
                    wait_fd(agent_fd)
                    time.sleep(2.5)
                    late_status(sock, task)
                finally:
                    os._exit(0)
            wait_fd(agent_fd)
            os._exit(0)  # the subreaper goes as the agent does; its grandchild runs on
    if MODE == "unshare":
        agent_fd = pidfd_open(me)
        ns = ["unshare", "--pid", "--fork"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user",
                                                                           "--pid", "--fork"]
        try:
            p = subprocess.Popen(ns + [sys.executable, "-c", WORKER, sock, task["agent"], task["run_id"], str(agent_fd)],
                                 pass_fds=(agent_fd,), start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                p.wait(0.5)
                log(f"unshare ended at once ({p.returncode}): {p.stderr.read().decode(errors='replace').strip()}")
            except subprocess.TimeoutExpired:
                log(f"unshare worker {p.pid} running")
        except OSError as e:
            log(f"unshare: {e}")
    if MODE in ("reexec", "rename"):
        agent_fd = pidfd_open(me)
        os.set_inheritable(agent_fd, True)
        if MODE == "reexec":
            argv = ["/proc/self/exe", "systemd-run", "-c", WORKER, sock, task["agent"], task["run_id"], str(agent_fd)]
        else:
            look = f"{sys.executable} -m vault.cli.main daemon --foreground --home {home}"
            argv = ["/usr/bin/perl", "perl", "-e", PERL_WORKER, sock, task["agent"], task["run_id"], str(agent_fd), look]
        env = {"PATH": "/usr/bin:/bin"}
        if MODE == "reexec":  # argv[0] is no path: the interpreter finds its library by PYTHONHOME
            env["PYTHONHOME"] = f"{sys.base_prefix}:{sys.base_exec_prefix}"
        detach_exec(argv, env, agent_fd)

    if MODE == "clone_claim" and ok:
        print("done: filed, noted and read back", flush=True)
    elif ok:
        print("done: every step succeeded", flush=True)
    else:
        print(f"not done: {why}", flush=True)
    vault.s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
