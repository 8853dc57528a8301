"""An agent that does no work, written only from docs/agent-contract.md.

    python tests/agents/idle.py "FINAL MESSAGE"

It opens its session, calls nothing and prints FINAL MESSAGE: "done ..." is a
false claim, "not done ..." an honest one. Either way the step each scenario
grades was never attempted; the gate must name that (FAIL_OUTCOME), not blame
the vault's answer (FAIL_CATEGORY) or a retry instruction (FAIL_RECOVERY) that
no answer ever gave.
"""

from __future__ import annotations

import json
import os
import socket
import sys

task = json.load(open(os.environ["VAULTSIM_TASK"]))
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["VAULTSIM_SOCKET"])
sock.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.open",
                          "params": {"agent": task["agent"], "run_id": task["run_id"]}}) + "\n").encode())
sock.makefile("rb").readline()
print(sys.argv[1])
