"""Who is asking, decided per line: inherited connections, and agents on the approver socket.

A session acts only for the process that opened it, and only while it lives;
a child that inherited its parent's connection is itself (SCM_CREDENTIALS).
Without the jail, nothing from an agent's process tree (children, a double
fork, a parent that said hello first) can approve, and every attempt is in
the audit log with the process that made it.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from audit_daemon_helpers import events
from helpers import PY, Sandbox, wait_for
from hostile_fixtures import RawClient, frame, hello, run_script, setup, spawn_script

# lineage: the process and its ancestors, (pid, start time) up to init (vault.lineage)
ATTEMPT_KEYS = {"type", "method", "pid", "sid", "pgid", "exe", "accepted", "reason", "name", "request_id", "lineage",
                "opener_pid"}  # the process that opened the connection (SO_PEERCRED at accept)

# the child writes a raw call frame on the parent's socket and reads the answer itself
CHILD_CALL = (
    "def raw_call(session_id, title):\n"
    "    client.sock.sendall(json.dumps({'jsonrpc': '2.0', 'id': 'child', 'method': 'call', 'params': {\n"
    "        'session_id': session_id, 'operation': 'create_issue', 'params': {'title': title}}}).encode() + b'\\n')\n"
    "    buf = b''\n"
    "    while not buf.endswith(b'\\n'):\n"
    "        buf += client.sock.recv(65536)\n"
    "    return json.loads(buf)\n"
)


def attempts(sandbox: Sandbox, connects: bool = False) -> list[dict[str, Any]]:
    """The approver_attempt events as recorded (without the record's own seq and time): the
    acts (hello, decide, lock, unlock), or with `connects` the connections opened too."""
    return [{k: v for k, v in e.items() if k not in ("seq", "time")}
            for e in events(sandbox) if e.get("type") == "approver_attempt"
            and (connects or e.get("method") != "connect")]


@pytest.mark.timeout(300)
class TestInheritedConnection:
    def test_a_child_on_its_parent_s_connection_does_not_act_as_the_parent(self, sandbox: Sandbox) -> None:
        """The parent holds a session grant; a forked child writes a call with the parent's
        session id on the very same socket: refused, nothing created, the parent goes on."""
        setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "allow_session"}])
        results = run_script(sandbox, CHILD_CALL + (
            "sid = client.open_session('parent', 'run-1')\n"
            "out(client.call('create_issue', {'title': 'granted'}))\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    out(raw_call(sid, 'by the child'))\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "out(client.call('create_issue', {'title': 'parent again'}))\n"))
        assert "success" == results[0]["category"]
        child = results[1]["result"]
        assert "authorization_denied" == child["category"]
        assert "belongs to process" in child["message"]
        assert "success" == results[2]["category"]

    def test_a_child_that_outlives_its_parent_gets_nothing(self, sandbox: Sandbox) -> None:
        """The parent exits; its child, still holding the connection, tries the parent's
        session: refused (the session ended with its process)."""
        setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "allow_session"}])
        proc = spawn_script(sandbox, CHILD_CALL + (
            "sid = client.open_session('parent', 'run-1')\n"
            "out(client.call('create_issue', {'title': 'granted'}))\n"
            "parent = os.getpid()\n"
            "if os.fork() == 0:\n"
            "    while os.getppid() == parent:\n"  # until the parent has exited
            "        time.sleep(0.001)\n"
            "    out(raw_call(sid, 'after the parent'))\n"
            "    os._exit(0)\n"
            "os._exit(0)\n"))
        assert proc.stdout is not None
        assert "success" == json.loads(proc.stdout.readline())["category"]
        child = json.loads(proc.stdout.readline())["result"]
        assert "authorization_denied" == child["category"]
        assert child["message"].startswith(("unknown or closed session", "session"))

    def test_a_line_written_by_two_processes_is_refused(self, sandbox: Sandbox) -> None:
        """The parent writes half a request, its child the rest: -32600, not a request of either."""
        setup(sandbox)
        results = run_script(sandbox, (
            "client.open_session('parent')\n"
            "line = json.dumps({'jsonrpc': '2.0', 'id': 7, 'method': 'vault.status'}).encode() + b'\\n'\n"
            "client.sock.sendall(line[:10])\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    client.sock.sendall(line[10:])\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "out(json.loads(client.file.readline()))\n"))
        assert -32600 == results[0]["error"]["code"]
        assert "more than one process" in results[0]["error"]["message"]

    def test_a_child_on_an_approver_s_connection_is_not_the_approver(self, sandbox: Sandbox) -> None:
        """An approver forks; the child decides on the inherited connection: not authorized."""
        setup(sandbox)
        code = (
            "import json, os\n"
            "from vault.client import ApproverClient\nfrom vault.home import VaultHome\n"
            "from vault.errors import RpcError\n"
            "c = ApproverClient.for_home(VaultHome.resolve(), 'parent-approver')\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    try:\n"
            "        c.request('lock')\n"
            "        print(json.dumps({'refused': False}), flush=True)\n"
            "    except RpcError as e:\n"
            "        print(json.dumps({'refused': True, 'message': e.message}), flush=True)\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
        out = subprocess.run([PY, "-c", code], env=sandbox.env, capture_output=True, text=True, timeout=60)
        result = json.loads(out.stdout.splitlines()[0])
        assert result["refused"] is True and "did not say approver.hello" in result["message"]
        assert sandbox.status()["locked"] is False


ESCAPE = (
    "from vault.client import ApproverClient\nfrom vault.home import VaultHome\n"
    "from vault.errors import RpcError\n"
    "client.open_session('escaper', 'run-1')\n"
    "result = sys.argv[1]\n"
    "if os.fork() == 0:\n"
    "    middle = os.getpid()\n"
    "    if os.fork() == 0:\n"  # the grandchild: reparented once its parent exits
    "        while os.getppid() == middle:\n"
    "            time.sleep(0.001)\n"
    "        try:\n"
    "            ApproverClient.for_home(VaultHome.resolve())\n"
    "            verdict = {'refused': False}\n"
    "        except RpcError as e:\n"
    "            verdict = {'refused': True, 'message': e.message}\n"
    "        except Exception as e:\n"  # say what went wrong rather than leave the agent waiting
    "            verdict = {'refused': None, 'message': repr(e)}\n"
    "        verdict['pid'] = os.getpid()\n"
    "        open(result + '.tmp', 'w').write(json.dumps(verdict))\n"
    "        os.rename(result + '.tmp', result)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "deadline = time.monotonic() + 90\n"
    "while not os.path.exists(result) and time.monotonic() < deadline:\n"  # the session stays open
    "    time.sleep(0.01)\n"
    "out({'agent_pid': os.getpid()})\n"
)


@pytest.mark.timeout(300)  # several fresh processes each: slow on a loaded machine
class TestApproverGuard:
    def test_a_double_forked_escapee_is_refused_and_recorded(self, sandbox: Sandbox) -> None:
        """An agent (leading its own session, as the runner starts it) double-forks; the
        grandchild, no longer its descendant, says hello with the right token: refused because it
        shares the agent's session id, and the attempt is in the audit log with its pid."""
        setup(sandbox)
        result = sandbox.root / "escape.json"
        out = run_script(sandbox, ESCAPE, str(result))
        verdict = json.loads(result.read_text())
        assert verdict["refused"] is True, verdict
        assert "session id" in verdict["message"] or "process group" in verdict["message"]
        agent_pid = out[0]["agent_pid"]
        found = wait_for(lambda: [a for a in attempts(sandbox) if a["pid"] == verdict["pid"]],
                         what="the escapee's attempt in the audit log")
        assert ATTEMPT_KEYS == set(found[0])
        assert ("approver.hello", False, agent_pid, agent_pid) == (
            found[0]["method"], found[0]["accepted"], found[0]["sid"], found[0]["pgid"])
        assert found[0]["reason"] == verdict["message"]

    def test_a_parent_that_said_hello_first_cannot_approve_its_child(self, sandbox: Sandbox) -> None:
        """Hello, then open a session, then start a child agent: deciding the child's request
        is refused (checked at decide time), and the child is not approved."""
        setup(sandbox)
        results = run_script(sandbox, (
            "import asyncio, subprocess\n"
            "from vault.client import connect_approver\nfrom vault.home import VaultHome\n"
            "from vault.errors import RpcError\n"
            "child_code = ('import json, os\\nfrom vault.client import AgentClient\\n'\n"
            "  'c = AgentClient(os.environ[\"VAULTSIM_SOCKET\"], timeout=60)\\n'\n"
            "  'c.open_session(\"child\", \"run-1\")\\n'\n"
            "  'print(c.call(\"create_issue\", {\"title\": \"x\"}, wait_s=3).to_json())\\n')\n"
            "async def main():\n"
            "    asked = asyncio.Queue()\n"
            "    def note(method, params):\n"
            "        if method == 'approval.requested':\n"
            "            asked.put_nowait(params['request_id'])\n"
            "    approver, _ = await connect_approver(VaultHome.resolve(), 'parent', note)\n"
            "    client.open_session('parent', 'run-1')\n"
            "    child = await asyncio.create_subprocess_exec(sys.executable, '-c', child_code,\n"
            "                                                 stdout=subprocess.PIPE)\n"
            "    rid = await asyncio.wait_for(asked.get(), 30)\n"
            "    try:\n"
            "        await approver.request('decide', request_id=rid, decision='allow_once')\n"
            "        out({'refused': False})\n"
            "    except RpcError as e:\n"
            "        out({'refused': True, 'message': e.message, 'request_id': rid})\n"
            "    line, _ = await child.communicate()\n"
            "    out(json.loads(line))\n"
            "asyncio.run(main())\n"))
        assert results[0]["refused"] is True
        assert "opened an agent session" in results[0]["message"]
        assert "approval_pending" == results[1]["category"]
        refused = wait_for(lambda: [a for a in attempts(sandbox) if a["method"] == "decide"],
                           what="the refused decide in the audit log")
        assert (False, "parent", results[0]["request_id"]) == (
            refused[0]["accepted"], refused[0]["name"], refused[0]["request_id"])

    def test_every_attempt_is_recorded_with_its_process(self, sandbox: Sandbox) -> None:
        """Hello (wrong token, then right), decide (unknown request), lock and unlock: one
        approver_attempt each, accepted or not, with pid, sid, pgid and exe of the caller."""
        setup(sandbox)
        with RawClient(sandbox.home / "approver.sock") as raw:
            assert "error" in raw.ask(frame("approver.hello", {"token": "wrong", "name": "mallory"}))
            assert "error" in raw.ask(frame("lock", {}))  # before hello
            hello(sandbox, raw, "alice")
            assert "error" in raw.ask(frame("decide", {"request_id": "r-none", "decision": "deny"}))
            assert "result" in raw.ask(frame("lock", {}))
            assert "result" in raw.ask(frame("unlock", {}))
        me = os.getpid()
        seen = wait_for(lambda: (a := attempts(sandbox)) and len(a) >= 6 and a, what="six attempts")
        assert all(ATTEMPT_KEYS == set(a) for a in seen)
        shown = [(a["method"], a["accepted"], a["name"], a["request_id"], bool(a["reason"])) for a in seen]
        assert [("approver.hello", False, "mallory", None, True),
                ("lock", False, None, None, True),
                ("approver.hello", True, "alice", None, False),
                ("decide", False, "alice", "r-none", True),
                ("lock", True, "alice", None, False),
                ("unlock", True, "alice", None, False)] == shown
        assert {(me, os.getsid(me), os.getpgid(me))} == {(a["pid"], a["sid"], a["pgid"]) for a in seen}
        assert {(me, os.getppid())} == {(a["lineage"][0][0], a["lineage"][1][0]) for a in seen}
        assert seen[0]["reason"] == "wrong approver token"
        assert all(a["exe"] for a in seen)

    def test_every_connection_is_recorded_with_its_process_a_flood_at_powers_of_two(
            self, sandbox: Sandbox) -> None:
        """A process that only connects to the approver socket (without the jail an agent finds it
        beside its own; holding connections, reading status) reached for it: each connection is an
        approver_attempt `connect` with the process; 40 of them: the first 8, then the 16th and 32nd."""
        setup(sandbox)
        out = run_script(sandbox, (
            "import socket\n"
            "held = []\n"
            "for _ in range(40):\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "    s.connect(os.environ['VAULTSIM_SOCKET'].replace('agent.sock', 'approver.sock'))\n"
            "    held.append(s)\n"
            "out({'pid': os.getpid()})\n"))
        pid = out[0]["pid"]
        seen = wait_for(lambda: (a := [x for x in attempts(sandbox, connects=True) if x["pid"] == pid])
                        and len(a) >= 10 and a, what="ten connects")
        assert 10 == len(seen) and {"connect"} == {a["method"] for a in seen}
        assert all(a["accepted"] and a["exe"] and a["sid"] == a["pgid"] == pid for a in seen), seen

    def test_session_opened_names_the_process_session_and_group(self, sandbox: Sandbox) -> None:
        """The agent-side record of a session carries the opener's sid and pgid."""
        setup(sandbox)
        out = run_script(sandbox, "client.open_session('stub')\nout({'pid': os.getpid(), 'sid': os.getsid(0), "
                                  "'pgid': os.getpgid(0)})\n")
        opened = wait_for(lambda: [e for e in events(sandbox) if e.get("type") == "session_opened"],
                          what="session_opened")
        assert (out[0]["pid"], out[0]["sid"], out[0]["pgid"]) == (opened[0]["pid"], opened[0]["sid"],
                                                                   opened[0]["pgid"])
