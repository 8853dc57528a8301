"""A fuzz run over both sockets: 10,000+ hostile frames, and the daemon stays whole.

Frames are generated from a fixed seed (so a failure reproduces): garbage
bytes, JSON that is not a request, and request-shaped objects whose every
string (id, method, each param, keys) is drawn from a pool that includes lone
UTF-16 surrogates, escapes, bidi overrides and NULs. They go to four agent
connections and three approver connections, one of which never says a valid
hello, the others before and after theirs. Afterwards: the daemon never
halted, every request with a valid id was answered (and nothing answered
-32603), a fresh agent's call succeeds and `vaultsim audit verify` says intact.
"""

from __future__ import annotations

import json
import random
import select
import socket
import time
from typing import Any

import pytest

from helpers import Sandbox, audit_verified_intact, wait_for
from hostile_fixtures import run_script, setup

SEED = 20
AGENT_FRAMES = 7000
APPROVER_FRAMES = 3500
BATCH = 25

TEXTS = ["", "ok", "ünïcode ✓", "\ud800", "\udfff", "a\ud83d", "\udc00z", "\ud83d\ude00", "x" * 300,
         "\x1b[2J", "rtl\u202eabc", "nul\x00", "ISS-1", "r-1", "staging", "rec-1", "1.2.3"]
CATALOG = {"read_issue": ["issue_id"], "create_issue": ["title", "body"], "delete_release": ["release_id"],
           "create_deployment": ["environment", "version"], "update_record": ["record_id", "value"],
           "attach_note": ["issue_id", "text"], "read_build": ["build_id"]}
ANSWER_CODES = {-32700, -32600, -32601, -32602, -32001, -32003, -32004}


class Fuzzer:
    def __init__(self, token: str) -> None:
        self.rng = random.Random(SEED)
        self.token = token
        self.n = 0
        self.sessions: list[str] = []
        self.requests: list[str] = []
        self.sent = 0
        self.surrogate_ids = 0

    def text(self) -> str:
        return self.rng.choice(TEXTS)

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p

    def ident(self) -> tuple[bool, Any]:
        """(valid, id) for the next frame; `...` means no id member (a notification)."""
        self.n += 1
        roll = self.rng.random()
        if roll < 0.80:
            return True, (self.n if self.maybe(0.5) else f"f{self.n}")
        if roll < 0.90:
            self.surrogate_ids += 1
            return False, f"id{self.n}\ud800"
        if roll < 0.95:
            return False, ...
        return False, self.rng.choice([True, 1.5, [1], {"a": 1}])

    def params_for(self, method: str, approver: bool, hello_ok: bool) -> Any:
        r = self.rng
        if method == "session.open":
            p: dict[str, Any] = {"agent": self.text()}
            if self.maybe(0.5):
                p["run_id"] = self.text()
        elif method == "call":
            op = r.choice(list(CATALOG)) if self.maybe(0.8) else self.text()
            p = {"session_id": r.choice(self.sessions) if self.sessions and self.maybe(0.7) else self.text(),
                 "operation": op, "params": {k: self.text() for k in CATALOG.get(op, ["x"])}, "wait_s": 0}
            if self.maybe(0.2):
                p["idempotency_key"] = self.text()
        elif method == "call.resume":
            p = {"session_id": self.text(), "resume_token": self.text(), "wait_s": 0}
        elif method == "lookup":
            p = {"session_id": r.choice(self.sessions) if self.sessions else self.text(),
                 "correlation_id": self.text(), "operation": r.choice(list(CATALOG))}
        elif method == "session.close":
            p = {"session_id": self.text()}
        elif method == "approver.hello":
            p = {"token": self.token if hello_ok and self.maybe(0.5) else self.text(), "name": self.text() or "n"}
        elif method == "decide":
            rid = r.choice(self.requests) if self.requests and self.maybe(0.6) else self.text()
            p = {"request_id": rid, "decision": r.choice(["allow_once", "allow_session", "deny", self.text()])}
        elif method in ("pending", "sessions"):
            p = {"after": r.choice(["", "0", "12", self.text()])}
        elif method == "stats":
            p = {"run_id": self.text()}
        elif method == "revoke":
            p = {r.choice(["grant_id", "session_id"]): self.text()}
        else:
            p = {}
        if self.maybe(0.05):
            p[self.text() or "k"] = self.text()  # an unexpected (maybe unencodable) key
        if self.maybe(0.02):
            return [1, 2]  # params that are not an object
        return p

    def frame(self, approver: bool, hello_ok: bool) -> tuple[bytes, Any]:
        """One frame and the id its answer must carry (None when no answer can be demanded)."""
        self.sent += 1
        roll = self.rng.random()
        if roll < 0.04:
            junk = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 60)))
            return junk.replace(b"\n", b" ") + b"\n", None
        if roll < 0.08:
            return json.dumps(self.rng.choice([[], [1, {"a": 2}], 3, "x\ud800", None])).encode() + b"\n", None
        methods = (["approver.hello", "subscribe", "pending", "decide", "lock", "unlock", "sessions", "revoke",
                    "stats", "status", "vault.status"] if approver else
                   ["session.open", "call", "call", "call.resume", "lookup", "session.close", "vault.status"])
        method = self.rng.choice(methods) if self.maybe(0.95) else self.text()
        valid, rid = self.ident()
        obj: dict[str, Any] = {"jsonrpc": "2.0" if self.maybe(0.97) else self.text(), "method": method,
                               "params": self.params_for(method, approver, hello_ok)}
        if rid is not ...:
            obj["id"] = rid
        return json.dumps(obj).encode() + b"\n", rid if valid else None


class Conn:
    def __init__(self, path: str, approver: bool, hello_ok: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.approver = approver
        self.hello_ok = hello_ok
        self.buf = b""


def exchange(fz: Fuzzer, conn: Conn, stats: dict[str, int]) -> None:
    """Send one batch, then read until every valid id in it is answered."""
    frames = [fz.frame(conn.approver, conn.hello_ok) for _ in range(BATCH)]
    waiting = {rid for _, rid in frames if rid is not None}
    conn.sock.sendall(b"".join(f for f, _ in frames))
    deadline = time.monotonic() + 60
    while waiting:
        left = deadline - time.monotonic()
        assert left > 0, f"unanswered ids {sorted(map(str, waiting))[:5]}"
        ready, _, _ = select.select([conn.sock], [], [], left)
        if not ready:
            continue
        chunk = conn.sock.recv(1 << 20)
        assert chunk, "the daemon closed a fuzz connection"
        conn.buf += chunk
        *lines, conn.buf = conn.buf.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            assert msg.get("jsonrpc") == "2.0"
            if "method" in msg:  # a notification to a subscribed approver
                if msg["method"] == "approval.requested":
                    fz.requests.append(msg["params"]["request_id"])
                continue
            if "error" in msg:
                assert msg["error"]["code"] in ANSWER_CODES, msg
                stats["errors"] += 1
                if msg["id"] is None and "the id holds a lone UTF-16 surrogate" in msg["error"]["message"]:
                    stats["surrogate_id"] += 1
            else:
                stats["results"] += 1
                result = msg["result"]
                if isinstance(result, dict) and str(result.get("session_id", "")).startswith("s-"):
                    fz.sessions.append(result["session_id"])
            waiting.discard(msg["id"])


class TestWireFuzz:
    @pytest.mark.timeout(400)  # 10,000 frames and their calls: slow on a loaded machine
    def test_ten_thousand_hostile_frames_leave_the_daemon_whole(self, sandbox: Sandbox) -> None:
        """Agent and approver sockets, before and after hello, lone surrogates everywhere."""
        policy = sandbox.write("short.yaml", {"default": {"mode": "session", "deadline_s": 2},
                                              "risks": {"read": {"mode": "auto"}}})
        setup(sandbox, "--policy", str(policy))
        token = (sandbox.home / "approver.token").read_text().strip()
        fz = Fuzzer(token)
        agents = [Conn(str(sandbox.agent_sock), False, False) for _ in range(4)]
        approvers = [Conn(str(sandbox.home / "approver.sock"), True, ok) for ok in (False, True, True)]
        stats = {"errors": 0, "results": 0, "surrogate_id": 0}
        rounds = max(AGENT_FRAMES // (BATCH * len(agents)), APPROVER_FRAMES // (BATCH * len(approvers)))
        for _ in range(rounds):
            for conn in agents + approvers:
                exchange(fz, conn, stats)
        assert fz.sent >= 10_000
        # each request whose id holds a surrogate is answered, -32600 with a null id (it is no id)
        assert fz.surrogate_ids == stats["surrogate_id"] > 100
        assert stats["results"] > 500 and len(fz.sessions) > 10  # real requests were served too
        for conn in agents + approvers:
            conn.sock.close()
        # the fuzz's sessions end as their connections close (each close recorded); until then this
        # process holds agent sessions and its child may not act as an approver
        status = wait_for(lambda: (s := sandbox.status()) is not None and s.get("sessions") == 0 and s,
                          timeout=60, what="the fuzz's sessions closed")
        assert status["halted"] is None
        assert sandbox.vaultsim("unlock").returncode == 0  # the fuzz may have locked it
        results = run_script(sandbox, "client.open_session('normal', 'after-fuzz')\n"
                                      "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n")
        assert "success" == results[0]["category"]
        audit_verified_intact(sandbox)
