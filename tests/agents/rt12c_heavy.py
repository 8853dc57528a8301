#!/usr/bin/env python3
"""A careful agent written from docs/agent-contract.md alone (red team, twelfth pass).

Python std only, blocking sockets, heavy but allowed habits. Knobs (environment):
  RT12_SPLIT    1: every request written one byte per send(), every answer read one byte per recv()
  RT12_BURST    N: before every call, N `vault.status` requests written at once on the connection
                (at most 64 may be in progress) and their answers read, ids out of order
  RT12_KIDS     N: before every step, N short-lived children (sh, a python reading /proc/self and
                listing $TMPDIR, one in its own session, one double-forked), all ended before the
                agent goes on; threads run half of them
  RT12_SCRATCH  1: files in $TMPDIR and state_dir (unicode names, a few MiB, none a secret), listed
  RT12_UNI      1: unicode idempotency keys and a unicode final message; long: keys of 200
                characters, most of them outside ASCII (past 255 once percent-encoded)
  RT12_LOOKUP   1: before every mutating step not yet done, a lookup by its idempotency key;
                all: before every step, reads too
  RT12_BIG      N: the final message carries N more bytes (after the claim word)
  RT12_PACE     s: at least s seconds between two requests that act (one call per second)
  RT12_LATE     1: after the work, stay until 0.15 s before the deadline, then finish
  RT12_TRAIL    group | session: a helper started last (in our process group, or in a session of
                its own) is still ending, for 0.6 s, when the agent exits (the contract allows 2 s)
  RT12_MARGIN   s: how long before the deadline the agent stops (default 0.8; 0.25 answers right
                before the deadline: a wait_s ending about 0.3 s before it)
  RT12_FINAL    word (default) | json | lower | json_ls (one JSON line, ensure_ascii=False, the step
                notes joined by U+2028 LINE SEPARATOR) | indent_log (JSON, indent=2, with the log of
                every request and its answer: hundreds of lines)
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

SPLIT = os.environ.get("RT12_SPLIT") == "1"
BURST = int(os.environ.get("RT12_BURST") or 0)
KIDS = int(os.environ.get("RT12_KIDS") or 0)
SCRATCH = os.environ.get("RT12_SCRATCH") == "1"
UNI = os.environ.get("RT12_UNI") in ("1", "long")
LONG_KEYS = os.environ.get("RT12_UNI") == "long"
LOOKUP_FIRST = os.environ.get("RT12_LOOKUP") in ("1", "all")
LOOKUP_READS = os.environ.get("RT12_LOOKUP") == "all"
BIG = int(os.environ.get("RT12_BIG") or 0)
PACE = float(os.environ.get("RT12_PACE") or 0)
LATE = os.environ.get("RT12_LATE") == "1"
FINAL = os.environ.get("RT12_FINAL", "word")
TRAIL = os.environ.get("RT12_TRAIL", "")

with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as _f:
    TASK = json.load(_f)
SOCK = os.environ["VAULTSIM_SOCKET"]
RUN_ID = os.environ.get("VAULTSIM_RUN_ID") or TASK.get("run_id", "")
AGENT = TASK["agent"]
DEADLINE = float(TASK["deadline"])
STATE_DIR = TASK.get("state_dir")
STATE_FILE = os.path.join(STATE_DIR, "rt12c-state.json") if STATE_DIR else None
CATALOG = TASK.get("catalog", {})
OPS = set(TASK.get("operations", []))
MARGIN = float(os.environ.get("RT12_MARGIN") or 0.8)  # stop this long before the deadline
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


def log(*a: Any) -> None:
    print("log:", *a, flush=True)


def left() -> float:
    return DEADLINE - time.time()


def load_state() -> dict[str, Any]:
    try:
        with open(STATE_FILE or "", encoding="utf-8") as f:
            doc = json.load(f)
        return {"done": dict(doc.get("done", {})), "pending": dict(doc.get("pending", {}))}
    except (OSError, ValueError):
        return {"done": {}, "pending": {}}


def save_state(state: dict[str, Any]) -> None:
    if not STATE_FILE:
        return
    tmp = STATE_FILE + ".tmp"  # in state_dir itself: a rename from /tmp fails in the jail
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, ensure_ascii=False)
    os.replace(tmp, STATE_FILE)


REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")


def resolve(value: Any, done: dict[str, Any]) -> Any:
    if isinstance(value, str):
        missing = False

        def sub(m: re.Match[str]) -> str:
            nonlocal missing
            data = done.get(m.group(1))
            if not isinstance(data, dict) or m.group(2) not in data:
                missing = True
                return ""
            return str(data[m.group(2)])
        out = REF.sub(sub, value)
        return None if missing else out
    if isinstance(value, dict):
        res = {}
        for k, v in value.items():
            r = resolve(v, done)
            if r is None and v is not None:
                return None
            res[k] = r
        return res
    if isinstance(value, list):
        items = [resolve(v, done) for v in value]
        return None if any(r is None and v is not None for r, v in zip(items, value)) else items
    return value


# ---- habits that cost something but are allowed --------------------------------------------

KID_PY = ("import os,sys; open('/proc/self/status').read(); os.listdir('/proc/self/fd'); "
          "d=os.environ.get('TMPDIR') or '/tmp'; os.listdir(d); sys.exit(0)")


def one_kid(i: int) -> None:
    kind = i % 4
    if kind == 0:
        subprocess.run(["sh", "-c", "true; echo kid >/dev/null"], stdin=subprocess.DEVNULL, check=False)
    elif kind == 1:
        subprocess.run([sys.executable, "-S", "-c", KID_PY], stdin=subprocess.DEVNULL, check=False)
    elif kind == 2:  # its own session (out of our process group), waited for: gone before we exit
        subprocess.run(["sh", "-c", "exit 0"], start_new_session=True, stdin=subprocess.DEVNULL, check=False)
    else:  # a double fork whose grandchild ends at once; we wait until it has
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            gpid = os.fork()
            if gpid == 0:
                os.close(w)
                os._exit(0)
            os.write(w, str(gpid).encode())
            os._exit(0)
        os.close(w)
        gpid = int(os.read(r, 32) or b"0")
        os.close(r)
        os.waitpid(pid, 0)
        t = time.monotonic() + 5
        while gpid and os.path.exists(f"/proc/{gpid}") and time.monotonic() < t:
            try:
                with open(f"/proc/{gpid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break  # reaped by whoever adopts it; it runs nothing
            except OSError:
                break
            time.sleep(0.01)


def kids() -> None:
    if not KIDS:
        return
    half = KIDS // 2
    threads = [threading.Thread(target=one_kid, args=(i,)) for i in range(half)]
    for t in threads:
        t.start()
    for i in range(half, KIDS):
        one_kid(i)
    for t in threads:
        t.join()


def scratch() -> None:
    if not SCRATCH:
        return
    tmp = os.environ.get("TMPDIR") or "/tmp"
    rnd = random.Random(4)
    for d in (tmp, STATE_DIR):
        if not d:
            continue
        try:
            os.makedirs(os.path.join(d, "rt12c scratch ñ"), exist_ok=True)
            with open(os.path.join(d, "rt12c scratch ñ", "データ.bin"), "wb") as f:
                f.write(bytes(rnd.getrandbits(8) for _ in range(1 << 16)) * 32)  # 2 MiB
            with open(os.path.join(d, "rt12c scratch ñ", "notes 📝.txt"), "w", encoding="utf-8") as f:
                f.write("scratch notes, nothing secret: ünïcödé ✓\n" * 1000)
            log("scratch", d, len(os.listdir(d)))
        except OSError as e:
            log("scratch failed", d, type(e).__name__)
    with open("/proc/self/status") as f:
        log("threads", [ln for ln in f if ln.startswith("Threads")][0].split()[1])


# ---- transport -----------------------------------------------------------------------------

class Vault:
    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(SOCK)
        self.buf = b""
        self.rid = 0
        self.extra: dict[int, dict[str, Any]] = {}
        self.sid = ""
        self.last_act = 0.0
        self.history: list[dict[str, Any]] = []

    def send(self, data: bytes) -> None:
        if SPLIT:
            for i in range(len(data)):
                self.s.sendall(data[i:i + 1])
        else:
            self.s.sendall(data)

    def read_line(self) -> bytes:
        while b"\n" not in self.buf:
            self.s.settimeout(max(0.5, left() + 2.0))
            chunk = self.s.recv(1 if SPLIT else 65536)
            if not chunk:
                raise ConnectionError("vault closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def wait_for(self, rid: int) -> dict[str, Any]:
        if rid in self.extra:
            return self.extra.pop(rid)
        while True:
            try:
                msg = json.loads(self.read_line())
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("id") == rid:
                return msg
            if isinstance(msg.get("id"), int):
                self.extra[msg["id"]] = msg

    def note(self, rid: int, method: str, ans: dict[str, Any]) -> dict[str, Any]:
        res = ans.get("result") if isinstance(ans.get("result"), dict) else {}
        self.history.append({"id": rid, "method": method, "category": res.get("category"),
                             "error": (ans.get("error") or {}).get("code")})
        return ans

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if BURST and method == "call":
            ids = []
            out = b""
            for _ in range(min(BURST, 63)):
                self.rid += 1
                ids.append(self.rid)
                out += json.dumps({"jsonrpc": "2.0", "id": self.rid, "method": "vault.status"}).encode() + b"\n"
            self.send(out)
            for rid in reversed(ids):
                self.note(rid, "vault.status", self.wait_for(rid))
        if PACE and method in ("call", "call.resume", "lookup"):
            gap = self.last_act + PACE - time.time()
            if gap > 0 and left() - gap > MARGIN + 1.5:
                time.sleep(gap)
            self.last_act = time.time()
        self.rid += 1
        rid = self.rid
        p = dict(params)
        if method not in ("catalog", "vault.status", "session.open"):
            p["session_id"] = self.sid
        self.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": p},
                             ensure_ascii=False).encode("utf-8") + b"\n")
        return self.note(rid, method, self.wait_for(rid))

    def open(self) -> None:
        ans = self.request("session.open", {"agent": AGENT, "run_id": RUN_ID,
                                            "client": {"name": "rt12c-heavy ✓", "version": "0.1"}})
        self.sid = ans["result"]["session_id"]

    def close(self) -> None:
        try:
            self.request("session.close", {})
        except (OSError, ConnectionError):
            pass
        self.s.close()


# ---- the work ------------------------------------------------------------------------------

class Stop(Exception):
    pass


class Waiting(Exception):
    pass


def key_of(step_id: str) -> str:
    if LONG_KEYS:
        head = f"{RUN_ID}·{AGENT}·{step_id}·"
        return head + ("ключ日本語🔑" * 40)[:200 - len(head)]
    if UNI:
        return f"{RUN_ID}·{AGENT}·шаг «{step_id}» 🔑"[:200]
    return f"{RUN_ID}:{AGENT}:{step_id}"


def lookup_settles(v: Vault, op: str, **by: str) -> tuple[str, dict[str, Any]]:
    delay = 0.1
    res: dict[str, Any] = {}
    for _ in range(4):
        if left() < MARGIN + 0.5:
            break
        ans = v.request("lookup", {"operation": op, **by})
        if "error" in ans:
            return "error", {}
        res = ans["result"]
        rec = res.get("reconciled", "unknown")
        if rec in ("found", "not_found"):
            return rec, res
        time.sleep(delay)
        delay *= 2
    return "unknown", res


def settled_data(res: dict[str, Any]) -> dict[str, Any]:
    created = (res.get("data") or {}).get("created") or []
    return created[0] if created and isinstance(created[0], dict) else {}


def do_step(v: Vault, step: dict[str, Any], params: dict[str, Any], state: dict[str, Any]) -> dict[str, Any] | None:
    sid, op = step["id"], step["call"]
    key = key_of(sid)
    attempts = 0
    if LOOKUP_FIRST and (LOOKUP_READS or CATALOG.get(op, {}).get("mutates", True)) and sid not in state["pending"]:
        rec, res = lookup_settles(v, op, idempotency_key=key)
        log("lookup-before-write", sid, rec)
        if rec == "found":
            return settled_data(res) or dict(res.get("data") or {})
    while True:
        if left() < MARGIN + (0.1 if MARGIN < 0.5 else 0.3):
            raise Stop(f"no time left for {sid}")
        wait_s = max(0.0, min(30.0, left() - MARGIN - (0.05 if MARGIN < 0.5 else 0.3)))
        pend = state["pending"].get(sid)
        if pend:
            ans = v.request("call.resume", {"resume_token": pend["token"], "wait_s": wait_s})
            if "error" in ans:
                state["pending"].pop(sid, None)
                save_state(state)
                continue
        else:
            attempts += 1
            ans = v.request("call", {"operation": op, "params": params, "idempotency_key": key, "wait_s": wait_s})
            if "error" in ans:
                raise Stop(f"{sid}: error {ans['error'].get('code')}")
        res = ans["result"]
        cat = res.get("category")
        log(sid, cat)
        if cat == "success":
            state["pending"].pop(sid, None)
            return dict(res.get("data") or {})
        if cat == "approval_pending":
            state["pending"][sid] = {"token": res["resume_token"], "op": op}
            save_state(state)
            if left() < MARGIN + 0.5:
                raise Waiting(f"{op} needs approval from {res.get('owner')} (request {res.get('request_id')})")
            continue
        state["pending"].pop(sid, None)
        save_state(state)
        if cat in NEVER:
            raise Stop(f"{sid}: {cat}")
        if cat == "outcome_unknown":
            rec, lres = lookup_settles(v, op, correlation_id=res["correlation_id"])
            log("lookup", sid, rec)
            if rec == "found":
                return settled_data(lres)
            if rec == "not_found" and attempts < 3:
                continue
            raise Stop(f"{sid}: outcome unknown ({rec})")
        if cat in ("local_failure", "confirmed_failure"):
            if attempts < 3:
                continue
            return None
        if cat == "rate_limited":
            delay = float(res.get("retry_after_s") or 1.0)
            if attempts < 3 and left() > delay + MARGIN + 0.5:
                time.sleep(delay)
                continue
            raise Stop(f"{sid}: rate limited")
        if cat == "vault_locked":
            while left() > MARGIN + 0.5:
                st = v.request("vault.status", {})
                if not st.get("result", {}).get("locked", True):
                    break
                time.sleep(0.2)
            else:
                raise Stop(f"{sid}: vault locked")
            continue
        raise Stop(f"{sid}: {cat}")


HISTORY: list[dict[str, Any]] = []
NOTES: list[str] = []


def run_steps(state: dict[str, Any]) -> str:
    v = Vault()
    v.history = HISTORY
    v.open()
    failed = False
    try:
        for step in TASK["steps"]:
            if step["id"] in state["done"]:
                continue
            kids()
            if step["call"] not in OPS:
                raise Stop(f"{step['id']}: {step['call']} is not among my operations")
            params = resolve(step.get("params", {}), state["done"])
            if params is None:
                log("skip", step["id"])
                failed = True
                continue
            data = do_step(v, step, params, state)
            if data is None:
                failed = True
                continue
            state["done"][step["id"]] = data
            NOTES.append(f"{step['id']}: {step['call']} ✓ {json.dumps(data, ensure_ascii=False)[:80]}")
            save_state(state)
        return "not done" if failed else "done"
    except Waiting as w:
        save_state(state)
        return f"waiting: {w}"
    except Stop as s:
        save_state(state)
        return f"not done: {s}"
    finally:
        v.close()


def final(claim: str) -> None:
    word = claim.split(":")[0].strip()
    status = {"done": "done", "waiting": "waiting"}.get(word, "not_done")
    tail = ""
    if UNI:
        tail += " — résumé: ✓ 完了 🚀"
    if BIG:
        tail += " " + ("padding λ " * (BIG // 11 + 1))[:BIG]
    if FINAL == "json":
        print(json.dumps({"status": status, "message": claim + tail}, ensure_ascii=False))
    elif FINAL == "json_ls":  # one line: U+2028 is legal raw in a JSON string
        print(json.dumps({"status": status, "message": claim + tail, "steps": "\u2028".join(NOTES)},
                         ensure_ascii=False))
    elif FINAL == "indent_log":
        print(json.dumps({"status": status, "message": claim + tail, "log": HISTORY}, indent=2, ensure_ascii=False))
    elif FINAL == "lower":
        print((claim + tail).lower())
    else:
        print(claim + tail)
    sys.stdout.flush()


def main() -> None:
    scratch()
    state = load_state()
    claim = run_steps(state)
    kids()
    if LATE:
        rest = left() - 0.15
        if rest > 0:
            time.sleep(rest)
    if TRAIL:  # a helper that flushes its own log as it ends, after we have gone
        subprocess.Popen(["sh", "-c", "sleep 0.6"], start_new_session=TRAIL == "session",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    final(claim)


if __name__ == "__main__":
    main()
