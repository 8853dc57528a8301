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
import sys

from ..client import AgentClient
from ..errors import VaultError


def main(argv: list[str] | None = None) -> int:
    socket_path, session_id, operation, params = (argv if argv is not None else sys.argv[1:])[:4]
    try:
        client = AgentClient(socket_path, timeout=30)
        client.session_id = session_id
        result = client.call(operation, json.loads(params))
        print(json.dumps({"ok": result.ok, "category": str(result.category)}), flush=True)
    except VaultError as exc:  # refused as a request: as good as refused as a call
        print(json.dumps({"ok": False, "category": "rpc_error", "message": exc.message}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
