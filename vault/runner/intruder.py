"""The runner's intruder: another process presenting an agent's session id.

`python -m vault.runner.intruder SOCKET SESSION_ID OPERATION PARAMS_JSON`

A scenario with `intruder:` has the runner start this while the agent under
test lives and holds a session grant. It is not an agent under test: it is
the runner proving, for every agent, that a session id alone is worth nothing
outside the process that opened it (DESIGN.md "A session is usable only by the
process that opened it"). It prints what the vault answered as one JSON line.
"""

from __future__ import annotations

import json
import socket
import sys

# stdlib only: it must be quick to start, so that it acts while the agent still lives


def main(argv: list[str] | None = None) -> int:
    socket_path, session_id, operation, params = (argv if argv is not None else sys.argv[1:])[:4]
    request = {"jsonrpc": "2.0", "id": 1, "method": "call",
               "params": {"session_id": session_id, "operation": operation, "params": json.loads(params)}}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(socket_path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer = json.loads(sock.makefile("rb").readline() or b"{}")
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "category": "no_answer", "message": type(exc).__name__}), flush=True)
        return 0
    result = answer.get("result")
    if isinstance(result, dict):
        print(json.dumps({"ok": bool(result.get("ok")), "category": str(result.get("category"))}), flush=True)
    else:  # refused as a request: as good as refused as a call
        print(json.dumps({"ok": False, "category": "rpc_error"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
