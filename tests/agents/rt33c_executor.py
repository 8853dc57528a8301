#!/usr/bin/env python3
"""A careful agent on concurrent.futures, written from docs/agent-contract.md alone.

The habit of a Python team with a pool already: a ProcessPoolExecutor (forkserver start, so no
worker inherits a connection) whose initializer opens each worker's own connection and session
(section 3: one per process, kept for the worker's life). Consecutive steps the `catalog` answer
calls `approval.mode: auto` that need nothing of each other are submitted together; every other
step the main process calls itself, in order, on its own session. The step logic (retries,
reconciling, waiting) and the state file are rt33c_prefork's.
"""

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt33c_prefork as core  # noqa: E402

_worker = {}


def _open(task):
    _worker["sess"] = core.Session(task)


def _do(job):
    try:
        state, detail = core.run_step(_worker["sess"], job["step"], job["params"], job["key"], job["op"],
                                      attempts=job["attempts"], token=job["token"])
    except Exception as e:  # noqa: BLE001
        state, detail = "broken", repr(e)[:200]
    return {"id": job["step"], "state": state, "detail": detail}


def main():
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    deadline = float(task["deadline"])
    st = core.State(task["state_dir"])
    steps = task["steps"]
    allowed = set(task.get("operations") or [])
    key = lambda sid: "%s:%s:%s" % (task["run_id"], task["agent"], sid)  # noqa: E731
    ctx = multiprocessing.get_context(os.environ.get("RT33C_START", "forkserver"))
    pool = ProcessPoolExecutor(max_workers=3, mp_context=ctx, initializer=_open, initargs=(task,))
    sess = core.Session(task)
    done = {sid: v["data"] for sid, v in st.d["steps"].items() if v.get("state") == "done"}
    final = None
    try:
        if st.d.get("fatal"):
            raise StopIteration("not done: a predecessor was told to stop (%s)" % st.d["fatal"])
        r = sess.conn.request("catalog", None, timeout=10)
        modes = {e.get("name"): (e.get("approval") or {}).get("mode")
                 for e in (r.get("result") or {}).get("operations") or []}
        i = 0
        while i < len(steps):
            batch = []
            while i < len(steps):
                s = steps[i]
                if s["id"] in done or s["call"] not in allowed:
                    i += 1
                    continue
                need = [x.partition(".")[0] for x in core.refs(s.get("params") or {})]
                if any(n in [b["id"] for b in batch] for n in need):
                    break
                saved = st.step(s["id"])
                gated = (modes.get(s["call"]) != "auto" or saved.get("token")
                         or saved.get("state") in ("sent", "retry_at"))
                if gated and batch:
                    break
                if any(n not in done for n in need):
                    i += 1  # its data is missing: never guess it
                    continue
                batch.append(s)
                i += 1
                if gated:
                    break
            if not batch:
                continue
            if len(batch) == 1 and (modes.get(batch[0]["call"]) != "auto" or st.step(batch[0]["id"])):
                res = one_here(sess, st, batch[0], done, key)
                outs = [res]
            else:
                jobs = []
                for s in batch:
                    st.put(s["id"], state="sent", attempts=0)
                    jobs.append({"step": s["id"], "op": s["call"], "params": core.resolve(s.get("params") or {}, done),
                                 "key": key(s["id"]), "attempts": 0, "token": None})
                outs = list(pool.map(_do, jobs, timeout=max(1.0, deadline - time.time() - 0.5)))
            stop = record(st, outs, done)
            if stop:
                raise StopIteration(stop)
        missing = [s["id"] for s in steps if s["id"] not in done]
        final = "done: %d steps" % len(steps) if not missing else "not done: %s not done" % ", ".join(missing)
    except StopIteration as e:
        final = str(e)
    except Exception as e:  # noqa: BLE001
        core.log("broke:", repr(e)[:200])
        final = "not done: the agent broke (%s)" % type(e).__name__
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if time.time() < deadline - 0.2:
            sess.close()
    if os.environ.get("RT33C_LIE") == "1":
        final = "done: all steps"
    print(final, flush=True)


def one_here(sess, st, s, done, key):
    sid, op = s["id"], s["call"]
    saved = st.step(sid)
    params = core.resolve(s.get("params") or {}, done)
    token = saved.get("token")
    if saved.get("state") == "retry_at":
        left = saved["at"] - time.time()
        if time.time() + max(left, 0) > sess.deadline - core.MARGIN:
            return {"id": sid, "state": "failed", "detail": "retry_after past the deadline"}
        time.sleep(max(left, 0))
    elif saved.get("state") == "sent" and not token:
        out = core.reconcile(sess, saved.get("cid"), op, key=key(sid))
        if out[0] == "found":
            return {"id": sid, "state": "done", "detail": out[1]}
        if out[0] == "pending":
            token = out[1]
        elif out[0] == "answer" and out[1].get("category") in core.FATAL:
            return {"id": sid, "state": "fatal", "detail": out[1]["category"]}
        elif out[0] == "unknown":
            return {"id": sid, "state": "unknown", "detail": saved.get("cid")}
    st.put(sid, state="sent", attempts=saved.get("attempts", 0))
    keep = lambda tok: st.put(sid, state="pending", token=tok, attempts=1)  # noqa: E731
    state, detail = core.run_step(sess, sid, params, key(sid), op, attempts=saved.get("attempts", 0),
                                  token=token, on_pending=keep)
    return {"id": sid, "state": state, "detail": detail}


def record(st, outs, done):
    stop = None
    for o in outs:
        sid, state, detail = o["id"], o["state"], o["detail"]
        if state == "done":
            done[sid] = detail
            st.put(sid, state="done", data=detail)
        elif state == "waiting":
            st.put(sid, state="pending", token=detail["token"], attempts=detail.get("attempts", 1))
            stop = stop or "waiting: %s needs approval from %s (request %s)" % (
                sid, detail.get("owner") or "its owner", detail.get("request_id"))
        elif state == "retry_at":
            st.put(sid, state="retry_at", at=detail["at"], attempts=detail["attempts"])
        elif state == "unknown":
            st.put(sid, state="sent", cid=detail)
            stop = stop or "not done: %s may have happened; a person must inspect it" % sid
        elif state == "fatal":
            st.d["fatal"] = "%s: %s" % (sid, detail)
            st.save()
            stop = "not done: stopped, %s: %s" % (sid, detail)
        else:
            core.log("step", sid, state, detail)
    return stop


if __name__ == "__main__":
    main()
