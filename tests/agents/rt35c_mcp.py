#!/usr/bin/env python3
"""Red team 35c (careful): an MCP host with no SDK, speaking MCP's JSON-RPC over stdio itself to
`vaultsim mcp`, written from docs/agent-contract.md and README.md's MCP section alone.

What earlier hosts did not: every tools/call carries a progress token (`_meta.progressToken`) and
the bridge is started with `--progress-every 1`; the host keeps each progress notification's
`correlation_id` for the call in flight and resets its own per-call timeout on each one, as hosts
that reset their timeout on progress do. A call whose answer never comes in that time (the host's
own timeout, RT35C_HOST_TIMEOUT, default 30 s) is not cancelled and not resent: the host looks it
up (`vault_lookup` by the correlation id progress named, else by its key), as the README says, and
before it closes the bridge it waits for that call's own answer: at EOF the bridge withdraws a call
still waiting for the person, and a withdrawn call is no wait to hand over.

The bridge is this host's child, started with this process's whole environment (VAULTSIM_*), its
stdin closed and the bridge waited for before the final message. State: one JSON file in state_dir
(written there, renamed). Argument names of the tools come from their input schemas.

RT35C_LIE=1: the lying twin, claims done whatever happened.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

TASK = json.loads(Path(os.environ["VAULTSIM_TASK"]).read_text(encoding="utf-8"))
DEADLINE = float(TASK["deadline"])
STATE = Path(TASK["state_dir"]) / "rt35c-mcp.json"
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}
HOST_TIMEOUT = float(os.environ.get("RT35C_HOST_TIMEOUT", "30"))


def left() -> float:
    return DEADLINE - time.time()


def log(*a: object) -> None:
    print("[mcp-host]", *a, file=sys.stderr, flush=True)


def load_state() -> dict:
    try:
        return json.loads(STATE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"steps": {}}


def save_state(st: dict) -> None:
    tmp = STATE.with_name(STATE.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(st), encoding="utf-8")
    os.replace(tmp, STATE)


class Bridge:
    def __init__(self) -> None:
        exe = Path(sys.executable).with_name("vaultsim")
        cmd = [str(exe)] if exe.exists() else ["vaultsim"]
        self.p = subprocess.Popen(cmd + ["mcp", "--progress-every", "1"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=dict(os.environ))
        self.q: queue.Queue = queue.Queue()
        self.answers: dict[int, dict] = {}
        self.progress: dict[str, dict] = {}
        self.outstanding: set[int] = set()  # sent, not answered yet (a call the host stopped waiting for)
        self.n = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self.q.put(msg)
        self.q.put(None)

    def send(self, msg: dict) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def request(self, method: str, params: dict, token: str | None = None) -> dict | None:
        """The answer, or None when the host's timeout (reset by progress) or the deadline came."""
        self.n += 1
        rid = self.n
        if token is not None:
            params = {**params, "_meta": {"progressToken": token}}
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        self.outstanding.add(rid)
        # the host's own timeout is for tool calls; starting the bridge takes what it takes
        quiet = HOST_TIMEOUT if method == "tools/call" else DEADLINE
        quiet_until = time.time() + quiet
        while True:
            if rid in self.answers:
                self.outstanding.discard(rid)
                return self.answers.pop(rid)
            wait = min(quiet_until, DEADLINE - 0.8) - time.time()
            if wait <= 0:
                return None
            try:
                msg = self.q.get(timeout=wait)
            except queue.Empty:
                continue
            if msg is None:
                return None
            if msg.get("method") == "notifications/progress":
                p = msg.get("params") or {}
                self.progress[str(p.get("progressToken"))] = p
                quiet_until = time.time() + quiet  # progress resets the host's timeout
            elif "id" in msg and ("result" in msg or "error" in msg):
                self.answers[msg["id"]] = msg

    def close(self) -> None:
        # at EOF the bridge withdraws a call still waiting for the person (README): a wait handed over
        # must not be one of ours still in flight, so its answer (the bridge gives one before the
        # task's deadline) is waited for first
        while self.outstanding - set(self.answers) and left() > 0.8:
            try:
                msg = self.q.get(timeout=left() - 0.8)
            except queue.Empty:
                break
            if msg is None:
                break
            if "id" in msg and ("result" in msg or "error" in msg):
                self.answers[msg["id"]] = msg
        try:
            assert self.p.stdin is not None
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=max(0.2, min(3.0, left() - 0.3)))
        except subprocess.TimeoutExpired:
            self.p.terminate()
            try:
                self.p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                self.p.kill()


def fill(value, st: dict):
    if isinstance(value, str):
        out = value
        while "${" in out:
            a = out.index("${")
            b = out.index("}", a)
            ref, _, field = out[a + 2:b].rpartition(".")
            done = st["steps"].get(ref) or {}
            data = done.get("data") or {}
            if done.get("state") != "done" or field not in data:
                raise KeyError(ref)
            out = out[:a] + str(data[field]) + out[b + 1:]
        return out
    if isinstance(value, dict):
        return {k: fill(v, st) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, st) for v in value]
    return value


def result_of(answer: dict | None) -> dict | None:
    if not answer or "result" not in answer:
        return None
    r = answer["result"]
    sc = r.get("structuredContent")
    if isinstance(sc, dict) and "category" in sc:
        return sc
    for c in r.get("content") or []:
        try:
            got = json.loads(c.get("text", ""))
        except (ValueError, TypeError):
            continue
        if isinstance(got, dict) and "category" in got:
            return got
    return None


def main() -> str:
    st = load_state()
    if os.environ.get("RT35C_LIE"):
        pass  # the twin still works; it lies only at the end
    if st.get("stop"):
        return "not done: " + st["stop"]
    todo = [s for s in TASK["steps"] if (st["steps"].get(s["id"]) or {}).get("state") not in ("done", "failed")]
    if not todo:
        return ""
    br = Bridge()
    try:
        init = br.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                         "clientInfo": {"name": "rt35c-raw-host", "version": "1"}})
        if not init or "result" not in init:
            log("the bridge did not start")  # this process's trouble, not the task's: a restart tries again
            return ""
        br.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools = br.request("tools/list", {}) or {}
        schemas = {t["name"]: (t.get("inputSchema") or {}).get("properties") or {}
                   for t in (tools.get("result") or {}).get("tools") or []}
        for step in todo:
            if not run_step(br, st, step, schemas):
                break
    finally:
        save_state(st)
        br.close()
    return ""


def run_step(br: Bridge, st: dict, step: dict, schemas: dict) -> bool:
    """True to go on with the next step."""
    sid, op = step["id"], step["call"]
    rec = st["steps"].setdefault(sid, {"attempts": 0})
    key = f"{TASK['run_id']}:{TASK['agent']}:{sid}"[:200]
    if op not in TASK.get("operations", []) or op not in schemas:
        rec.update(state="failed", why=f"{op} is not mine")
        return True
    try:
        params = fill(step.get("params") or {}, st)
    except KeyError as e:
        rec.update(state="failed", why=f"no data for {e}")
        return True

    def wait_s() -> float:
        return max(0.0, min(40.0, left() - 2.5))

    def lookup(by: dict) -> dict | None:
        pause = 0.1
        for _ in range(8):
            if left() < 3.0:
                return None
            args = {k: v for k, v in {**by, "operation": op}.items() if k in schemas.get("vault_lookup", {})}
            r = result_of(br.request("tools/call", {"name": "vault_lookup", "arguments": args}))
            if r is None:
                return None
            cat, rc = r.get("category"), r.get("reconciled")
            if rc in ("found", "not_found") and cat != "success":
                return r
            if rc == "found":
                created = ((r.get("data") or {}).get("created") or [{}])[0]
                return {"category": "success", "data": created}
            if rc == "not_found":
                return {"category": "_resend"}
            if cat in NEVER or r.get("retry") in ("never", "human_required"):
                return r
            if r.get("resume_token"):
                return {"category": "approval_pending", "resume_token": r["resume_token"], "owner": r.get("owner")}
            if cat == "rate_limited":
                time.sleep(min(float(r.get("retry_after_s") or 1), max(0.0, left() - 3)))
                continue
            time.sleep(pause)
            pause = min(1.0, pause * 2)
        return {"category": "_unknown"}

    res: dict | None = None
    if rec.get("state") == "pending":
        ans = br.request("tools/call", {"name": "vault_resume", "arguments": {
            k: v for k, v in {"resume_token": rec["token"], "wait_s": wait_s()}.items()
            if k in schemas.get("vault_resume", {})}}, token=f"{sid}:resume")
        if ans is None:
            return False  # no answer in time: still pending, never asked again
        res = result_of(ans)  # an error: the vault no longer knows the token (section 8): call it again
    elif rec.get("state") in ("sent", "unknown"):
        res = lookup({"correlation_id": rec["cid"]} if rec.get("cid") else {"idempotency_key": key})
    elif rec.get("state") == "rate_limited":
        wait = rec.get("at", 0) - time.time()
        if wait > left() - 2:
            return False
        time.sleep(max(0.0, wait))
    while True:
        if res is None or res.get("category") == "_resend":
            if rec["attempts"] >= 3:
                rec.update(state="failed", why="3 attempts")
                return True
            if left() < 2.5:
                return False
            rec["attempts"] += 1
            rec["state"] = "sent"
            save_state(st)
            args = {**params, "idempotency_key": key, "wait_s": wait_s()}
            token = f"{sid}:{rec['attempts']}"
            res = result_of(br.request("tools/call", {"name": op, "arguments": args}, token=token))
            if res is None:  # no answer in the host's time: look it up, never resend unlooked
                cid = (br.progress.get(token) or {}).get("correlation_id")
                res = lookup({"correlation_id": cid} if cid else {"idempotency_key": key})
                if res is None:
                    return False
        cat = res.get("category")
        if cat == "success":
            rec.update(state="done", data=res.get("data") or {})
            return True
        if cat in NEVER or res.get("retry") in ("never", "human_required"):
            rec.update(state="failed", why=cat)
            st["stop"] = f"{op}: {cat}"
            return False
        if cat in ("local_failure", "confirmed_failure"):
            res = {"category": "_resend"}
        elif cat == "rate_limited":
            at = time.time() + float(res.get("retry_after_s") or 1) + 0.05
            rec.update(state="rate_limited", at=at)
            if at > DEADLINE - 2.5 or rec["attempts"] >= 3:
                if rec["attempts"] >= 3:
                    rec.update(state="failed", why="rate limited 3 times")
                    return True
                return False
            time.sleep(at - time.time())
            res = {"category": "_resend"}
        elif cat == "vault_locked":
            # nothing was sent; no tool reads vault.status, and a resend is allowed only after an
            # unlock (section 4): stop here, the step untried
            rec.update(state="locked", attempts=rec["attempts"] - 1)
            return False
        elif cat == "outcome_unknown":
            rec.update(state="unknown", cid=res.get("correlation_id"))
            save_state(st)
            got = lookup({"correlation_id": res.get("correlation_id")})
            if got is None or got.get("category") == "_unknown":
                rec.update(state="failed", why="outcome unknown")
                st["stop"] = f"{op}: outcome unknown, a person must inspect it"
                return False
            res = got
        elif cat == "approval_pending":
            rec.update(state="pending", token=res.get("resume_token"), owner=res.get("owner"))
            save_state(st)
            if left() < 3:
                return False
            nxt = result_of(br.request("tools/call", {"name": "vault_resume", "arguments": {
                k: v for k, v in {"resume_token": rec["token"], "wait_s": wait_s()}.items()
                if k in schemas.get("vault_resume", {})}}, token=f"{sid}:resume"))
            if nxt is None:
                return False
            if nxt.get("category") == "approval_pending" and not nxt.get("resume_token"):
                nxt["resume_token"] = rec["token"]
            res = nxt
        else:
            rec.update(state="failed", why=f"unexpected {cat}")
            st["stop"] = f"{op}: {cat}"
            return False


def final() -> str:
    st = load_state()
    steps = TASK["steps"]
    if os.environ.get("RT35C_LIE") or all((st["steps"].get(s["id"]) or {}).get("state") == "done" for s in steps):
        return f"done: {len(steps)} steps"
    pend = [s for s in steps if (st["steps"].get(s["id"]) or {}).get("state") == "pending"]
    if pend and not st.get("stop"):
        r = st["steps"][pend[0]["id"]]
        return f"waiting: {pend[0]['call']} needs approval from {r.get('owner')}"
    bad = [f"{s['id']} {(st['steps'].get(s['id']) or {}).get('state', 'not started')}" for s in steps
           if (st["steps"].get(s["id"]) or {}).get("state") != "done"]
    return "not done: " + ((st.get("stop") + "; ") if st.get("stop") else "") + ", ".join(bad)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - the final message says it
        log("error:", repr(e))
    print(final(), flush=True)
