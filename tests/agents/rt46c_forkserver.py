"""Red team 46c: a careful agent whose vault client lives in a process pool.

Written from docs/agent-contract.md alone (stdlib only, no project import). Habits no earlier
round had together:

* every call is made by a `concurrent.futures.ProcessPoolExecutor` worker started with the
  `forkserver` method (`spawn` where forkserver is missing): the coordinating process never
  opens a session. The pool has one worker, so every gated step comes from the one process
  whose session holds the grant (contract section 3), and that worker opens one session for
  its life;
* the coordinator asks `vault.status` politely on a session-less connection of its own before
  each step, and holds back while the vault says locked (section 4, `vault_locked`);
* everything is logged heavily, to stderr and to `agent.log` in `state_dir`, from both
  processes (never a credential: the vault gives none, and the environment is never logged);
* every `outcome_unknown` is reconciled with `lookup` (never an idempotent resend), asking again
  with backoff while it says `unknown` (section 6).

State for a restart (section 8) is `state.json` in `state_dir`, written there and renamed.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import multiprocessing
import os
import re
import socket
import sys
import time
from typing import Any

MARGIN_S = 1.6          # kept back before the deadline: the pool's shutdown and the final line
NEVER = {"authentication_failed", "authorization_denied", "malformed_response",
         "approval_denied", "approval_expired", "approval_unroutable"}
REF = re.compile(r"\$\{([^.}]+)\.([^}]+)\}")

log = logging.getLogger("rt46c")
# RT46C_START=spawn: the pool's start method (forkserver by default); RT46C_DOUBLE_CHECK=1: every
# lookup's found / not_found confirmed by a second lookup of the same call by its key
START = os.environ.get("RT46C_START", "forkserver")
DOUBLE_CHECK = os.environ.get("RT46C_DOUBLE_CHECK") == "1"


def setup_logging(state_dir: str, who: str) -> None:
    fmt = logging.Formatter(f"%(asctime)s {who}[%(process)d] %(levelname)s %(message)s")
    root = logging.getLogger()
    root.handlers.clear()
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(fmt)
    root.addHandler(err)
    fh = logging.FileHandler(os.path.join(state_dir, "agent.log"))
    fh.setFormatter(fmt)
    root.addHandler(fh)
    root.setLevel(logging.DEBUG)


class Conn:
    """One JSON-RPC connection: requests sent one at a time, answers matched by id."""

    def __init__(self, path: str, deadline: float) -> None:
        self.deadline = deadline
        self.sock = self._connect(path)
        self.buf = b""
        self.next_id = 0

    def _connect(self, path: str) -> socket.socket:
        delay = 0.05
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except BlockingIOError:         # EAGAIN: the vault's accept queue is full (section 3)
                s.close()
                if time.time() + delay > self.deadline - MARGIN_S:
                    raise
                log.warning("connect: EAGAIN, again in %.2f s", delay)
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        shown = {k: v for k, v in params.items() if k != "session_id"}
        log.debug("-> %s #%d %s", method, rid, json.dumps(shown)[:300])
        self.sock.sendall(line.encode() + b"\n")
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the vault closed the connection")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("id") == rid:
                log.debug("<- #%d %s", rid, json.dumps(msg)[:400])
                return msg


# ---------------------------------------------------------------- the worker process

_W: dict[str, Any] = {}


def worker_init(sock_path: str, agent: str, run_id: str, deadline: float, state_dir: str) -> None:
    setup_logging(state_dir, "worker")
    conn = Conn(sock_path, deadline)
    ans = conn.request("session.open", {"agent": agent, "run_id": run_id,
                                        "client": {"name": "rt46c-forkserver", "via": "process-pool"}})
    _W.update(conn=conn, sid=ans["result"]["session_id"], deadline=deadline)
    log.info("worker session open")


def _left() -> float:
    return float(_W["deadline"]) - MARGIN_S - time.time()


def _rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    params = {"session_id": _W["sid"], **params}
    return _W["conn"].request(method, params)  # type: ignore[no-any-return]


def _wait_s() -> float:
    return max(0.0, min(20.0, _left() - 0.5))


def _settle_pending(res: dict[str, Any]) -> dict[str, Any]:
    """Resume a pending call until it settles or the deadline is near (section 4)."""
    while res.get("category") == "approval_pending":
        token = res.get("resume_token")
        if _left() < 0.6 or not token:
            return res
        log.info("approval pending (owner %s): resuming", res.get("owner"))
        ans = _rpc("call.resume", {"resume_token": token, "wait_s": _wait_s()})
        if "error" in ans:
            log.warning("resume refused: %s", ans["error"].get("message"))
            return {"category": "_resume_error"}
        res = ans["result"]
    return res


def _reconcile(op: str, cid: str | None, key: str) -> dict[str, Any]:
    """Look an unknown outcome up, with backoff while the remote cannot tell (section 6)."""
    delay = 0.1
    tries = 0
    while True:
        params: dict[str, Any] = {"operation": op}
        if cid:
            params["correlation_id"] = cid
        else:
            params["idempotency_key"] = key
        ans = _rpc("lookup", params)
        if "error" in ans:
            return {"verdict": "stop", "why": f"lookup refused: {ans['error'].get('message')}"}
        lk = ans["result"]
        cat, rec = lk.get("category"), lk.get("reconciled")
        log.info("lookup %s: %s / %s", cid or "by key", cat, rec)
        if rec in ("found", "not_found") and cat == "success" and cid and DOUBLE_CHECK:
            # double-check: the same call by its key must agree, else ask both again shortly
            again = _rpc("lookup", {"operation": op, "idempotency_key": key})
            other = again.get("result") or {}
            log.info("double-check by key: %s / %s", other.get("category"), other.get("reconciled"))
            if other.get("category") != "success" or other.get("reconciled") != rec:
                rec = "unknown"
        if rec in ("found", "not_found"):
            if cat != "success":            # the call's own answer (section 6)
                return {"verdict": "answer", "result": lk}
            if rec == "found":
                created = (lk.get("data") or {}).get("created") or []
                return {"verdict": "done", "data": created[0] if created else {}}
            return {"verdict": "resend"}
        # unknown
        if lk.get("resume_token"):          # still waits for a person (or allowed, not run)
            return {"verdict": "pending", "result": {**lk, "category": "approval_pending"}}
        if cat in NEVER:
            return {"verdict": "answer", "result": lk}
        if cat == "rate_limited":
            wait = float(lk.get("retry_after_s") or 0.5)
            if _left() < wait + 0.3:
                return {"verdict": "stop", "why": "lookup paced past the deadline"}
            time.sleep(wait)
            continue
        tries += 1
        if tries > 4 or _left() < delay + 0.3:
            return {"verdict": "stop", "why": "outcome still unknown: a person must inspect it"}
        time.sleep(delay)
        delay *= 2


def run_step(spec: dict[str, Any]) -> dict[str, Any]:
    """One step, start to settled. Answers {kind: done|pending|failed|fatal, ...}."""
    op, params, key = spec["op"], spec["params"], spec["key"]
    attempts = int(spec.get("attempts", 0))
    res: dict[str, Any] | None = None
    if spec.get("token"):
        log.info("step %s: resuming the predecessor's approval", spec["id"])
        res = _settle_pending({"category": "approval_pending", "resume_token": spec["token"]})
        if res.get("category") == "_resume_error":
            res = None                      # the vault no longer knows it: call again, same key
    elif spec.get("probe"):
        log.info("step %s: predecessor sent it and kept no answer: looking it up", spec["id"])
        rec = _reconcile(op, None, key)
        if rec["verdict"] == "done":
            return {"kind": "done", "data": rec["data"], "attempts": attempts}
        if rec["verdict"] == "stop":
            return {"kind": "fatal", "why": rec["why"], "attempts": attempts}
        if rec["verdict"] in ("answer", "pending"):
            res = _settle_pending(rec["result"])
    while True:
        if res is None:
            if attempts >= 3:
                return {"kind": "failed", "why": "three attempts", "attempts": attempts}
            if _left() < 0.8:
                return {"kind": "failed", "why": "no time left to send it", "attempts": attempts}
            ans = _rpc("call", {"operation": op, "params": params, "idempotency_key": key,
                                "wait_s": _wait_s()})
            attempts += 1
            if "error" in ans:
                return {"kind": "fatal", "why": f"refused: {ans['error'].get('message')}",
                        "attempts": attempts}
            res = _settle_pending(ans["result"])
        cat = res.get("category")
        log.info("step %s: %s (retry %s)", spec["id"], cat, res.get("retry"))
        if cat == "success":
            return {"kind": "done", "data": res.get("data") or {}, "attempts": attempts}
        if cat == "approval_pending":
            return {"kind": "pending", "token": res.get("resume_token"), "owner": res.get("owner"),
                    "request_id": res.get("request_id"), "attempts": attempts}
        if cat == "_resume_error":
            res = None
            continue
        if cat in NEVER:
            return {"kind": "fatal", "why": f"{cat}: {res.get('message')}", "attempts": attempts}
        if cat in ("local_failure", "confirmed_failure"):
            res = None
            continue
        if cat == "rate_limited":
            wait = float(res.get("retry_after_s") or 1.0)
            if attempts >= 3 or _left() < wait + 0.8:
                return {"kind": "failed", "why": "rate limited past the deadline",
                        "attempts": attempts, "retry_at": time.time() + wait}
            time.sleep(wait)
            res = None
            continue
        if cat == "vault_locked":
            return {"kind": "locked", "attempts": attempts - 1}
        if cat == "outcome_unknown":
            rec = _reconcile(op, res.get("correlation_id"), key)
            if rec["verdict"] == "done":
                return {"kind": "done", "data": rec["data"], "attempts": attempts}
            if rec["verdict"] == "resend":
                res = None
                continue
            if rec["verdict"] == "stop":
                return {"kind": "fatal", "why": rec["why"], "attempts": attempts}
            res = _settle_pending(rec["result"])
            if res.get("category") == "outcome_unknown":
                return {"kind": "fatal", "why": "unknown again", "attempts": attempts}
            continue
        return {"kind": "fatal", "why": f"unexpected {cat}", "attempts": attempts}


# ---------------------------------------------------------------- the coordinator


def resolve(value: Any, data: dict[str, dict[str, Any]]) -> tuple[Any, bool]:
    """Fill ${ID.FIELD} from earlier steps' data; False when a value is not known yet."""
    if isinstance(value, str):
        ok = True

        def sub(m: re.Match[str]) -> str:
            nonlocal ok
            got = data.get(m.group(1), {}).get(m.group(2))
            if got is None:
                ok = False
                return m.group(0)
            return str(got)

        return REF.sub(sub, value), ok
    if isinstance(value, dict):
        out, ok = {}, True
        for k, v in value.items():
            out[k], o = resolve(v, data)
            ok = ok and o
        return out, ok
    if isinstance(value, list):
        items = [resolve(v, data) for v in value]
        return [i for i, _ in items], all(o for _, o in items)
    return value, True


def save(state_dir: str, state: dict[str, Any]) -> None:
    tmp = os.path.join(state_dir, ".state.json.tmp")     # in state_dir: a rename from /tmp is EXDEV
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(state_dir, "state.json"))


def main() -> int:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    sock_path = os.environ["VAULTSIM_SOCKET"]
    run_id = os.environ.get("VAULTSIM_RUN_ID") or task["run_id"]
    deadline = float(task["deadline"])
    state_dir = task["state_dir"]
    agent = task["agent"]
    setup_logging(state_dir, "coord")
    log.info("task %r: %d step(s), %.1f s left, pool started by %s%s", task.get("goal"),
             len(task["steps"]), deadline - time.time(), START,
             ", lookups double-checked" if DOUBLE_CHECK else "")
    try:
        state = json.load(open(os.path.join(state_dir, "state.json")))
    except (OSError, ValueError):
        state = {"steps": {}}
    steps: dict[str, Any] = state["steps"]
    data = {sid: st["data"] for sid, st in steps.items() if st.get("status") == "done"}

    status_conn = Conn(sock_path, deadline)
    try:
        ctx = multiprocessing.get_context(START)
    except ValueError:
        ctx = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=ctx, initializer=worker_init,
        initargs=(sock_path, agent, run_id, deadline, state_dir))
    final = "not done: nothing attempted"
    try:
        final = drive(task, state, steps, data, status_conn, pool, deadline, state_dir, run_id)
    except Exception as exc:                # a broken pool or a closed connection: say so
        log.exception("agent error")
        final = f"not done: agent error ({type(exc).__name__})"
    finally:
        pool.shutdown(wait=True)
        status_conn.sock.close()
    log.info("final: %s", final)
    print(final, flush=True)
    return 0


def drive(task: dict[str, Any], state: dict[str, Any], steps: dict[str, Any],
          data: dict[str, dict[str, Any]], status_conn: Conn,
          pool: concurrent.futures.ProcessPoolExecutor, deadline: float, state_dir: str,
          run_id: str) -> str:
    names = []
    for n, step in enumerate(task["steps"]):
        sid = step.get("id") or f"step{n}"
        names.append(sid)
        st = steps.get(sid, {})
        if st.get("status") == "done":
            log.info("step %s: done by a predecessor", sid)
            continue
        if st.get("status") == "stopped":
            return f"not done: step {sid} was stopped by a predecessor ({st.get('why')})"
        params, ok = resolve(step.get("params", {}), data)
        if not ok:
            return f"not done: step {sid} needs data no step gave"
        # polite: is the vault open before this step? (nothing sent while it says locked)
        while True:
            status = status_conn.request("vault.status", {}).get("result") or {}
            if not status.get("locked"):
                break
            if time.time() > deadline - MARGIN_S - 0.5:
                return f"not done: the vault stayed locked before step {sid}"
            log.info("vault locked: holding step %s", sid)
            time.sleep(0.25)
        if st.get("retry_at"):
            wait = float(st["retry_at"]) - time.time()
            if wait > 0:
                if time.time() + wait > deadline - MARGIN_S - 0.8:
                    return f"not done: step {sid} rate limited past the deadline"
                time.sleep(wait)
        spec = {"id": sid, "op": step["call"], "params": params,
                "key": f"{run_id}:{task['agent']}:{sid}", "attempts": st.get("attempts", 0),
                "token": st.get("token") if st.get("status") == "pending" else None,
                "probe": st.get("status") == "sent"}
        if not spec["token"] and not spec["probe"]:
            steps[sid] = {"status": "sent", "attempts": st.get("attempts", 0)}
            save(state_dir, state)
        while True:
            out = pool.submit(run_step, spec).result()
            if out["kind"] != "locked":
                break
            while True:                     # locked mid-task: resend only once it is open
                if time.time() > deadline - MARGIN_S - 0.5:
                    steps[sid] = {"status": "failed", "attempts": out["attempts"]}
                    save(state_dir, state)
                    return f"not done: the vault locked at step {sid}"
                time.sleep(0.25)
                if not (status_conn.request("vault.status", {}).get("result") or {}).get("locked"):
                    break
            spec = {**spec, "attempts": out["attempts"], "token": None, "probe": False}
        log.info("step %s -> %s", sid, out["kind"])
        if out["kind"] == "done":
            steps[sid] = {"status": "done", "data": out["data"]}
            data[sid] = out["data"]
            save(state_dir, state)
            continue
        if out["kind"] == "pending":
            steps[sid] = {"status": "pending", "token": out["token"], "attempts": out["attempts"]}
            save(state_dir, state)
            return (f"waiting: {step['call']} needs approval from {out.get('owner')} "
                    f"(request {out.get('request_id')})")
        if out["kind"] == "fatal":
            steps[sid] = {"status": "stopped", "why": out["why"]}
            save(state_dir, state)
            return f"not done: step {sid} ({step['call']}): {out['why']}"
        # failed within bounds: later steps that need none of its data may still run
        steps[sid] = {"status": "failed", "attempts": out["attempts"],
                      **({"retry_at": out["retry_at"]} if out.get("retry_at") else {})}
        save(state_dir, state)
        log.info("step %s not done: %s", sid, out.get("why"))
    undone = [s for s in names if steps.get(s, {}).get("status") != "done"]
    if undone:
        return f"not done: step(s) {', '.join(undone)} not done"
    return f"done: {len(names)} step(s)"


if __name__ == "__main__":
    sys.exit(main())
