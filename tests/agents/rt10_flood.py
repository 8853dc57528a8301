"""Red team, tenth pass: a hostile agent that tries to lock every other client out of the vault
by holding connections. Stdlib only, written from docs/agent-contract.md (a Unix socket, JSON
lines, the task file, a last line on stdout).

It forks RT10_CHILDREN processes (default 40); each (in a session of its own with RT10_SETSID=1,
so its process group and session do not name the agent) opens connections to VAULTSIM_SOCKET
until the vault refuses one or it holds RT10_PER (default 256, the per-process limit), sending
`vault.status` on each to learn whether the vault kept it. With RT10_SESSIONS=1 it also opens a
session on each connection it kept. Every child reports `held refused first-refusal` on a pipe and
keeps its connections open until the parent lets go.

The parent prints one JSON line, {"held": N, "refused": N, "refusal": "..."}, then holds everything
until stdin closes (the test decides when: no sleeps), or, when started by `vaultsim run` (stdin
not a pipe), until RT10_HOLD_S seconds (default 2) before its task's deadline passes. Its final
message is `not done: ...`.

    RT10_MODE=probe: instead, a careful client: one connection, `session.open`, `vault.status`;
    prints {"ok": true, "session": "s-..."} or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def ask(sock: socket.socket, reader, rid: int, method: str, **params: object) -> dict:
    try:
        sock.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
    except (BrokenPipeError, ConnectionResetError):
        pass  # a refused connection is closed at once: what the vault said first is still to read
    while True:
        try:
            raw = reader.readline()
        except ConnectionResetError:
            raw = b""
        if not raw:
            return {"error": {"code": None, "message": "the vault closed the connection"}}
        msg = json.loads(raw)
        if msg.get("id") in (rid, None):
            return msg


def task() -> dict:
    path = os.environ.get("VAULTSIM_TASK")
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def agent_name() -> str:
    return str(task().get("agent") or "rt10")


def child(path: str, per: int, out: int, hold: int, sessions: bool) -> None:
    if os.environ.get("RT10_SETSID") == "1":
        os.setsid()
    kept: list[socket.socket] = []
    refused, first = 0, ""
    name = agent_name()
    for i in range(per):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            r = s.makefile("rb")
            msg = ask(s, r, 1, "vault.status")
            if "error" not in msg and sessions:
                msg = ask(s, r, 2, "session.open", agent=name, run_id=os.environ.get("VAULTSIM_RUN_ID"))
        except OSError as exc:
            msg = {"error": {"code": None, "message": f"connect failed: {exc.strerror}"}}
        if "error" in msg:
            refused += 1
            first = first or str(msg["error"].get("code")) + " " + str(msg["error"].get("message"))
            s.close()
            break  # refused: the vault said why; asking again only repeats it
        kept.append(s)
    os.write(out, f"{len(kept)}\t{refused}\t{first}\n".encode())
    os.read(hold, 1)  # until the parent lets go (or dies)
    os._exit(0)


def flood() -> None:
    path = os.environ["VAULTSIM_SOCKET"]
    n = int(os.environ.get("RT10_CHILDREN", "40"))
    per = int(os.environ.get("RT10_PER", "256"))
    sessions = os.environ.get("RT10_SESSIONS") == "1"
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(report_r)
            os.close(hold_w)
            child(path, per, report_w, hold_r, sessions)
        pids.append(pid)
    os.close(report_w)
    os.close(hold_r)
    held = refused = 0
    refusal = ""
    with os.fdopen(report_r, "r") as reports:
        for _ in range(n):  # one line a child (each keeps the pipe open while it holds)
            line = reports.readline()
            if not line:
                break
            k, r, why = line.rstrip("\n").split("\t", 2)
            held, refused = held + int(k), refused + int(r)
            refusal = refusal or why
    print(json.dumps({"held": held, "refused": refused, "refusal": refusal}), flush=True)
    if sys.stdin is not None and not sys.stdin.isatty() and os.environ.get("VAULTSIM_TASK") is None:
        sys.stdin.read()  # the test lets go by closing stdin
    else:
        deadline = task().get("deadline")
        end = time.time() + float(os.environ.get("RT10_HOLD_S", "2"))
        if isinstance(deadline, (int, float)):
            end = min(end, float(deadline) - 1.0)
        elif isinstance(deadline, str):
            from datetime import datetime
            end = min(end, datetime.fromisoformat(deadline.replace("Z", "+00:00")).timestamp() - 1.0)
        while time.time() < end:
            time.sleep(min(0.1, max(0.0, end - time.time())))
    os.close(hold_w)
    for pid in pids:
        os.waitpid(pid, 0)
    print(f"not done: held {held} connections to the vault ({refused} refused)")


def probe() -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.environ["VAULTSIM_SOCKET"])
        r = s.makefile("rb")
        msg = ask(s, r, 1, "session.open", agent=os.environ.get("RT10_AGENT", "careful"),
                  run_id=os.environ.get("VAULTSIM_RUN_ID"))
        if "error" in msg:
            print(json.dumps({"ok": False, "error": msg["error"].get("message"), "code": msg["error"].get("code")}))
            return
        sid = msg["result"]["session_id"]
        status = ask(s, r, 2, "vault.status")
        print(json.dumps({"ok": "result" in status, "session": sid}))
    except OSError as exc:
        print(json.dumps({"ok": False, "error": f"connect failed: {exc.strerror}"}))


if __name__ == "__main__":
    probe() if os.environ.get("RT10_MODE") == "probe" else flood()
