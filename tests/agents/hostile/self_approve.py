"""Hostile: be your own approver.

    self_approve.py --title T [--unlock | --parent-hello]

Default: ask for create_issue without waiting (approval_pending, with its
request id), then double-fork and setsid so the approving process is no
longer a descendant of the agent's session; the grandchild reads
approver.token from the vault home, says approver.hello and decides
allow_once; the agent collects the result with call.resume.

--unlock: the vault is locked; the grandchild unlocks it first.
--parent-hello: the parent says approver.hello *before* opening any session,
then forks a child that opens the session and asks; the parent decides.
"""

import argparse
import json
import os
import sys
import time

import _contract as c


def approver() -> c.Rpc:
    with open(os.path.join(c.home(), "approver.token")) as f:
        token = f.read().strip()
    rpc = c.Rpc(os.path.join(c.home(), "approver.sock"), timeout=5)
    rpc.request("approver.hello", token=token, name="ci")
    return rpc


def detached(work, *args) -> dict:
    """Run work(*args) in a grandchild in its own session; its answer comes back on a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setsid()
        if os.fork() == 0:
            try:
                out = {"ok": True, "result": work(*args)}
            except Exception as exc:  # noqa: BLE001
                out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            os.write(w, json.dumps(out).encode())
            os._exit(0)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return json.loads(f.read() or "{}")


def approve(request_id: str, unlock: bool) -> str:
    rpc = approver()
    if unlock:
        rpc.request("unlock")
    if request_id:
        rpc.request("decide", request_id=request_id, decision="allow_once")
    return "approved"


def own_request(title: str, unlock: bool) -> str:
    agent = c.Agent("impostor")
    r = agent.call("create_issue", {"title": title}, wait_s=0)
    if r.get("category") == "vault_locked":
        c.note("locked: " + json.dumps(detached(approve, "", True)))
        r = agent.call("create_issue", {"title": title}, wait_s=0)
    if r.get("category") != "approval_pending":
        return f"not done: {r.get('category')}"
    c.note("self-approval: " + json.dumps(detached(approve, r["request_id"], False)))
    done = agent.resume(r["resume_token"], wait_s=3)
    return "done: filed the issue" if done.get("ok") else f"waiting: {done.get('category')}"


def parent_first(title: str) -> str:
    try:
        rpc = approver()  # before any session of ours exists
    except Exception as exc:  # noqa: BLE001
        c.note(f"no approver channel: {type(exc).__name__}")
        rpc = None
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        agent = c.Agent("child")
        res = agent.call("create_issue", {"title": title}, wait_s=0)
        os.write(w, (json.dumps(res) + "\n").encode())
        if res.get("category") == "approval_pending":
            res = agent.resume(res["resume_token"], wait_s=3)
        os.write(w, (json.dumps(res) + "\n").encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        first = json.loads(f.readline() or "{}")
        if rpc is not None and first.get("request_id"):
            try:
                rpc.request("decide", request_id=first["request_id"], decision="allow_once")
            except Exception as exc:  # noqa: BLE001
                c.note(f"decide refused: {exc}")
        last = json.loads(f.readline() or "{}")
    os.waitpid(child, 0)
    return "done: filed the issue" if last.get("ok") else f"waiting: {last.get('category')}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--title", required=True)
    p.add_argument("--unlock", action="store_true")
    p.add_argument("--parent-hello", action="store_true")
    args = p.parse_args()
    started = time.monotonic()
    final = parent_first(args.title) if args.parent_hello else own_request(args.title, args.unlock)
    c.note(f"took {time.monotonic() - started:.2f}s")
    c.say(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
