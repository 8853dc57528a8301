#!/usr/bin/env python3
"""Red team 27: a hostile client of the vault daemon, written from the docs alone.

It speaks raw JSON lines on the sockets (DESIGN.md, docs/agent-contract.md
section 3) and does what a broken or malicious program would. It imports
nothing of the project. One mode per run:

    rt27d_x.py MODE [ARGS...]

The agent socket is $VAULTSIM_SOCKET; the approver socket is beside it. Each
mode prints one JSON line saying what it saw (error codes, counts), and the
modes that hold something (connections, a backlog) print a first line once
they hold it, then wait for a line on stdin before letting go.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time

SOCK = os.environ.get("VAULTSIM_SOCKET", "")
RUN_ID = os.environ.get("VAULTSIM_RUN_ID", "rt27d")


def out(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def connect(path: str = "") -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path or SOCK)
    return s


def req(rid: object, method: str, params: object = None) -> bytes:
    obj: dict[str, object] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        obj["params"] = params
    return json.dumps(obj).encode() + b"\n"


class Lines:
    """Answers read off a socket, skipping notifications, with a deadline per answer."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.buf = b""

    def next(self, timeout: float = 30.0) -> dict | None:
        end = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                msg = json.loads(line)
                if "method" not in msg:
                    return msg
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.s], [], [], left)[0]:
                return None
            try:
                data = self.s.recv(65536)
            except OSError:
                return None
            if not data:
                if self.buf:  # a last line without its newline
                    self.buf += b"\n"
                    continue
                return None
            self.buf += data

    def ask(self, frame: bytes, timeout: float = 30.0) -> dict | None:
        try:
            self.s.sendall(frame)
        except OSError:
            pass  # a refusal may already be waiting to be read
        return self.next(timeout)


def code_of(answer: dict | None) -> object:
    if answer is None:
        return "closed"
    if "error" in answer:
        return answer["error"]["code"]
    return "ok"


def wait_stdin() -> None:
    sys.stdin.readline()


# ---- frames at the 1 MiB bound ----------------------------------------------------

MiB = 1 << 20


def sized_status(total: int) -> bytes:
    """A vault.status request exactly `total` bytes long (without any newline)."""
    head = b'{"jsonrpc":"2.0","id":7,"method":"vault.status","params":{},"pad":"'
    tail = b'"}'
    return head + b"x" * (total - len(head) - len(tail)) + tail


def sized_lookup(total: int) -> bytes:
    """A lookup whose correlation id pads the line to `total` bytes: a frame the parser takes whole."""
    head = b'{"jsonrpc":"2.0","id":7,"method":"lookup","params":{"session_id":"s-none","correlation_id":"'
    tail = b'"}}'
    return head + b"c" * (total - len(head) - len(tail)) + tail


def mode_frames() -> None:
    """1 MiB and 1 MiB + 1, with and without the newline: each on its own connection."""
    seen = {}
    for name, size in (("1MiB", MiB), ("1MiB+1", MiB + 1)):
        for nl in (True, False):
            s = connect()
            lines = Lines(s)
            data = sized_lookup(size)
            try:
                s.sendall(data + (b"\n" if nl else b""))
                if not nl:
                    s.shutdown(socket.SHUT_WR)  # the last line needs no newline
            except OSError:
                pass
            a = lines.next(30)
            seen[f"{name}{'' if nl else '-no-newline'}"] = [code_of(a), (a or {}).get("error", {}).get("message", "")[:120]]
            s.close()
    out({"frames": seen})


# ---- hostile values --------------------------------------------------------------

JUNK = [
    ("nan-id", b'{"jsonrpc":"2.0","id":NaN,"method":"vault.status"}\n'),
    ("inf-param", b'{"jsonrpc":"2.0","id":1,"method":"call","params":{"session_id":"S","operation":"read_issue","params":{"issue_id":"ISS-1"},"wait_s":Infinity}}\n'),
    ("nan-wait", b'{"jsonrpc":"2.0","id":2,"method":"call","params":{"session_id":"S","operation":"read_issue","params":{"issue_id":"ISS-1"},"wait_s":NaN}}\n'),
    ("nan-in-op-params", b'{"jsonrpc":"2.0","id":3,"method":"call","params":{"session_id":"S","operation":"read_issue","params":{"issue_id":NaN}}}\n'),
    ("huge-float", b'{"jsonrpc":"2.0","id":4,"method":"call","params":{"session_id":"S","operation":"read_issue","params":{"issue_id":1e999}}}\n'),
    ("huge-int", b'{"jsonrpc":"2.0","id":5,"method":"vault.status","params":{"x":' + b"9" * 5000 + b'}}\n'),
    ("huge-int-id", b'{"jsonrpc":"2.0","id":' + b"9" * 400 + b',"method":"vault.status"}\n'),
    ("dup-method", b'{"jsonrpc":"2.0","id":6,"method":"shutdown","method":"vault.status"}\n'),
    ("dup-session", b'{"jsonrpc":"2.0","id":7,"method":"call","params":{"session_id":"forged","session_id":"S","operation":"read_issue","params":{"issue_id":"ISS-1"}}}\n'),
    ("invalid-utf8-method", b'{"jsonrpc":"2.0","id":8,"method":"vault.\xff\xfestatus"}\n'),
    ("invalid-utf8-param", b'{"jsonrpc":"2.0","id":9,"method":"call","params":{"session_id":"S","operation":"read_issue","params":{"issue_id":"\xc0\xaf"}}}\n'),
    ("surrogate-method", b'{"jsonrpc":"2.0","id":10,"method":"vault.status\\udc00"}\n'),
    ("surrogate-op", b'{"jsonrpc":"2.0","id":11,"method":"call","params":{"session_id":"S","operation":"read_\\ud800issue","params":{}}}\n'),
    ("deep-100k", b'[' * 100_000 + b']' * 100_000 + b'\n'),
    ("deep-params", b'{"jsonrpc":"2.0","id":12,"method":"vault.status","params":{"a":' + b'[' * 50_000 + b']' * 50_000 + b'}}\n'),
    ("nul-bytes", b'{"jsonrpc":"2.0","id":13,"method":"vault.status\x00"}\n'),
]

NAMES = [
    ("surrogate", b'"rt27d-\\ud83d"'),
    ("invalid-utf8", b'"rt27d-\xed\xa0\x80"'),
    ("nan", b'NaN'),
    ("huge", b'1e999'),
    ("escape", b'"rt27d-\\u001b[2J\\u001b]0;pwned\\u0007"'),
    ("bidi", b'"rt27d-\\u202eevil"'),
    ("long", b'"' + b"a" * 200_000 + b'"'),
    ("dup", None),
]


def mode_junk() -> None:
    """Every line of JUNK on one connection (the session id S is a real one), then session.open
    with hostile agent names; every answer's code, and whether the connection still serves."""
    s = connect()
    lines = Lines(s)
    opened = lines.ask(req(0, "session.open", {"agent": "rt27d-junk", "run_id": RUN_ID}))
    sid = (opened or {}).get("result", {}).get("session_id", "none")
    codes: dict[str, object] = {}
    for name, frame in JUNK:
        a = lines.ask(frame.replace(b'"S"', json.dumps(sid).encode()))
        codes[name] = code_of(a) if a is None or "error" in a else (a["result"].get("category") or "ok")
        if a is None:  # closed on us: go on with a new connection
            s.close()
            s = connect()
            lines = Lines(s)
    names: dict[str, object] = {}
    for name, value in NAMES:
        c = connect()
        ln = Lines(c)
        if value is None:
            frame = b'{"jsonrpc":"2.0","id":1,"method":"session.open","params":{"agent":"rt27d-a","agent":"rt27d-b"}}\n'
        else:
            frame = b'{"jsonrpc":"2.0","id":1,"method":"session.open","params":{"agent":' + value + b'}}\n'
        a = ln.ask(frame)
        names[name] = code_of(a)
        c.close()
    alive = code_of(lines.ask(req(99, "vault.status")))
    out({"codes": codes, "names": names, "still_serves": alive})


# ---- backed-up writes ------------------------------------------------------------

def mode_pipeline(n: str = "10000", method: str = "catalog") -> None:
    """Write n requests without reading a byte of the answers, for as long as the daemon takes
    them (at most 20 s of it not taking any); say how far it got; then, told to, read."""
    s = connect()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    data = b"".join(req(i, method, {}) for i in range(int(n)))
    sent = 0
    stuck_since = time.monotonic()
    while sent < len(data) and time.monotonic() - stuck_since < 3:
        if not select.select([], [s], [], 0.5)[1]:
            continue
        try:
            k = s.send(data[sent:sent + 65536])
        except BlockingIOError:
            continue
        except OSError as exc:
            out({"written": sent, "error": type(exc).__name__})
            break
        sent += k
        stuck_since = time.monotonic()
    out({"written": sent, "of": len(data), "held": True})
    wait_stdin()
    s.setblocking(True)
    s.settimeout(30)
    got, codes, closed = 0, {}, False
    buf = b""
    while True:
        try:
            chunk = s.recv(1 << 20)
        except (OSError, socket.timeout):
            break
        if not chunk:
            closed = True
            break
        buf += chunk
        *whole, buf = buf.split(b"\n")
        for line in whole:
            msg = json.loads(line)
            c = str(code_of(msg))
            codes[c] = codes.get(c, 0) + 1
            got += 1
        if got >= int(n):
            break
    out({"answers": got, "codes": codes, "closed_by_daemon": closed})


def mode_trickle(n: str = "200") -> None:
    """Ask for n catalogs at once, then read the answers one byte a second until told to stop."""
    s = connect()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"".join(req(i, "catalog", {}) for i in range(int(n))))
    out({"held": True})
    read, closed = 0, False
    while not select.select([sys.stdin], [], [], 1.0)[0]:
        try:
            b = s.recv(1)
        except OSError:
            closed = True
            break
        if not b:
            closed = True
            break
        read += 1
    out({"read": read, "closed_by_daemon": closed})


# ---- slow and many connections ----------------------------------------------------

def mode_slowloris(conns: str = "200") -> None:
    """Many connections, each writing a request one byte per round, round after round, until
    told to stop; then say how many were answered and how many the daemon closed."""
    socks = []
    for _ in range(int(conns)):
        try:
            socks.append(connect())
        except OSError:
            break
    frame = req(1, "vault.status")
    pos = 0
    out({"held": len(socks)})
    while not select.select([sys.stdin], [], [], 0.2)[0]:
        if pos < len(frame) - 1:  # never the newline: the line stays unfinished
            for s in socks:
                try:
                    s.send(frame[pos:pos + 1])
                except OSError:
                    pass
            pos += 1
    for s in socks:
        try:
            s.sendall(frame[pos:])  # the rest of the request, at last
        except OSError:
            continue
    codes: dict[str, int] = {}
    for s in socks:
        k = str(code_of(Lines(s).next(10)))
        codes[k] = codes.get(k, 0) + 1
    out({"conns": len(socks), "codes": codes, "bytes_apart": pos})


def mode_storm(n: str = "3000", which: str = "agent") -> None:
    """Connect and close at once, n times, half of them after half a request, on the agent (or
    the approver) socket; then one whole request on a fresh connection."""
    path = SOCK if which == "agent" else os.path.join(os.path.dirname(SOCK), "approver.sock")
    refused = 0
    out({"storming": which})
    for i in range(int(n)):
        try:
            s = connect(path)
            if i % 2:
                s.send(b'{"jsonrpc":"2.0","id":1,"meth')
            s.close()
        except OSError:
            refused += 1
    s = connect(path)
    out({"storm": int(n), "refused": refused, "after": code_of(Lines(s).ask(req(1, "vault.status")))})


def mode_sessions(n: str = "5000") -> None:
    """Open sessions until refused, over as many connections as it takes; hold them until told."""
    conns, opened, refusal = [], 0, None
    while opened < int(n) and refusal is None:
        try:
            c = connect()
        except OSError as exc:
            refusal = ["connect", str(exc)]
            break
        ln = Lines(c)
        conns.append(ln)
        for _ in range(300):
            a = ln.ask(req(opened, "session.open", {"agent": f"rt27d-s{opened}", "run_id": RUN_ID}))
            if a is None or "error" in a:
                why = (a or {}).get("error", {}).get("message", "")
                if "this connection" not in why:  # past the connection's share: another connection
                    refusal = [code_of(a), why]
                break
            opened += 1
    out({"opened": opened, "refusal": refusal, "conns": len(conns)})
    wait_stdin()
    out({"released": len(conns)})


def mode_hello(n: str = "2000") -> None:
    """The approver socket: hello with no token, an empty one and a wrong one, n times on one
    connection and on fresh ones; then a decide and a lock with no hello."""
    path = os.path.join(os.path.dirname(SOCK), "approver.sock")
    codes: dict[str, int] = {}
    c = connect(path)
    ln = Lines(c)
    for i in range(int(n)):
        params = [{}, {"token": "", "name": "x"}, {"token": "f" * 64, "name": "rt27d"}][i % 3]
        a = ln.ask(req(i, "approver.hello", params))
        k = str(code_of(a))
        codes[k] = codes.get(k, 0) + 1
        if a is None:
            c = connect(path)
            ln = Lines(c)
    fresh: dict[str, int] = {}
    for i in range(200):
        try:
            c2 = connect(path)
        except OSError:
            fresh["refused"] = fresh.get("refused", 0) + 1
            continue
        k = str(code_of(Lines(c2).ask(req(i, "approver.hello", {"token": "wrong", "name": "w"}))))
        fresh[k] = fresh.get(k, 0) + 1
        c2.close()
    after = {m: code_of(ln.ask(req(1, m, p))) for m, p in
             (("decide", {"request_id": "r-x", "decision": "allow_once"}), ("lock", {}), ("unlock", {}))}
    out({"codes": codes, "fresh": fresh, "unhelloed": after})


def mode_forge(tokens_json: str = "[]") -> None:
    """call.resume and lookup with forged ids and with another session's tokens (given as a JSON
    list of [resume_token, correlation_id]); every answer's code or category."""
    c = connect()
    ln = Lines(c)
    a = ln.ask(req(0, "session.open", {"agent": "rt27d-forger", "run_id": RUN_ID}))
    sid = (a or {}).get("result", {}).get("session_id", "none")
    seen: list[object] = []
    forged = ["", "rt-" + "0" * 40, "x" * 5000, "../../etc/passwd", "\u202e" + "rt-1"]
    for t in forged + [t for t, _ in json.loads(tokens_json)]:
        a = ln.ask(req(1, "call.resume", {"session_id": sid, "resume_token": t, "wait_s": 0}))
        seen.append(["resume", code_of(a) if a is None or "error" in a else a["result"]["category"]])
    for _, cid in json.loads(tokens_json):
        for op in (None, "create_issue"):  # naming the operation sends the lookup to the remote
            params = {"session_id": sid, "correlation_id": cid, **({"operation": op} if op else {})}
            a = ln.ask(req(2, "lookup", params))
            seen.append(["lookup", code_of(a) if a is None or "error" in a else
                         [a["result"]["category"], a["result"].get("reconciled"), a["result"].get("data")]])
        a = ln.ask(req(3, "call.cancel", {"session_id": sid, "resume_token": cid}))
        seen.append(["cancel", code_of(a)])
    out({"seen": seen, "text": json.dumps(seen)})


def mode_lookups(n: str = "3000") -> None:
    """n lookups of made-up correlation ids, as fast as answers come; codes and time taken."""
    c = connect()
    ln = Lines(c)
    a = ln.ask(req(0, "session.open", {"agent": "rt27d-lookups", "run_id": RUN_ID}))
    sid = (a or {}).get("result", {}).get("session_id", "none")
    codes: dict[str, int] = {}
    t0 = time.monotonic()
    for i in range(int(n)):
        a = ln.ask(req(i, "lookup", {"session_id": sid, "correlation_id": f"c-{i:026d}", "operation": "read_issue"}))
        k = str(code_of(a) if a is None or "error" in a else a["result"]["category"])
        codes[k] = codes.get(k, 0) + 1
    out({"codes": codes, "seconds": round(time.monotonic() - t0, 2)})


def mode_pending(op: str = "create_issue", n: str = "80", sessions: str = "3") -> None:
    """Gated calls with wait_s 0, spread over a few sessions (each on its own connection); say
    what they were answered, then wait (to be SIGSTOPped)."""
    held = []
    for k in range(int(sessions)):
        ln = Lines(connect())
        a = ln.ask(req(0, "session.open", {"agent": f"rt27d-pending{k}", "run_id": RUN_ID}))
        held.append((ln, (a or {}).get("result", {}).get("session_id", "none")))
    cats: dict[str, int] = {}
    tokens = []
    for i in range(int(n)):
        ln, sid = held[i % len(held)]
        a = ln.ask(req(i + 1, "call", {"session_id": sid, "operation": op, "params": {"title": f"t{i}"},
                                       "idempotency_key": f"k-{i}", "wait_s": 0}))
        r = (a or {}).get("result") or {}
        k = str(r.get("category") or code_of(a))
        cats[k] = cats.get(k, 0) + 1
        if r.get("resume_token"):
            tokens.append([r["resume_token"], r["correlation_id"]])
    out({"categories": cats, "tokens": tokens})
    wait_stdin()


def mode_reads(op: str = "read_issue") -> None:
    """Calls as fast as answers come until told to stop; each answer's category and id."""
    c = connect()
    ln = Lines(c)
    a = ln.ask(req(0, "session.open", {"agent": "rt27d-reads", "run_id": RUN_ID}))
    sid = (a or {}).get("result", {}).get("session_id", "none")
    out({"held": True})
    answered: list[list[object]] = []
    i = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        i += 1
        a = ln.ask(req(i, "call", {"session_id": sid, "operation": op, "params": {"issue_id": "ISS-1"}}))
        r = (a or {}).get("result") or {}
        answered.append([r.get("category") or code_of(a), r.get("correlation_id"), r.get("message", "")[:300]])
    cats: dict[str, int] = {}
    for cat, _, _ in answered:
        cats[str(cat)] = cats.get(str(cat), 0) + 1
    out({"categories": cats, "answered": answered})


def _fill(value: object, done: dict[str, dict]) -> object:
    """A step's parameter with each ${ID.FIELD} replaced by that earlier step's result data."""
    if isinstance(value, str):
        import re
        return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", lambda m: str(done[m.group(1)][m.group(2)]), value)
    return value


def mode_agent() -> None:
    """Under `vaultsim run`: the task's steps done as the contract says (one session, gated
    calls collected with call.resume before the deadline). With RT27D_FLOOD naming this task's
    agent, it first floods the vault on other connections: 10,000 requests written and never
    read, and 2,000 lookups of made-up correlation ids. With RT27D_FLOOD_KIND=waits it instead
    piles 100 `call.resume`s of its first (pending) step's token on one more connection, each
    waiting up to 20 s, and reads them all: 64 are held, the rest refused -32004; with `conns`
    it first opens 300 connections and holds them (256 is one process's most), with `sessions`
    it first opens 300 sessions on one connection (256 is one connection's most)."""
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    flooding = os.environ.get("RT27D_FLOOD") == task["agent"]
    kind = os.environ.get("RT27D_FLOOD_KIND", "") if flooding else ""
    pile = kind == "waits"
    held: list[socket.socket] = []
    if kind == "conns":  # 300 connections from this one process, held to the end
        for _ in range(300):
            held.append(connect())
    elif kind == "sessions":  # 300 sessions opened on one connection, then let go
        many = Lines(connect())
        for i in range(300):
            many.ask(req(i, "session.open", {"agent": task["agent"], "run_id": task["run_id"]}))
        many.s.close()
    elif flooding and not pile:
        s = connect()
        s.setblocking(False)
        data = b"".join(req(i, "catalog", {}) for i in range(10_000))
        sent, end = 0, time.monotonic() + 2
        while sent < len(data) and time.monotonic() < end:
            if select.select([], [s], [], 0.2)[1]:
                try:
                    sent += s.send(data[sent:sent + 65536])
                except BlockingIOError:
                    pass
        flood_ln = Lines(connect())
        a = flood_ln.ask(req(0, "session.open", {"agent": task["agent"], "run_id": task["run_id"]}))
        fsid = (a or {}).get("result", {}).get("session_id", "none")
        for i in range(2000):
            flood_ln.ask(req(i + 1, "lookup", {"session_id": fsid, "correlation_id": f"c-{i:026d}",
                                               "operation": "read_issue"}))
        flood_ln.s.close()
        s.close()
    ln = Lines(connect())
    a = ln.ask(req(0, "session.open", {"agent": task["agent"], "run_id": task["run_id"]}))
    sid = a["result"]["session_id"]  # type: ignore[index]
    done: dict[str, dict] = {}
    rid = 1
    for step in task["steps"]:
        params = {k: _fill(v, done) for k, v in step["params"].items()}
        left = task["deadline"] - time.time() - 1.5
        rid += 1
        a = ln.ask(req(rid, "call", {"session_id": sid, "operation": step["call"], "params": params,
                                     "idempotency_key": f"{task['run_id']}-{step['id']}",
                                     "wait_s": 0.0 if pile else max(0.0, left)}), timeout=max(1.0, left + 1))
        r = (a or {}).get("result") or {}
        if pile and r.get("category") == "approval_pending":
            pile = False
            r = _pile_resumes(sid, r["resume_token"]) or r
        while r.get("category") == "approval_pending" and task["deadline"] - time.time() > 2:
            rid += 1
            a = ln.ask(req(rid, "call.resume", {"session_id": sid, "resume_token": r["resume_token"],
                                                "wait_s": max(0.0, task["deadline"] - time.time() - 1.5)}))
            r = (a or {}).get("result") or {}
        if r.get("category") != "success":
            print(f"not done: {step['call']} was {r.get('category') or code_of(a)}", flush=True)
            return
        done[step["id"]] = r.get("data") or {}
    print(f"done: {len(task['steps'])} steps", flush=True)


def _pile_resumes(sid: str, token: str, n: int = 100) -> dict:
    """`n` resumes of one pending call written at once on a connection of their own; every
    answer read. The last settled Result, if any (refusals are -32004, nothing done)."""
    flood = Lines(connect())
    flood.s.sendall(b"".join(req(1000 + i, "call.resume", {"session_id": sid, "resume_token": token,
                                                           "wait_s": 20}) for i in range(n)))
    settled: dict = {}
    for _ in range(n):
        a = flood.next(timeout=30)
        if a is None:
            break
        if (a.get("result") or {}).get("category") not in (None, "approval_pending"):
            settled = a["result"]
    flood.s.close()
    return settled


def mode_heavy(n: str = "100", kind: str = "keys") -> None:
    """n frames near 1 MiB that are costly to look at: operation params of ~80,000 keys, or a
    string of ~1M escapes; each answer's code and the time the whole took."""
    c = connect()
    ln = Lines(c)
    a = ln.ask(req(0, "session.open", {"agent": "rt27d-heavy", "run_id": RUN_ID}))
    sid = (a or {}).get("result", {}).get("session_id", "none")
    if kind == "keys":
        params: object = {f"k{i}": 0 for i in range(80_000)}
    else:
        params = {"issue_id": "\u00e9" * 170_000}
    frame = req(1, "call", {"session_id": sid, "operation": "read_issue", "params": params})
    codes: dict[str, int] = {}
    t0 = time.monotonic()
    out({"held": True, "frame": len(frame)})
    for _ in range(int(n)):
        k = str(code_of(ln.ask(frame, timeout=60)))
        codes[k] = codes.get(k, 0) + 1
    out({"codes": codes, "seconds": round(time.monotonic() - t0, 2), "frame": len(frame)})


def mode_waiters(conns: str = "200", per: str = "64") -> None:
    """One pending gated call, then `per` call.resume requests of its token with a day's wait_s
    on each of `conns` connections (each with a session of its own): the daemon holds a waiter
    for each. Say how many it took and what the rest were answered; hold until told."""
    first = Lines(connect())
    a = first.ask(req(0, "session.open", {"agent": "rt27d-waiters", "run_id": RUN_ID}))
    sid = (a or {}).get("result", {}).get("session_id", "none")
    a = first.ask(req(1, "call", {"session_id": sid, "operation": "create_issue", "params": {"title": "w"},
                                  "idempotency_key": "w-1", "wait_s": 0}))
    token = ((a or {}).get("result") or {}).get("resume_token", "none")
    socks = [first.s]
    for _ in range(int(conns) - 1):
        try:
            socks.append(connect())
        except OSError:
            break
    for s in socks:
        s.sendall(b"".join(req(100 + i, "call.resume", {"session_id": sid, "resume_token": token,
                                                        "wait_s": 86400}) for i in range(int(per))))
    codes: dict[str, int] = {}
    why = ""
    bufs = {s: b"" for s in socks}
    # what comes back at once (refusals): read until a second passes with nothing more; the held
    # waits never answer
    while True:
        ready = select.select(socks, [], [], 1.0)[0]
        if not ready:
            break
        for s in ready:
            try:
                data = s.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                socks.remove(s)
                continue
            *lines, bufs[s] = (bufs[s] + data).split(b"\n")
            for line in lines:
                msg = json.loads(line)
                k = str(code_of(msg))
                codes[k] = codes.get(k, 0) + 1
                why = msg.get("error", {}).get("message", "") or why
    out({"conns": len(socks), "immediate": codes, "why": why})
    wait_stdin()


MODES = {name[5:]: fn for name, fn in globals().items() if name.startswith("mode_")}

if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
