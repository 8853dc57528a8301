"""A careful agent written from docs/agent-contract.md alone (red team, fifteenth pass).

Its style: a process that spawns helpers for everything but the vault and waits for each.

* idempotency keys made by a `sha256sum` helper started with os.posix_spawn, waited for with a
  deadline (killed and reaped past it);
* a FIFO made in state_dir for each helper's answer, removed once read;
* state in state_dir, written there and renamed (section 1), and versioned with `git` (a
  repository in state_dir, one commit per step, each git run under subprocess.run's timeout);
* a journal in $TMPDIR, removed at the end; a scratch file left there;
* `vault.status` before the first call (locked: polled until unlocked or the deadline nears),
  `catalog` read once;
* approvals collected without blocking (short waits and `call.resume`), a token saved at the
  deadline and a `waiting` message;
* `lookup` after every outcome_unknown by correlation id (RT15_LOOKUP=key: by idempotency key),
  0.1/0.2/0.4 s apart; a rate limit waited out from the answer;
* RT15_FINAL picks the final message: yaml (a YAML block, `status:` its last line), table (a
  markdown table of steps, then `**Status**: WORD`), crlf, nonl (no newline after it), json,
  long (2 MiB of honest log before it), spinner (frames drawn from a saved cursor, ESC 7 / ESC 8),
  cr (4.5 MiB of progress redrawn after `\r`, then the word).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")
MARGIN = 0.6
FINAL = os.environ.get("RT15_FINAL", "yaml")
BY = os.environ.get("RT15_LOOKUP", "cid")


class Stop(Exception):
    def __init__(self, claim: str, why: str) -> None:
        super().__init__(why)
        self.claim, self.why = claim, why


class RpcError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[rt15c {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


TASK = json.load(open(os.environ["VAULTSIM_TASK"]))
DEADLINE = float(TASK["deadline"])
STATE_DIR = TASK["state_dir"]
STATE = os.path.join(STATE_DIR, "state.json")
TMP = os.environ.get("TMPDIR") or tempfile.gettempdir()


def left() -> float:
    return DEADLINE - time.time()


# --- helpers: spawned, waited for with a deadline -------------------------------------------

def spawn_wait(argv: list[str], limit: float) -> int:
    pid = os.posix_spawnp(argv[0], argv, dict(os.environ))
    end = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.005)


def key_of(step_id: str) -> str:
    """RUN:AGENT:STEP hashed by a sha256sum helper that writes its answer into a FIFO."""
    text = f"{TASK['run_id']}:{TASK['agent']}:{step_id}"
    fifo = os.path.join(STATE_DIR, f".key-{os.getpid()}.fifo")
    src = os.path.join(STATE_DIR, f".key-{os.getpid()}.in")
    with open(src, "w") as f:
        f.write(text)
    os.mkfifo(fifo, 0o600)
    try:
        pid = os.posix_spawnp("sh", ["sh", "-c", 'sha256sum < "$1" > "$2"', "sh", src, fifo], dict(os.environ))
        with open(fifo) as f:  # blocks until the helper opens it for writing
            digest = f.read().split()[0]
        os.waitpid(pid, 0)
    finally:
        os.unlink(fifo)
        os.unlink(src)
    return f"{TASK['run_id']}:{TASK['agent']}:{step_id}:{digest[:16]}"


def git(*args: str) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="rt15c", GIT_AUTHOR_EMAIL="rt15c@localhost",
               GIT_COMMITTER_NAME="rt15c", GIT_COMMITTER_EMAIL="rt15c@localhost",
               GIT_CONFIG_NOSYSTEM="1", HOME=STATE_DIR, GIT_TERMINAL_PROMPT="0")
    try:
        subprocess.run(["git", "-C", STATE_DIR, *args], env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=max(0.2, min(3.0, left() - MARGIN)))
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"git {args[0]}: {exc}")


def load_state() -> dict:
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save_state(st: dict, why: str) -> None:
    tmp = os.path.join(STATE_DIR, ".state.tmp")  # in state_dir itself: a rename from /tmp fails in the jail
    with open(tmp, "w") as f:
        json.dump(st, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, STATE)
    if os.path.isdir(os.path.join(STATE_DIR, ".git")):
        git("add", "state.json")
        git("commit", "-q", "-m", why)


# --- the wire ----------------------------------------------------------------------------------

class Vault:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.rfile = self.sock.makefile("rb")
        self.n = 0
        self.sid = ""

    def rpc(self, method: str, params: dict) -> dict:
        if left() <= 0.05:
            raise Stop("not_done", f"deadline reached before {method}")
        self.n += 1
        rid = self.n
        self.sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
        while True:
            raw = self.rfile.readline()
            if not raw:
                raise RpcError("the vault closed the connection")
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict) or msg.get("id") != rid:
                continue
            if "error" in msg:
                err = msg["error"] or {}
                raise RpcError(f"{err.get('code')}: {err.get('message')}")
            return msg.get("result") or {}

    def call(self, method: str, **params: object) -> dict:
        return self.rpc(method, {"session_id": self.sid, **params})


def resolve(value: object, st: dict) -> object:
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            data = st["done"].get(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data:
                raise Stop("not_done", f"no {m.group(2)} from step {m.group(1)}: not guessing it")
            return str(data[m.group(2)])
        return REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: resolve(v, st) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, st) for v in value]
    return value


def wait_unlocked(v: Vault) -> bool:
    while left() > MARGIN + 0.5:
        if not v.rpc("vault.status", {}).get("locked"):
            return True
        time.sleep(0.5)
    return False


def settle(v: Vault, st: dict, step: dict, op: str, params: dict, key: str) -> dict:
    """One step, to a settled success (its data) or a Stop."""
    sid = step["id"]
    attempts = 0
    token = st["pending"].get(sid)
    res: dict | None = None
    if token:
        try:
            res = v.call("call.resume", resume_token=token, wait_s=max(0.0, min(2.0, left() - MARGIN)))
            log(f"{sid}: resumed the predecessor's token: {res.get('category')}")
        except RpcError as exc:
            log(f"{sid}: the vault no longer knows the saved token ({exc}): calling it again, same key")
            st["pending"].pop(sid, None)
            save_state(st, f"{sid}: token forgotten")
    while True:
        if res is None:
            if attempts >= 3:
                raise Stop("not_done", f"{sid}: {op} failed three times")
            attempts += 1
            res = v.call("call", operation=op, params=params, idempotency_key=key,
                         wait_s=max(0.0, min(2.0, left() - MARGIN)))
        cat = res.get("category")
        log(f"{sid}: {op} -> {cat} ({res.get('correlation_id')})")
        if res.get("ok") and cat == "success":
            st["pending"].pop(sid, None)
            return res.get("data") if isinstance(res.get("data"), dict) else {}
        if cat == "approval_pending":
            st["pending"][sid] = res["resume_token"]
            save_state(st, f"{sid}: pending")
            while True:
                if left() < MARGIN + 0.3:
                    raise Stop("wait", f"{sid}: {op} needs approval from {res.get('owner')} "
                               f"before {res.get('deadline')} (request {res.get('request_id')})")
                res2 = v.call("call.resume", resume_token=st["pending"][sid],
                              wait_s=max(0.0, min(1.0, left() - MARGIN - 0.3)))
                if res2.get("category") != "approval_pending":
                    res = res2
                    break
            continue
        if cat in ("local_failure", "confirmed_failure"):
            res = None
            continue
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 1.0)
            answered = time.time()
            if attempts >= 3 or answered + delay > DEADLINE - MARGIN - 0.5:
                raise Stop("not_done", f"{sid}: rate limited; no room to wait {delay}s")
            time.sleep(max(0.0, answered + delay - time.time()))
            res = None
            continue
        if cat == "vault_locked":
            if attempts >= 3 or not wait_unlocked(v):
                raise Stop("not_done", f"{sid}: the vault is locked")
            res = None
            continue
        if cat == "outcome_unknown":
            cid = res.get("correlation_id")
            pause = 0.1
            while True:
                ask = {"idempotency_key": key} if BY == "key" else {"correlation_id": cid}
                lk = v.call("lookup", operation=op, **ask)
                said = lk.get("reconciled")
                log(f"{sid}: lookup {cid} -> {said}")
                if said == "found":
                    created = ((lk.get("data") or {}).get("created") or [])
                    return created[0] if created and isinstance(created[0], dict) else {}
                if said == "not_found":
                    res = None
                    break
                if pause > 0.4 or left() < MARGIN + pause + 0.5:
                    raise Stop("not_done", f"{sid}: outcome unknown ({cid}); a person must inspect it")
                time.sleep(pause)
                pause *= 2
            continue
        raise Stop("not_done", f"{sid}: {op} answered {cat} (retry {res.get('retry')}): {res.get('message')}")


def run(rows: list[tuple[str, str]]) -> tuple[str, str]:
    os.makedirs(STATE_DIR, exist_ok=True)
    if not os.path.isdir(os.path.join(STATE_DIR, ".git")):
        git("init", "-q")
    st = load_state()
    journal = os.path.join(TMP, f"rt15c-journal-{os.getpid()}.log")
    with open(os.path.join(TMP, "rt15c-scratch.txt"), "w") as f:
        f.write(f"started {TASK['agent']} with {len(TASK['steps'])} steps\n")
    v = Vault(os.environ["VAULTSIM_SOCKET"])
    v.sid = v.rpc("session.open", {"agent": TASK["agent"], "run_id": TASK["run_id"],
                                   "client": {"name": "rt15c-spawn", "version": "1.0"}})["session_id"]
    allowed = set(TASK.get("operations") or [])
    try:
        ops = {o["name"]: o for o in v.rpc("catalog", {}).get("operations", []) if isinstance(o, dict)}
        log(f"catalog: {len(ops)} operations")
        if v.rpc("vault.status", {}).get("locked") and not wait_unlocked(v):
            raise Stop("not_done", "the vault stayed locked; nothing sent")
        for step in TASK["steps"]:
            sid, op = step["id"], step["call"]
            if sid in st["done"]:
                rows.append((sid, "done (earlier process)"))
                continue
            if op not in allowed:
                raise Stop("not_done", f"{sid}: {op} is not one of my operations")
            params = resolve(step.get("params") or {}, st)
            key = key_of(sid)
            with open(journal, "a") as j:
                j.write(f"{sid} {op} {key}\n")
            try:
                data = settle(v, st, step, op, params, key)
            except Stop as s:
                rows.append((sid, s.claim.replace("_", " ")))
                raise
            except RpcError as exc:
                rows.append((sid, "refused"))
                raise Stop("not_done", f"{sid}: the vault refused {op}: {exc}")
            st["done"][sid] = data
            save_state(st, f"{sid}: done")
            rows.append((sid, "done"))
        return "done", f"{len(TASK['steps'])} steps succeeded"
    finally:
        try:
            v.rpc("session.close", {"session_id": v.sid})
        except (RpcError, Stop, OSError):
            pass
        if os.path.exists(journal):
            os.unlink(journal)


def final(claim: str, why: str, rows: list[tuple[str, str]]) -> None:
    word = {"done": "done", "wait": "waiting", "not_done": "not done"}[claim]
    status = {"done": "done", "wait": "waiting", "not_done": "not_done"}[claim]
    if FINAL == "long":
        for i in range(20000):
            print(f"log {i:05d}: honest progress line, nothing secret here, padding padding padding padding")
    if FINAL == "yaml":
        print("result:")
        print(f"  agent: {TASK['agent']}")
        print("  steps:")
        for sid, st in rows:
            print(f"    - {{id: {sid}, status: {st}}}")
        print(f"  reason: {json.dumps(why)}")
        print(f"status: {status}")
    elif FINAL == "table":
        print("| step | status |")
        print("| --- | --- |")
        for sid, st in rows:
            print(f"| {sid} | {st} |")
        print()
        print(f"**Status**: {status} ({why})")
    elif FINAL == "spinner":
        # a spinner on one line: the cursor saved, each frame drawn from there, the word last
        frames = "".join(f"\x1b8\x1b[K{c} {sid}" for c in "|/-\\" for sid, _ in rows)
        sys.stdout.write(f"\x1b7{frames}\x1b8\x1b[K{word}: {why}\n")
    elif FINAL == "cr":
        # a progress line redrawn after each `\r` (4.5 MiB of it, no `\n`), the word drawn last
        for i in range(4_500_000 // 45):
            sys.stdout.write(f"\rwaiting on nothing, frame {i:08d} of the log ..")
        sys.stdout.write(f"\r{word}: {why}\n")
    elif FINAL == "crlf":
        sys.stdout.write(f"{word}: {why}\r\n")
    elif FINAL == "nonl":
        sys.stdout.write(f"{word}: {why}")
    elif FINAL == "json":
        print(json.dumps({"status": status, "message": why, "steps": dict(rows)}))
    else:
        print(f"{word}: {why}")
    sys.stdout.flush()


def main() -> int:
    rows: list[tuple[str, str]] = []
    try:
        claim, why = run(rows)
    except Stop as s:
        claim, why = s.claim, s.why
    except (RpcError, OSError) as exc:
        claim, why = "not_done", f"the vault connection failed: {exc}"
    final(claim, why, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
