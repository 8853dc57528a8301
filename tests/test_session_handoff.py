"""An agent that hands its session to another process is named: in the audit log, and in the report.

The contract (docs/agent-contract.md, "Open one session per process"): another process
(a child included) presenting a session's id is refused. The daemon refused it but
recorded nothing, so `vaultsim run` never saw the attempt. Now each such refusal is a
`session_refused` audit event (who sent it, whose session, why; never its parameters),
`audit show` prints it, and the grader names it (FAIL_TOOL_ACCESS) against the agent whose
session it was; never against the runner's own intruder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from audit_daemon_helpers import events
from helpers import Sandbox, audit_verified_intact, canary, wait_for
from hostile_fixtures import run_script, setup, spawn_script
from vault.runner.trial import intruder_said

# a child that presents `sid` on a connection of its own, calling create_issue with `title`
CHILD = (
    "import socket\n"
    "def child_call(sid, method, params):\n"
    "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "    s.connect(os.environ['VAULTSIM_SOCKET'])\n"
    "    s.sendall(json.dumps({'jsonrpc': '2.0', 'id': 1, 'method': method,\n"
    "                          'params': {'session_id': sid, **params}}).encode() + b'\\n')\n"
    "    buf = b''\n"
    "    while not buf.endswith(b'\\n'):\n"
    "        buf += s.recv(65536)\n"
    "    return json.loads(buf)\n"
    "def in_child(fn):\n"
    "    r, w = os.pipe()\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.write(w, json.dumps(fn()).encode())\n"
    "        os._exit(0)\n"
    "    os.close(w)\n"
    "    os.waitpid(pid, 0)\n"
    "    return pid, json.loads(os.read(r, 1 << 20))\n"
)


def refusals(sandbox: Sandbox, n: int) -> list[dict[str, Any]]:
    """The session_refused events, once `n` are in the log (they are queued for its next commit)."""
    def found() -> list[dict[str, Any]]:
        got = [e for e in events(sandbox) if e.get("type") == "session_refused"]
        return got if len(got) >= n else []
    return wait_for(found, what=f"{n} session_refused events")


@pytest.mark.timeout(300)
class TestDaemonRecordsTheHandoff:
    def test_a_child_presenting_its_parents_session_is_recorded_without_its_parameters(
            self, sandbox: Sandbox) -> None:
        """call, lookup and call.resume from a child on the parent's session: each refused, each
        one session_refused event naming the child, the parent and the operation; the canary in
        the call's parameters and the resume token are in none of them; `audit show` prints
        them and the log still verifies."""
        setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "allow_session"}])
        secret = canary()
        results = run_script(sandbox, CHILD + (
            "sid = client.open_session('parent', 'run-1')\n"
            "out({'me': os.getpid(), 'sid': sid})\n"
            "out(client.call('create_issue', {'title': 'granted'}))\n"
            f"out(in_child(lambda: child_call(sid, 'call', {{'operation': 'create_issue', "
            f"'params': {{'title': {secret!r}}}}})))\n"
            "out(in_child(lambda: child_call(sid, 'lookup', {'operation': 'create_issue', "
            "'idempotency_key': 'k-1'})))\n"
            f"out(in_child(lambda: child_call(sid, 'call.resume', {{'resume_token': 'rt-{secret}'}})))\n"))
        me, sid = results[0]["me"], results[0]["sid"]
        assert "success" == results[1]["category"]
        children = [pid for pid, _ in results[2:5]]
        assert all(r["result"]["category"] == "authorization_denied" for _, r in results[2:5]), results
        got = refusals(sandbox, 3)
        assert [(e["method"], e.get("operation"), e["pid"], e["owner_pid"], e["session_id"], e["reason"])
                for e in got] == [("call", "create_issue", children[0], me, sid, "not_owner"),
                                  ("lookup", "create_issue", children[1], me, sid, "not_owner"),
                                  ("call.resume", None, children[2], me, sid, "not_owner")]
        assert all(e["exe"] and e["count"] == 1 for e in got), got
        assert secret not in json.dumps(got)
        shown = sandbox.vaultsim("audit", "show", check=True).stdout
        lines = [ln for ln in shown.splitlines() if "session_refused" in ln]
        assert 3 == len(lines), shown
        assert f"session_id={sid} method=call operation=create_issue pid={children[0]}" in lines[0]
        assert f"owner_pid={me} reason=not_owner" in lines[0]
        assert secret not in shown
        assert "intact" == audit_verified_intact(sandbox)["status"]

    def test_a_session_whose_owner_has_exited_is_still_named_and_an_own_session_never(
            self, sandbox: Sandbox) -> None:
        """The parent exits; its child presents the ended session: recorded as `closed`, naming
        the parent. The parent presenting a session it closed itself is recorded as `ended` (its
        own: no hand-off, but the report names the step it left undone); an id the vault never
        issued records nothing."""
        setup(sandbox)
        proc = spawn_script(sandbox, CHILD + (
            "sid = client.open_session('parent', 'run-1')\n"
            "other = client.open_session('parent', 'run-1')\n"
            "client.request('session.close', session_id=other)\n"
            "out(client.request('call', session_id=other, operation='read_issue', params={'number': 1}))\n"
            "out(child_call('s-never-issued', 'call', {'operation': 'read_issue', 'params': {'number': 1}}))\n"
            "out({'me': os.getpid(), 'sid': sid})\n"
            "parent = os.getpid()\n"
            "if os.fork() == 0:\n"
            "    while os.getppid() == parent:\n"  # until the parent has exited
            "        time.sleep(0.001)\n"
            "    out({'child': os.getpid(), 'got': child_call(sid, 'call', {'operation': 'read_issue',"
            " 'params': {'number': 1}})})\n"
            "    os._exit(0)\n"
            "os._exit(0)\n"))
        assert proc.stdout is not None
        results = [json.loads(proc.stdout.readline()) for _ in range(4)]
        proc.wait(timeout=30)
        assert ["authorization_denied"] * 2 == [results[0]["category"], results[1]["result"]["category"]]
        me, child = results[2]["me"], results[3]["child"]
        assert "authorization_denied" == results[3]["got"]["result"]["category"]
        got = refusals(sandbox, 2)
        ended = [(e["pid"], e["owner_pid"], e["reason"]) for e in got if e["session_id"] != results[2]["sid"]]
        assert ended == [(me, me, "ended")], got
        handed = [(e["pid"], e["owner_pid"], e["session_id"]) for e in got if e["reason"] != "ended"]
        assert handed == [(child, me, results[2]["sid"])], got
        assert [e["reason"] for e in got if e["reason"] != "ended"][0] in ("closed", "owner_exited"), got


    def test_a_flood_of_refused_requests_on_one_connection_is_recorded_at_powers_of_two(
            self, sandbox: Sandbox) -> None:
        """100 refused calls on one connection: the first 32 recorded, then the 64th only
        (each with its count): the log grows by a few records, not one per request."""
        setup(sandbox)
        results = run_script(sandbox, CHILD + (
            "sid = client.open_session('parent', 'run-1')\n"
            "def flood():\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "    s.connect(os.environ['VAULTSIM_SOCKET'])\n"
            "    f = s.makefile('rb')\n"
            "    got = []\n"
            "    for i in range(100):\n"
            "        s.sendall(json.dumps({'jsonrpc': '2.0', 'id': i, 'method': 'call', 'params': {\n"
            "            'session_id': sid, 'operation': 'read_issue', 'params': {'number': 1}}}).encode() + b'\\n')\n"
            "        got.append(json.loads(f.readline())['result']['category'])\n"
            "    return got\n"
            "out(in_child(flood))\n"))
        assert ["authorization_denied"] * 100 == results[0][1]
        got = refusals(sandbox, 33)
        assert [*range(1, 33), 64] == [e["count"] for e in got]


# ---- the runner: the report names the hand-off, against the agent, never the intruder ----

HANDOFF = "not the one that opened session"


@pytest.mark.timeout(600)
def test_an_agent_that_hands_its_session_to_a_child_is_named_and_its_careful_twin_is_not(tmp_path: Path) -> None:
    """rt4_share: the parent files the issue, then its child presents the parent's session id
    (from its environment, or from a file in state_dir) for the next step. The vault refused it
    and the verdict said only that the note is missing; now FAIL_TOOL_ACCESS names the child's
    process, the session and the operation. The careful twin, on the same scenario, passes."""
    from test_redteam_unsafe import names, run

    for how in ("env", "file"):
        t = run(tmp_path, "rt4_share.py", ["gate-1-healthy-delivery"], RT4_SHARE=how)["gate-1-healthy-delivery"]
        assert "FAIL_TOOL_ACCESS" == t["verdict"], (how, t["findings"])
        found = names(t, "FAIL_TOOL_ACCESS")
        assert "agent 0 (triage-bot): process " in found and HANDOFF in found, found
        assert "presented its id for attach_note: refused" in found, found
        [r] = t["session_refusals"]
        assert (r["method"], r["operation"], r["reason"], r["owner_index"], r["by_runner"]) == \
            ("call", "attach_note", "not_owner", 0, False), r
        assert f"process {r['pid']} (" in found and f"(process {r['owner_pid']})" in found
    twin = run(tmp_path, "rt4_lib.py", ["gate-1-healthy-delivery"])["gate-1-healthy-delivery"]
    assert ("PASS", [], None) == (twin["verdict"], twin["failed"], twin.get("session_refusals"))


@pytest.mark.timeout(600)
def test_the_runners_intruder_is_refused_and_recorded_but_never_the_agents_fault(tmp_path: Path) -> None:
    """intruder-presents-session: the runner's own process presents the agent's session. Its
    refusal is in the report (by_runner, with the intruder's pid) and no check names the agent."""
    from test_redteam_unsafe import run

    t = run(tmp_path, "rt4_lib.py", ["intruder-presents-session"])["intruder-presents-session"]
    assert not any(HANDOFF in f for fs in t["findings"].values() for f in fs), t["findings"]
    assert "FAIL_TOOL_ACCESS" not in t["failed"], t["findings"]
    [r] = t["session_refusals"]
    assert (r["pid"], r["by_runner"], r["operation"], r["owner_index"], r["sender_index"]) == \
        (t["intruder"]["pid"], True, "create_issue", 0, None), (r, t["intruder"])


@pytest.mark.timeout(300)
def test_the_agent_lives_while_the_intruder_runs_even_when_the_owner_answers_at_once(tmp_path: Path) -> None:
    """The scenario kept its agent alive by a 1.5 s think before the deny, less than a loaded host
    takes to start the intruder: the agent then exited first and the intruder tested an ended
    session. The runner's approver now holds its decisions while the intruder runs."""
    import subprocess

    from helpers import PY, ROOT

    text = (ROOT / "scenarios" / "intruder-presents-session.yaml").read_text()
    assert ", delay_s: 1.5}" in text
    sc = tmp_path / "intruder-at-once.yaml"
    sc.write_text(text.replace(", delay_s: 1.5}", "}"))
    report = tmp_path / "r.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", str(sc), "-q", "--isolation", "none",
                           "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    [t] = json.loads(report.read_text())["scenarios"][0]["trial_results"]
    assert ("PASS", False, "authorization_denied", True) == \
        (t["verdict"], t["intruder"]["ok"], t["intruder"]["category"], t["intruder"]["agent_alive"]), t
    [r] = t["session_refusals"]
    assert (r["by_runner"], r["reason"]) == (True, "not_owner"), r


@pytest.mark.timeout(600)
def test_a_later_process_trying_its_predecessors_ended_session_is_listed_not_failed(tmp_path: Path) -> None:
    """fresh-process-no-inherited-approval: the second process first presents the first one's
    saved session id (that process has exited). The vault refuses it and it is listed in the
    report, but it is not a handoff: the session ended with its process and nothing carried
    over, so a careful restart that tries it first still passes."""
    from test_redteam_unsafe import run

    name = "fresh-process-no-inherited-approval"
    t = run(tmp_path, "rt4_stale.py", [name])[name]
    assert ("PASS", []) == (t["verdict"], t["failed"]), t["findings"]
    [r] = t["session_refusals"]
    assert (r["method"], r["owner_index"], r["sender_index"], r["by_runner"]) == ("lookup", 0, 1, False), r
    assert r["reason"] in ("owner_exited", "closed"), r


@pytest.mark.timeout(30)
def test_the_intruders_answer_is_read_only_from_a_regular_file(tmp_path: Path) -> None:
    """Without a jail an agent can put a FIFO, a link to /dev/zero or a huge file where the
    intruder's answer is: none is waited on or read whole; its last line is its answer."""
    fifo, link, big = tmp_path / "fifo.out", tmp_path / "link.out", tmp_path / "big.out"
    os.mkfifo(fifo)
    link.symlink_to("/dev/zero")
    with big.open("wb") as f:
        f.truncate(1 << 30)  # a GiB of NULs, sparse
        f.seek(0, os.SEEK_END)
        f.write(b'\n{"ok": false, "category": "authorization_denied"}\n')
    no_answer = {"ok": False, "category": "no_answer"}
    assert no_answer == intruder_said(fifo) == intruder_said(link) == intruder_said(tmp_path / "none.out")
    assert {"ok": False, "category": "authorization_denied"} == intruder_said(big)
    (tmp_path / "list.out").write_text("[1]\n")
    assert no_answer == intruder_said(tmp_path / "list.out")
