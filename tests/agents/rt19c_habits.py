#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone (red team, nineteenth pass, c).

The contract's rules are tests/agents/careful.py's (itself written from the page alone); this
agent adds habits a real-world careful agent has, each a knob (comma-separated in RT19C):

  stdin     reads its task from stdin first (a JSON document there wins), else $VAULTSIM_TASK
  sqlite    keeps its state in an SQLite database (WAL journal) in state_dir, not a JSON file
  links     versioned state files, `current` a symlink to the newest, old ones hard-linked
  ro        state and scratch files made read-only (0400), a read-only (0500) directory too
  sock      a helper thread serves a Unix socket in $TMPDIR (left behind, as Python does) and a FIFO
  fds       children started with close_fds=False while the vault connection is open (a
            `sh -c` each step; a log shipper for the whole run, ended and reaped before exit)
  daemon    a double-forked helper (setsid) that the agent ends before it exits, waiting for its
            end on a pipe the helper holds (pidwait: by polling its pid)
  pgrp      the work done by a child in a process group of its own (start_new_session), the
            parent reaping it and printing the child's final message
  home      scratch in $HOME/.cache, $TMPDIR and /dev/shm (the /dev/shm one removed at once, the
            $HOME one at the end; a read-only home tolerated)
  jsonlog   a JSON line per event on stderr (logging framework style), also after the final
            message ("exiting")
  closeout  stdout and stderr closed after the final message, then a second of cleanup
  slow      each step started only after a pause, the work ending ~1.5 s before the deadline
  latin1    stdout written in ISO-8859-1 (a locale habit), with accented text in log lines
  utf16     stdout written as UTF-16 (a BOM, then two bytes a character)
  venv      a virtualenv made in $TMPDIR (--without-pip) and the work re-run from its python
  lookupkey an unknown outcome looked up by its idempotency key (and operation), not correlation id
  verify    every success of a mutating step confirmed with a `lookup` (always allowed)
  hostpid   `session.open` with a client {name, version, via, host_pid: getppid() where >= 1}
  statuspoll a second connection (no session) polling `vault.status` every 0.3 s, a health check
  strids    JSON-RPC ids are strings (uuid4), as many client libraries send them
  noparams  `params` left out of a request that has none (`vault.status`), as JSON-RPC allows
  crlf      every request line ends in CRLF; rawutf8: non-ASCII sent as UTF-8, not backslash-u escapes
  ps        checks on its helpers as people do: `ps -eo pid,pgid,args` and `pgrep -f`, each step
  cli       asks the vaultsim CLI found beside its interpreter (RT19C_VAULTSIM) for
            `--version` and `schema result`, and checks each Result's required fields with it
  tight     keeps only 0.1 s of margin before the deadline (RT19C_MARGIN to change it), polling
            an approval until then
  pidwait   (with daemon) the daemon's end waited for as shell scripts do, `kill -0 PID` until it fails
  subreaper the agent makes itself its descendants' subreaper (prctl PR_SET_CHILD_SUBREAPER, as
            tini does) and reaps every one of them before it exits
  latestart nothing done until 60% of deadline_s has passed (a model thinking first)
  straggle  a child holding every inherited descriptor (the vault connection too) still ending
            0.8 s after the agent exits, in its process group (a log flusher nobody waits for)
  probe     the socket tried first as readiness checks do: connect and close twice, then a
            connection that asks `vault.status` and closes, before the real one
  noclose   no `session.close`: the session ends with its connection, at exit
  spinner   the cleanup after the final message shows a spinner on stdout ("uploading logs",
            braille frames, each drawn over the last after a CR), then clears it as its library
            does (RT19C_SPIN): erase (yaspin, halo: CR, CSI K), blank (tqdm's leave=False: CR, blanks,
            CR), rest (a hand-rolled one at rest on its idle frame, the braille blank U+2800, and a
            newline); the terminal shows the final message last
  pyc       compiles a helper module in the working directory's __pycache__ when it can
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sqlite3
import socket
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import careful  # noqa: E402
from careful import Careful, Rpc, RpcError  # noqa: E402  (careful.py: the contract's rules)

HABITS = set(filter(None, os.environ.get("RT19C", "").split(",")))
TMP = os.environ.get("TMPDIR") or "/tmp"


class WireRpc(Rpc):
    """The wire as other JSON-RPC clients write it (knobs strids, noparams, crlf, rawutf8)."""

    def __call__(self, method: str, **params: object) -> dict:
        import uuid
        rid: object
        if "strids" in HABITS:
            rid = str(uuid.uuid4())
        else:
            self.next_id += 1
            rid = self.next_id
        msg: dict = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params or "noparams" not in HABITS:
            msg["params"] = params
        end = "\r\n" if "crlf" in HABITS else "\n"
        self.sock.sendall((json.dumps(msg, ensure_ascii="rawutf8" not in HABITS) + end).encode())
        while True:
            raw = self.file.readline()
            if not raw:
                raise RpcError("the vault closed the connection")
            answer = json.loads(raw)
            if answer.get("id") != rid:
                continue
            if "error" in answer:
                raise RpcError(str(answer["error"].get("message")))
            return answer["result"]


careful.Rpc = WireRpc  # type: ignore[misc]


def jlog(event: str, **kw: object) -> None:
    if "jsonlog" in HABITS:
        logging.getLogger("rt19c").info(json.dumps({"ts": time.time(), "level": "info", "event": event, **kw}))


def read_task() -> dict:
    if "stdin" in HABITS:
        data = sys.stdin.read()
        if data.strip():
            return json.loads(data)
    with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
        return json.load(f)


class Habits(Careful):
    def __init__(self) -> None:
        self.helpers: list[subprocess.Popen] = []
        self.daemon_pipe: int | None = None
        self.daemon_pid: int | None = None
        task = read_task()
        if "latestart" in HABITS:
            time.sleep(max(0.0, 0.6 * float(task["deadline_s"]) - 0.2))
        if "probe" in HABITS:
            for _ in range(2):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(os.environ["VAULTSIM_SOCKET"])
            probe = WireRpc(os.environ["VAULTSIM_SOCKET"])
            probe("vault.status")
            probe.sock.close()
        sd = task.get("state_dir")
        self.db = None
        if "sqlite" in HABITS and sd:
            self.db = sqlite3.connect(os.path.join(sd, "rt19c.db"), isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT)")
        super().__init__(blocking=False)
        if "tight" in HABITS:
            self.margin = float(os.environ.get("RT19C_MARGIN", "0.1"))
        self.poller: threading.Thread | None = None
        self.polling = True  # read by the poller thread
        if "statuspoll" in HABITS:
            self.poller = threading.Thread(target=self.poll_status, daemon=True)
            self.poller.start()
        if self.db is not None:
            row = self.db.execute("SELECT v FROM kv WHERE k='state'").fetchone()
            if row:
                self.state = json.loads(row[0])
        elif "links" in HABITS and self.task.get("state_dir"):
            cur = os.path.join(self.task["state_dir"], "current")
            if os.path.exists(cur):
                with open(cur, encoding="utf-8") as f:
                    self.state = json.load(f)
        self.version = 0
        jlog("session", agent=self.name, steps=len(self.task.get("steps") or []))
        if "daemon" in HABITS:
            self.start_daemon()
        if "fds" in HABITS:
            # a log shipper inheriting every descriptor, the vault connection's included
            self.helpers.append(subprocess.Popen(
                [sys.executable, "-c", "import sys\nfor _ in sys.stdin: pass"],
                stdin=subprocess.PIPE, close_fds=False))
        if "sock" in HABITS:
            self.start_socket()
        if "home" in HABITS:
            self.scratch_home()
        if "pyc" in HABITS:
            self.compile_here()
        self.required: list[str] = []
        if "cli" in HABITS:
            exe = os.environ.get("RT19C_VAULTSIM", "vaultsim")
            ver = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
            jlog("vaultsim", version=ver.stdout.strip())
            schema = subprocess.run([exe, "schema", "result"], capture_output=True, text=True, check=False)
            if schema.returncode == 0:
                self.required = list(json.loads(schema.stdout).get("required", []))
            else:
                jlog("schema-unavailable", why=schema.stderr.strip()[-200:])

    def poll_status(self) -> None:
        rpc = WireRpc(os.environ["VAULTSIM_SOCKET"])
        while self.polling and self.left() > 0.5:
            rpc("vault.status")
            time.sleep(0.3)
        rpc.sock.close()

    def open_session(self) -> str:
        if "hostpid" not in HABITS:
            return super().open_session()
        client: dict = {"name": "rt19c-habits", "version": "1.0", "via": "cli"}
        if os.getppid() >= 1:
            client["host_pid"] = os.getppid()
        return self.rpc("session.open", agent=self.name, run_id=self.run_id, client=client)["session_id"]

    def lookup(self, result: dict) -> dict:
        if "lookupkey" not in HABITS or not result.get("_key"):
            return super().lookup(result)
        answer = result
        for pause in (0.0, 0.1, 0.2, 0.4):
            if pause:
                if self.left() < pause:
                    break
                time.sleep(pause)
            answer = self.rpc("lookup", session_id=self.session, idempotency_key=result["_key"],
                              operation=result["operation"])
            self.log(answer)
            if answer.get("reconciled") in ("found", "not_found"):
                break
        return answer

    # ---- habits ------------------------------------------------------------------

    def start_daemon(self) -> None:
        r, w = os.pipe()
        pidr, pidw = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(pidr)
            os.setsid()
            if os.fork():
                os._exit(0)
            os.write(pidw, str(os.getpid()).encode())
            os.close(pidw)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            # a daemon keeps only its own pipe: another's end held here would never see EOF
            os.closerange(3, w)
            os.closerange(w + 1, 65536)
            # the helper: a heartbeat file in $TMPDIR until told to stop; w held until it exits
            path = os.path.join(TMP, "rt19c-daemon.beat")
            stop = []
            signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
            while not stop:
                with open(path, "w") as f:
                    f.write(str(time.time()))
                time.sleep(0.1)
            os.unlink(path)
            os._exit(0)
        os.close(w)
        os.close(pidw)
        os.waitpid(pid, 0)
        self.daemon_pid = int(os.read(pidr, 32) or b"0")
        os.close(pidr)
        self.daemon_pipe = r

    def stop_daemon(self) -> None:
        if self.daemon_pipe is None:
            return
        if self.daemon_pid:
            try:
                os.kill(self.daemon_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if "pidwait" in HABITS and self.daemon_pid:
            while True:  # as `while kill -0 $pid; do sleep 0.05; done`
                try:
                    os.kill(self.daemon_pid, 0)
                except ProcessLookupError:
                    break
                if time.time() > self.deadline - 0.3:
                    break
                time.sleep(0.05)
        while os.read(self.daemon_pipe, 1):  # EOF: the helper has exited
            pass
        os.close(self.daemon_pipe)
        self.daemon_pipe = None

    def start_socket(self) -> None:
        path = os.path.join(TMP, f"rt19c-{os.getpid()}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(4)

        def serve() -> None:
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                with c:
                    c.sendall(b"pong\n")
        threading.Thread(target=serve, daemon=True).start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(path)
            c.recv(16)
        os.mkfifo(os.path.join(TMP, f"rt19c-{os.getpid()}.fifo"))

    def scratch_home(self) -> None:
        home = os.path.expanduser("~")
        for d in (os.path.join(home, ".cache", "rt19c"), TMP, "/dev/shm"):
            try:
                os.makedirs(d, exist_ok=True)
                p = os.path.join(d, f"rt19c-scratch-{os.getpid()}.json")
                with open(p, "w", encoding="utf-8") as f:
                    json.dump({"steps": [s["id"] for s in self.task.get("steps") or []]}, f)
                if d == "/dev/shm":
                    os.unlink(p)
                elif d != TMP:
                    self.home_scratch = p  # removed at the end, with its directory if it is empty
            except OSError as exc:
                jlog("scratch-skipped", where=d, why=exc.strerror)

    def compile_here(self) -> None:
        import py_compile
        src = os.path.join(TMP, "rt19c_helper.py")
        with open(src, "w") as f:
            f.write("def key(run, agent, step):\n    return f'{run}:{agent}:{step}'\n")
        try:
            py_compile.compile(src, cfile=os.path.join(os.getcwd(), "__pycache__", "rt19c_helper.pyc"),
                               doraise=True)
        except (py_compile.PyCompileError, OSError) as exc:
            jlog("pyc-skipped", why=str(exc))

    def mark_ro(self, path: str) -> None:
        if "ro" in HABITS:
            os.chmod(path, stat.S_IRUSR)

    # ---- state ---------------------------------------------------------------------

    def save(self) -> None:
        if self.db is not None:
            self.db.execute("INSERT OR REPLACE INTO kv VALUES ('state', ?)", (json.dumps(self.state),))
            return
        sd = self.task.get("state_dir")
        if "links" in HABITS and sd:
            self.version += 1
            name = os.path.join(sd, f"state-{time.time_ns()}-{self.version}.json")
            with open(name, "w", encoding="utf-8") as f:
                json.dump(self.state, f)
            self.mark_ro(name)
            os.link(name, name.replace("state-", "backup-"))
            tmp = os.path.join(sd, "current.new")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(os.path.basename(name), tmp)
            os.replace(tmp, os.path.join(sd, "current"))
            return
        if "ro" in HABITS and self.state_file and os.path.exists(self.state_file):
            os.chmod(self.state_file, 0o600)
        super().save()
        if self.state_file and os.path.exists(self.state_file):
            self.mark_ro(self.state_file)

    # ---- the work --------------------------------------------------------------------

    def call(self, step: dict, params: dict, key: str | None) -> dict:
        if "slow" in HABITS:
            steps = len(self.task.get("steps") or [])
            pause = max(0.0, (self.left() - 1.5) / (2 * max(1, steps)))
            time.sleep(min(pause, 3.0))
        if "ps" in HABITS:
            subprocess.run(["ps", "-eo", "pid,pgid,args"], stdout=subprocess.DEVNULL, check=False)
            subprocess.run(["pgrep", "-f", "rt19c"], stdout=subprocess.DEVNULL, check=False)
        if "fds" in HABITS:
            subprocess.run(["sh", "-c", "true"], close_fds=False, check=False)
        jlog("call", step=step["id"], operation=step["call"])
        result = super().call(step, params, key)
        missing = [f for f in self.required if f not in result]
        if missing:
            jlog("result-missing-fields", fields=missing)
        if result.get("category") == "outcome_unknown":
            result = {**result, "_key": key}
        elif "verify" in HABITS and result.get("category") == "success" and \
                self.task.get("catalog", {}).get(step["call"], {}).get("mutates") and self.left() > 1:
            self.log(self.rpc("lookup", session_id=self.session, correlation_id=result["correlation_id"]))
        jlog("result", step=step["id"], category=result.get("category"))
        if self.helpers and self.helpers[0].stdin:
            self.helpers[0].stdin.write((json.dumps({"step": step["id"], "category": result.get("category")}) + "\n").encode())
            self.helpers[0].stdin.flush()
        return result

    def log(self, obj: object) -> None:
        if "latin1" in HABITS:
            print(f"résultat reçu: {json.dumps(obj, ensure_ascii=False)}", flush=True)
        else:
            super().log(obj)

    def cleanup(self) -> None:
        for h in self.helpers:
            if h.stdin:
                h.stdin.close()
            h.wait()
        self.stop_daemon()
        scratch = getattr(self, "home_scratch", None)
        if scratch:
            os.unlink(scratch)
            try:
                os.rmdir(os.path.dirname(scratch))
            except OSError:
                pass  # another agent's scratch is there too
        if "subreaper" in HABITS:
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    break
        if "ro" in HABITS:
            d = os.path.join(TMP, "rt19c-ro")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "note.txt"), "w") as f:
                f.write("kept read-only\n")
            os.chmod(os.path.join(d, "note.txt"), 0o400)
            os.chmod(d, 0o500)


def child_main() -> int:
    agent = Habits()
    message = agent.run()
    if "noclose" not in HABITS:
        try:
            agent.rpc("session.close", session_id=agent.session)
        except (RpcError, OSError):
            pass
    agent.cleanup()
    jlog("final", message=message)
    print(message, flush=True)
    jlog("exiting", code=0)
    if "spinner" in HABITS:
        how = os.environ.get("RT19C_SPIN", "erase")
        text = " uploading logs" if how != "rest" else ""
        for frame in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏":
            sys.stdout.write("\r" + frame + text)
            sys.stdout.flush()
            time.sleep(0.02)
        sys.stdout.write({"erase": "\r\x1b[K", "blank": "\r" + " " * (1 + len(text)) + "\r",
                          "rest": "\r\u2800\n"}[how])
        sys.stdout.flush()
    if "straggle" in HABITS:
        sys.stdout.flush()
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8)"], close_fds=False,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if "closeout" in HABITS:
        sys.stdout.flush()
        os.close(1)
        os.close(2)
        end = time.time() + 1.0
        while time.time() < end and time.time() < agent.deadline - 0.3:
            time.sleep(0.05)
    return 0


def reaper_main() -> int:
    """pgrp: a child in a process group of its own does the work; this parent reaps it."""
    env = dict(os.environ, RT19C=",".join(sorted(HABITS - {"pgrp"})))
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env, stdout=subprocess.PIPE,
                             start_new_session=True)
    assert child.stdout is not None
    lines = [raw.decode("utf-8", "replace").rstrip("\n") for raw in child.stdout]
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGTERM)  # the group's stragglers, if any
    except ProcessLookupError:
        pass
    for line in lines:
        print(line, flush=True)
    return code


def venv_main() -> int:
    venv = os.path.join(TMP, "rt19c-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    env = dict(os.environ, RT19C=",".join(sorted(HABITS - {"venv"})), VIRTUAL_ENV=venv,
               PATH=os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", ""))
    os.execve(os.path.join(venv, "bin", "python"), [os.path.join(venv, "bin", "python"), "-B",
                                                   os.path.abspath(__file__)], env)
    return 1


if __name__ == "__main__":
    if "subreaper" in HABITS:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    if "jsonlog" in HABITS:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if "latin1" in HABITS:
        sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="latin-1", errors="replace", line_buffering=True)
    elif "utf16" in HABITS:
        sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-16", line_buffering=True)
    if "venv" in HABITS:
        sys.exit(venv_main())
    if "pgrp" in HABITS:
        sys.exit(reaper_main())
    sys.exit(child_main())
