"""A request its process wrote just before dying is done only if the vault handled it before the exit.

docs/agent-contract.md section 3: a session ends with its process. A helper that wrote a call and
died at once (red team 35c's duo, RT35C_CRASH) left no call when the vault, busy on a loaded host,
read that line only after the exit: the vault refused it (nothing done) and the successor's lookup
of its key was, rightly, `not_found` (the careful35 dead-helper test then found no lookup naming a
call). Here the daemon is held with SIGSTOP while the process writes its call and exits, so the
vault reads the line after the exit every time: nothing is done, and a lookup by its key says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from vault.pytest_plugin import Vaultsim

# opens a session, says so, and on "go" writes one call and exits without reading its answer
DYING = r"""
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def send(i, method, params):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\n")
send(1, "session.open", {"agent": "dying-bot", "run_id": sys.argv[2]})
sid = json.loads(s.makefile("rb").readline())["result"]["session_id"]
print("ready", flush=True)
sys.stdin.readline()
send(2, "call", {"session_id": sid, "operation": "create_issue", "params": {"title": "never filed"},
                 "idempotency_key": "dying-1", "wait_s": 0})
os._exit(0)
"""


@pytest.mark.timeout(60)
def test_a_call_written_by_a_process_gone_before_the_vault_read_it_is_not_done(vaultsim: Vaultsim) -> None:
    vaultsim.approver.allow_once("create_issue")
    daemon = int((vaultsim.home / "daemon.pid").read_text().split()[0])
    child = subprocess.Popen([sys.executable, "-c", DYING, str(vaultsim.agent_socket), vaultsim.run_id],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    os.kill(daemon, signal.SIGSTOP)
    try:
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=20) == 0  # its call written, and gone, before the vault read it
    finally:
        os.kill(daemon, signal.SIGCONT)
    # the step taken over: the lookup of its key finds nothing done, and nothing was filed
    looked = vaultsim.client("dying-bot").lookup(idempotency_key="dying-1", operation="create_issue")
    assert looked.reconciled == "not_found", (looked.category, looked.reconciled, looked.message)
    assert vaultsim.effects("create_issue") == 0
