"""One client never affects another (issue #20): hostile input, stopped readers, floods.

Each test puts a real attacker process beside a normal one and asserts what
the normal one (or the person) sees: answers, latency, memory, prompts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import PY, Sandbox, audit_verified_intact, wait_for
from hostile_fixtures import (SURROGATE, RawClient, agent_env, frame, hello, p99, run_script, served,  # noqa: F401
                              setup, spawn_script)
from vault.client import ApproverClient
from vault.home import VaultHome
from vault.daemon.limits import MAX_PARTIAL_BYTES, MAX_PENDING_PER_PROCESS, MAX_SESSIONS_PER_PROCESS

NOT_UNICODE = "lone UTF-16 surrogate"


def audit_intact(sandbox: Sandbox) -> dict[str, Any]:
    return audit_verified_intact(sandbox)


class TestLoneSurrogates:
    """A lone surrogate in any text an agent or approver sends: a clear error, nothing else."""

    AGENT = [
        ("agent name", frame("session.open", {"agent": SURROGATE}), -32602, "agent"),
        ("run id", frame("session.open", {"agent": "a", "run_id": "run" + SURROGATE}), -32602, "run_id"),
        ("release_id", frame("call", {"session_id": "s-x", "operation": "delete_release",
                                      "params": {"release_id": SURROGATE}}), -32602, "params.release_id"),
        ("environment", frame("call", {"session_id": "s-x", "operation": "create_deployment",
                                       "params": {"environment": "\udfff", "version": "1"}}),
         -32602, "params.environment"),
        ("record_id", frame("call", {"session_id": "s-x", "operation": "update_record",
                                     "params": {"record_id": "r" + SURROGATE, "value": "v"}}),
         -32602, "params.record_id"),
        ("operation", frame("call", {"session_id": "s-x", "operation": SURROGATE}), -32602, "operation"),
        ("session id", frame("call", {"session_id": SURROGATE, "operation": "read_issue"}), -32602, "session_id"),
        ("idempotency key", frame("call", {"session_id": "s", "operation": "create_issue", "params": {"title": "t"},
                                           "idempotency_key": SURROGATE}), -32602, "idempotency_key"),
        ("resume token", frame("call.resume", {"session_id": "s", "resume_token": SURROGATE}), -32602,
         "resume_token"),
        ("lookup key", frame("lookup", {"session_id": "s", "idempotency_key": SURROGATE}), -32602,
         "idempotency_key"),
        ("a key", frame("call", {"session_id": "s", "operation": "read_issue", "params": {SURROGATE: "1"}}),
         -32602, "params."),
        ("method", frame("vault.status" + SURROGATE), -32600, "method"),
    ]

    @pytest.mark.parametrize("payload, code, where", [c[1:] for c in AGENT], ids=[c[0] for c in AGENT])
    def test_agent_socket_refuses_it_with_the_field_named(self, served: Sandbox, payload: bytes, code: int,
                                                         where: str) -> None:
        """Answered with its id and the path of the bad string; the daemon serves on, unhalted."""
        with RawClient(served.agent_sock) as raw:
            answer = raw.ask(payload)
            assert (1, code) == (answer["id"], answer["error"]["code"])
            assert NOT_UNICODE in answer["error"]["message"] and where in answer["error"]["message"]
            assert raw.ask(frame("vault.status"))["result"]["halted"] is None

    def test_a_request_id_holding_one_is_answered_with_a_null_id(self, served: Sandbox) -> None:
        """The id is not a valid id, so the answer's id is null (JSON-RPC), and it is answered."""
        with RawClient(served.agent_sock) as raw:
            answer = raw.ask(frame("vault.status", rid="req" + SURROGATE))
            assert (None, -32600) == (answer["id"], answer["error"]["code"])
            assert "the id" in answer["error"]["message"]

    APPROVER = [
        ("hello name", "approver.hello", {"token": "t", "name": SURROGATE}, False, "name"),
        ("hello token", "approver.hello", {"token": SURROGATE}, False, "token"),
        ("decide request id", "decide", {"request_id": SURROGATE, "decision": "deny"}, True, "request_id"),
        ("stats run id", "stats", {"run_id": SURROGATE}, True, "run_id"),
        ("revoke grant", "revoke", {"grant_id": SURROGATE}, True, "grant_id"),
        ("revoke session", "revoke", {"session_id": SURROGATE}, True, "session_id"),
        ("decision", "decide", {"request_id": "r-1", "decision": "allow" + SURROGATE}, True, "decision"),
    ]

    @pytest.mark.parametrize("method, params, after_hello, where", [c[1:] for c in APPROVER],
                             ids=[c[0] for c in APPROVER])
    def test_approver_socket_refuses_it_with_the_field_named(self, served: Sandbox, method: str,
                                                            params: dict[str, Any], after_hello: bool,
                                                            where: str) -> None:
        """The same rule on the approver socket, before and after hello."""
        with RawClient(served.home / "approver.sock") as raw:
            if after_hello:
                hello(served, raw)
            answer = raw.ask(frame(method, params))
            assert (1, -32602) == (answer["id"], answer["error"]["code"])
            assert NOT_UNICODE in answer["error"]["message"] and where in answer["error"]["message"]

    def test_nothing_reaches_the_approvers_or_the_audit_log_and_agents_go_on(self, served: Sandbox) -> None:
        """After every position was tried, a subscribed approver still gets notifications, a normal
        agent's call succeeds, and the audit log verifies."""
        with RawClient(served.home / "approver.sock") as watcher, RawClient(served.agent_sock) as raw:
            hello(served, watcher, "watcher")
            assert "result" in watcher.ask(frame("subscribe", {}))
            for _, payload, _, _ in self.AGENT:
                raw.ask(payload)
            results = run_script(served, "client.open_session('normal', 'run-1')\n"
                                         "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n")
            assert "success" == results[0]["category"]
            while True:  # the normal call's activity reached the subscribed approver
                note = json.loads(watcher.file.readline())
                if note.get("method") == "activity" and note["params"]["agent"] == "normal":
                    break
        assert served.status()["halted"] is None
        audit_intact(served)


class TestStoppedApprover:
    """An approver that stops reading never freezes agents or the other approvers."""

    LOAD = (
        "client.open_session('steady', 'run-1')\n"
        "import select\n"
        "lat = []\n"
        "while not select.select([sys.stdin], [], [], 0)[0]:\n"
        "    t0 = time.perf_counter()\n"
        "    r = client.call('read_issue', {'issue_id': 'ISS-1'})\n"
        "    lat.append(time.perf_counter() - t0)\n"
        "    assert r.category in ('success', 'vault_locked'), r\n"
        "    if len(lat) % 50 == 0:\n"
        "        print(json.dumps({'calls': len(lat)}), flush=True)\n"
        "print(json.dumps({'latencies': lat}), flush=True)\n"
    )

    @pytest.mark.timeout(400)  # many real processes: slow on a loaded machine
    def test_agents_and_other_approvers_go_on_and_the_stopped_one_is_dropped(self, sandbox: Sandbox) -> None:
        """SIGSTOP one approver: a steady agent's call p99 stays under 50 ms throughout, another
        approver's lock and unlock answer at once, and the stopped one is disconnected and logged.

        (Under 50 ms on a machine where the same agent's p99 with every approver reading is a few
        ms; on a machine so loaded that this baseline is itself over a third of that, the bound is
        three times the baseline, measured in the same run: a stall is seconds either way.)"""
        setup(sandbox)
        stopped = sandbox.start_approver([{"match": {}, "decide": "allow_session"}], name="sleepy")
        sandbox.start_approver([{"match": {}, "decide": "allow_once"}], name="awake")
        agent = spawn_script(sandbox, self.LOAD)
        progress = Progress(agent)
        try:
            wait_for(lambda: progress.calls >= 300, timeout=120, what="300 calls before the stop")
            os.killpg(stopped.pid, signal.SIGSTOP)
            at_stop = progress.calls
            # the kernel's buffer for the stopped approver is long full after ~600 calls
            wait_for(lambda: progress.calls >= at_stop + 800, timeout=120, what="800 calls")
            timings = []
            with ApproverClient.for_home(VaultHome(sandbox.home), "brake", timeout=30) as other:
                for method in ("lock", "unlock"):
                    t0 = time.perf_counter()
                    other.request(method)
                    timings.append(time.perf_counter() - t0)
            assert max(timings) < 1.0, timings
            wait_for(lambda: sandbox.status()["approvers_dropped"] == 1, timeout=120,
                     what="the stopped approver to be disconnected")
            at_drop = progress.calls
            wait_for(lambda: progress.calls >= at_drop + 300, timeout=60, what="more calls after the drop")
        finally:
            agent.stdin.write("stop\n")  # type: ignore[union-attr]
            agent.stdin.flush()  # type: ignore[union-attr]
            progress.thread.join(timeout=120)
        latencies = progress.final["latencies"]
        before, during = latencies[50:at_stop], latencies[at_stop:]
        assert len(during) >= 1000
        bound = max(0.050, 3 * p99(before))
        assert p99(during) < bound, (f"p99 {p99(during) * 1000:.1f} ms over {len(during)} calls with an approver "
                                     f"stopped (before: {p99(before) * 1000:.1f} ms)")
        assert 1 == sandbox.status()["approvers"]  # the awake one
        log = (sandbox.root / "daemon.stderr").read_text()
        assert "approver 'sleepy'" in log and "it stopped reading" in log
        # woken up, the stopped approver finds its connection closed and exits cleanly
        os.killpg(stopped.pid, signal.SIGCONT)
        assert stopped.wait(timeout=60) == 0


class Progress:
    """Reads an agent's JSON lines in a thread: the latest call count, and its last line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import threading
        self.calls = 0
        self.final: dict[str, Any] = {}
        self.proc = proc
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "calls" in msg:
                self.calls = msg["calls"]
            else:
                self.final = msg


class TestFloodingProcess:
    """Caps that hold per process, across its sessions and connections."""

    FLOOD = (
        "from vault.client import AgentClient, RpcError\n"
        "conns = [AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60) for _ in range(4)]\n"
        "sessions = []\n"
        "for i in range(4):\n"
        "    c = conns[i]\n"
        "    c.open_session(f'flood-{i}', 'run-flood')\n"
        "    sessions.append(c)\n"
        "cats = {}\n"
        "for i in range(300):\n"
        "    r = sessions[i % 4].call('create_issue', {'title': f'spam {i}'}, wait_s=0)\n"
        "    cats[str(r.category)] = cats.get(str(r.category), 0) + 1\n"
        "opened, refused = 0, None\n"
        "extra = [AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60) for _ in range(2)]\n"
        "try:\n"
        "    for i in range(400):\n"
        "        extra[i % 2].request('session.open', agent=f'more-{i}')\n"
        "        opened += 1\n"
        "except RpcError as e:\n"
        "    refused = [e.rpc_code, e.message]\n"
        "out({'categories': cats, 'opened': opened, 'refused': refused})\n"
        "import select\n"
        "while not select.select([sys.stdin], [], [], 0)[0]:\n"  # keep flooding until told to stop
        "    sessions[0].call('create_issue', {'title': 'more spam'}, wait_s=0)\n"
    )

    NORMAL = (
        "client.open_session('normal', 'run-normal')\n"
        "lat, cats = [], []\n"
        "for i in range(30):\n"
        "    t0 = time.perf_counter()\n"
        "    r = client.call('create_issue', {'title': f'real {i}'})\n"
        "    lat.append(time.perf_counter() - t0)\n"
        "    cats.append(str(r.category))\n"
        "out({'latencies': lat, 'categories': cats})\n"
    )

    @pytest.mark.timeout(400)  # many real processes: slow on a loaded machine
    def test_a_flooder_is_refused_and_another_process_gets_its_prompts_through(self, sandbox: Sandbox) -> None:
        """A process with four sessions on four connections: 64 prompts wait, the rest are
        rate_limited, its 257th session is refused; a normal process beside it gets every prompt
        answered at once; when the flooder exits its prompts are withdrawn."""
        setup(sandbox)
        sandbox.start_approver([{"match": {"agent": "flood*"}, "decide": "ignore"},
                                {"match": {}, "decide": "allow_once"}])
        flood = spawn_script(sandbox, self.FLOOD)
        assert flood.stdout is not None
        report = json.loads(flood.stdout.readline())
        assert {"approval_pending": MAX_PENDING_PER_PROCESS,
                "rate_limited": 300 - MAX_PENDING_PER_PROCESS} == report["categories"]
        assert MAX_SESSIONS_PER_PROCESS - 4 == report["opened"]
        assert -32004 == report["refused"][0] and "this process" in report["refused"][1]
        # the flooder keeps calling while the normal process works
        normal = run_script(sandbox, self.NORMAL)[0]
        assert ["success"] * 30 == normal["categories"]
        assert p99(normal["latencies"]) < 1.0, normal["latencies"]
        assert MAX_PENDING_PER_PROCESS == sandbox.status()["pending"]
        flood.communicate("stop\n", timeout=60)
        wait_for(lambda: sandbox.status()["pending"] == 0, what="the flooder's prompts to be withdrawn")
        with ApproverClient.for_home(VaultHome(sandbox.home), "check") as c:
            decisions = c.all_pages("stats", run_id="run-flood")["runs"]["run-flood"]["decisions"]
        assert {"withdrawn": MAX_PENDING_PER_PROCESS} == decisions


HOLDER = r"""
import socket, sys, json, select
path, conns, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, refused = [], 0
for _ in range(conns):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    try:
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"vault.status","params":{"pad":"' + b"x" * size)
    except OSError:
        refused += 1
        continue
    held.append(s)
# count the connections the daemon closed with an error line
closed = 0
for s in held:
    s.setblocking(False)
    try:
        data = s.recv(4096)
    except BlockingIOError:
        continue
    except OSError:
        data = b""
    if not data or b"-32004" in data:
        closed += 1
print(json.dumps({"sent": conns, "refused_while_sending": refused, "closed": closed}), flush=True)
sys.stdin.readline()
"""


def daemon_process(sandbox: Sandbox) -> psutil.Process:
    return psutil.Process(sandbox.status()["pid"])


NORMAL_READ = "client.open_session('normal')\nout(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"


def _fd_hard_limit() -> float:
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return float("inf") if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(_fd_hard_limit() < 4096, reason="the open-file hard limit is under 4,096: the daemon "
                                                   "cannot hold 2,000 connections here")
class TestPartialFrames:
    """Unfinished lines cost the daemon a bounded amount of memory, however many connections."""

    def spawn_holders(self, sandbox: Sandbox, processes: int, conns: int, size: int) -> list[subprocess.Popen[str]]:
        return [sandbox.spawn([PY, "-c", HOLDER, str(sandbox.agent_sock), str(conns), str(size)],
                              env=agent_env(sandbox), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                for _ in range(processes)]

    @pytest.mark.timeout(400)  # many real processes: slow on a loaded machine
    def test_two_thousand_connections_holding_partial_lines(self, sandbox: Sandbox) -> None:
        """2,000 connections (10 processes) each holding 16 KiB of an unfinished line: all held,
        daemon RSS under 200 MB, and a normal agent's call still succeeds."""
        setup(sandbox)
        holders = self.spawn_holders(sandbox, 10, 200, 16 * 1024)
        reports = [json.loads(h.stdout.readline()) for h in holders]  # type: ignore[union-attr]
        assert all(r["closed"] == 0 and r["refused_while_sending"] == 0 for r in reports), reports
        status = wait_for(lambda: (s := sandbox.status()) and s["partial_bytes"] >= 2000 * 16 * 1024 and s,
                          timeout=60, what="every partial line to reach the daemon")
        assert status["connections"] >= 2000
        rss = daemon_process(sandbox).memory_info().rss
        assert rss < 200 * 1024 * 1024, f"daemon RSS {rss / 2**20:.0f} MB"
        ok = run_script(sandbox, NORMAL_READ)
        assert "success" == ok[0]["category"]
        for h in holders:
            h.communicate("\n", timeout=60)
        wait_for(lambda: sandbox.status()["partial_bytes"] == 0, what="the memory to be given back")

    @pytest.mark.timeout(400)  # many real processes: slow on a loaded machine
    def test_megabyte_partial_lines_are_refused_past_the_caps(self, sandbox: Sandbox) -> None:
        """2,000 connections each sending 1 MiB without a newline (the issue's 1 GB): each process
        keeps at most 4 MiB, all of them 32 MiB; the rest are closed with -32004; RSS stays under
        200 MB; a normal agent's call still succeeds."""
        setup(sandbox)
        holders = self.spawn_holders(sandbox, 10, 200, (1 << 20) - 100)
        reports = [json.loads(h.stdout.readline()) for h in holders]  # type: ignore[union-attr]
        assert sum(r["refused_while_sending"] + r["closed"] for r in reports) > 1900, reports
        status = sandbox.status()
        assert status["partial_bytes"] <= MAX_PARTIAL_BYTES
        # each process keeps at most 4 MiB (4 such lines and part of a fifth), all 32 MiB
        assert status["connections"] <= MAX_PARTIAL_BYTES // (1 << 20) + 2
        rss = daemon_process(sandbox).memory_info().rss
        assert rss < 200 * 1024 * 1024, f"daemon RSS {rss / 2**20:.0f} MB"
        ok = run_script(sandbox, NORMAL_READ)
        assert "success" == ok[0]["category"]
        for h in holders:
            h.communicate("\n", timeout=60)
        log = (sandbox.root / "daemon.stderr").read_text()
        assert "unfinished lines" in log


PROMPTER = r"""
import json, os, sys, select
from vault.client import AgentClient
children = int(sys.argv[1])
pids = []
for n in range(children):
    pid = os.fork()
    if pid == 0:
        c = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60)
        for s in range(4):
            c.open_session(f'many-{n}', 'run-many')
            for i in range(16):
                c.call('create_issue', {'title': 't' * 70 + f'{n}-{s}-{i}'}, wait_s=0)
        os.write(1, b'ready\n')
        while os.read(0, 4096):  # until the test closes stdin
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"""


class TestPagedAnswers:
    @pytest.mark.timeout(400)  # many real processes: slow on a loaded machine
    def test_approvers_connect_with_thousands_of_prompts_waiting(self, sandbox: Sandbox) -> None:
        """1,920 prompts wait (over 1 MiB as one list): subscribe answers one page under the frame
        limit, and `vaultsim approve`, the TUI's link and `sessions` read every page."""
        from vault.client import connect_approver
        import asyncio

        setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "ignore"}], name="first")  # prompts need a receiver
        children = 30
        proc = sandbox.spawn([PY, "-c", PROMPTER, str(children)], env=agent_env(sandbox), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
        for _ in range(children):
            assert "ready" == proc.stdout.readline().strip()  # type: ignore[union-attr]
        total = children * 64
        assert total == sandbox.status()["pending"]
        with RawClient(sandbox.home / "approver.sock") as raw:
            hello(sandbox, raw)
            raw.send(frame("subscribe", {}))
            line = raw.file.readline()
            assert len(line) < 1 << 20
            first = json.loads(line)["result"]
            assert first["next"] and 0 < len(first["pending"]) < total
            whole = sum(len(p["request_id"]) for p in first["pending"])
            assert whole  # real prompts, not placeholders
        log = sandbox.root / "second.log"
        sandbox.start_approver([{"match": {}, "decide": "ignore"}], name="second", log=log)
        wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == total, timeout=60,
                 what="the scripted approver to see every waiting prompt")

        async def tui_link() -> int:
            client, answer = await connect_approver(VaultHome(sandbox.home), "tui")
            await client.close()
            return len({p["request_id"] for p in answer["pending"]})
        assert total == asyncio.run(tui_link())
        with ApproverClient.for_home(VaultHome(sandbox.home), "cli") as c:
            assert children * 4 == len(c.all_pages("sessions")["sessions"])
        proc.communicate(timeout=60)


class TestSessionEndsWithItsProcess:
    def test_a_killed_agent_s_session_ends_by_notification(self, sandbox: Sandbox) -> None:
        """The daemon watches a session's process with a pidfd: SIGKILL ends the session at once."""
        setup(sandbox)
        agent = spawn_script(sandbox, "client.open_session('doomed')\nout({'open': True})\nsys.stdin.readline()\n")
        assert json.loads(agent.stdout.readline()) == {"open": True}  # type: ignore[union-attr]
        daemon = daemon_process(sandbox)
        pidfds = [fd for fd in Path(f"/proc/{daemon.pid}/fd").iterdir()
                  if os.readlink(fd) == "anon_inode:[pidfd]"]
        assert pidfds, "the daemon holds no pidfd for the session's process"
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=30)
        wait_for(lambda: sandbox.status()["sessions"] == 0, timeout=10, what="the session to end")



class TestDefenceInDepth:
    """Should unencodable text get past the wire rule anyway, it is escaped, never fatal."""

    def test_an_answer_holding_a_lone_surrogate_is_still_sent_as_valid_json(self) -> None:
        """The frame encoder falls back to JSON escapes rather than failing the answer."""
        from vault import jsonrpc as rpc
        line = rpc.encode_result("id" + SURROGATE, {"value": SURROGATE})
        assert {"jsonrpc": "2.0", "id": "id" + SURROGATE, "result": {"value": SURROGATE}} == json.loads(line)

    def test_an_audit_event_holding_one_is_recorded_escaped_not_a_halt(self) -> None:
        """The daemon tells an event it cannot encode from a log it cannot write."""
        from pydantic_core import to_json

        from vault.daemon.recorder import _recordable, _unrecordable
        event = {"type": "call_requested", "target": "release " + SURROGATE, "n": 1}
        why = _unrecordable(event)
        assert "not Unicode" in why
        fixed = _recordable(event, why)
        assert json.loads(to_json(fixed))["target"] == "release \\ud800"
        assert "" == _unrecordable(fixed)


class TestStatsPages:
    """`stats` grows with every session ever seen: it is paged, and an oversized entry is cut."""

    def test_pages_fit_a_frame_and_merge_back_into_the_whole_report(self) -> None:
        from types import SimpleNamespace

        from vault.daemon.approver_api import _stats_page
        from vault.catalog import Risk
        from vault.client import merge_page
        from vault.gate.stats import MAX_KEYS, OTHER, PromptStats
        from vault.daemon.limits import PAGE_BYTES

        st = PromptStats()
        for i in range(3000):
            st.prompt(f"run-{i % 7}", f"s-{i}", "create_issue", Risk.create, f"scope {i}")
        # one session asks for 5,000 distinct scopes: its entry alone would fill a page
        for i in range(5000):
            st.prompt("run-0", "s-big", "delete_release", Risk.delete, f"release r-{i:05d} " + "x" * 40)
        daemon = SimpleNamespace(gate=SimpleNamespace(stats=st))
        first = _stats_page(daemon, None, 0)  # type: ignore[arg-type]
        whole, pages = dict(first), 1
        while whole.get("next"):
            page = _stats_page(daemon, None, int(whole["next"]))  # type: ignore[arg-type]
            assert len(json.dumps(page)) < PAGE_BYTES + 4096
            merge_page(whole, page)
            pages += 1
        assert pages > 3
        full = st.report()
        assert set(full["runs"]) == set(whole["runs"]) and set(full["sessions"]) == set(whole["sessions"])
        assert full["sessions"]["s-7"] == whole["sessions"]["s-7"]
        big = whole["sessions"]["s-big"]
        # the store keeps MAX_KEYS scopes per table and counts the rest under OTHER: none is lost
        assert big["prompts"] == 5000 == sum(big["scopes_asked"].values())
        assert len(big["scopes_asked"]) == MAX_KEYS + 1 and big["scopes_asked"][OTHER] == 5000 - MAX_KEYS
