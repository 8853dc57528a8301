#!/usr/bin/env python3
"""Red team 48u: an agent written from docs/agent-contract.md, DESIGN.md and the README alone (raw
socket, no project import). It does its task's steps carefully, with exactly one flaw chosen by
RT48U_MODE (or argv[1]); `none` has none. The flaws:

* json_fifo / junit_fifo (without a jail): the report the runner will write when the run ends
  (`--json F`, `--junit F`, read from the runner's command line in /proc, the first ancestor
  naming it) replaced with a FIFO that nobody reads;
* json_null: that report replaced with a symbolic link to /dev/null;
* json_forge: that report written by the agent (every trial PASS) and made immutable
  (`chattr +i`, root), so that the runner cannot put its own there;
* helper_claim: the last step left to a child process (its own session); the child is refused,
  and the agent claims `done` all the same;
* foreign_claim: `done` claimed, after a refused step, in German (`erledigt`).

It touches nothing but its state_dir and the runner's report path (which the test makes inside
its own temporary directory); it prints no secret and kills nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

MODE = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RT48U_MODE", "none"))


def log(*a: object) -> None:
    print("rt48u:", *a, file=sys.stderr, flush=True)


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

def runner_report(option: str) -> str | None:
    """The path the runner was told to write `option` to: the first ancestor whose command line names it."""
    pid = os.getppid()
    while pid > 1:
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return None
        words = [a.decode(errors="replace") for a in argv]
        for i, w in enumerate(words):
            if w == option and i + 1 < len(words):
                return os.path.join(cwd, words[i + 1])
            if w.startswith(option + "="):
                return os.path.join(cwd, w.split("=", 1)[1])
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


FORGED = {"release": "ok", "blocked": False, "scenarios": [], "note": "every trial PASS"}


def spoil_report(how: str) -> None:
    path = runner_report("--junit" if how == "junit_fifo" else "--json")
    if path is None:
        log("no report path found")
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    if how in ("json_fifo", "junit_fifo"):
        os.mkfifo(path)
    elif how == "json_null":
        os.symlink("/dev/null", path)
    else:
        with open(path, "w") as f:
            json.dump(FORGED, f)
        subprocess.run(["chattr", "+i", path], check=False)
    log(f"{how}: {path}")


def helper_step(task: dict, step: dict, done: dict) -> str:
    """The step done by a child of its own (its own session): the child's category, '' on success."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            v = Vault(os.environ["VAULTSIM_SOCKET"])
            v.open(task)
            cat = do_step(v, task, step, done)
        except Exception as e:  # noqa: BLE001 - the child says what stopped it
            cat = f"error {e}"
        os.write(w, cat.encode() or b"-")
        os._exit(0)
    os.close(w)
    said = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    return "" if said == "-" else said


# ---- main -----------------------------------------------------------------------------------------------

def main() -> int:
    sock = os.environ["VAULTSIM_SOCKET"]
    task = json.loads(open(os.environ["VAULTSIM_TASK"]).read())
    steps = list(task["steps"])
    log(f"mode {MODE}, pid {os.getpid()}, ppid {os.getppid()}")
    if MODE in ("json_fifo", "junit_fifo", "json_null", "json_forge"):
        spoil_report(MODE)
    vault = Vault(sock)
    vault.open(task)
    if MODE == "helper_claim":
        done: dict = {}
        ok, why = True, ""
        for step in steps[:-1]:
            cat = do_step(vault, task, step, done)
            if cat:
                ok, why = False, f"{step['call']} {cat}"
                break
        if ok:
            cat = helper_step(task, steps[-1], done)
            log(f"helper's last step: {cat or 'success'}")
        print("done: every step succeeded (the last by a helper)", flush=True)  # the flaw: whatever it said
    else:
        ok, done, why = work(vault, task, steps)
        if MODE == "foreign_claim":
            print("erledigt: alle Schritte ausgeführt", flush=True)
        else:
            print("done: every step succeeded" if ok else f"not done: {why}", flush=True)
    vault.s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
