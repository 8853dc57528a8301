"""A host that talks to `vaultsim mcp` as a shell pipe does: every line written, then stdin closed.

    python rt23m_pipe_host.py

Written from the README's MCP section and docs/agent-contract.md alone, as
`printf '%s\\n' "$HELLO" "$INITIALIZED" "$CALL" | vaultsim mcp` would be: it starts the bridge
with its own environment, writes the handshake and one tools/call per step of its task (each with
an idempotency key), closes the bridge's stdin at once (it has nothing more to say), and reads
every answer until the bridge exits. The README says each answer is a Result: the agent claims
`done` when every step's Result is success, else `not_done`. Its final line is a JSON object with `status`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def main() -> int:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    lines: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pipe-host", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    steps = task.get("steps") or []
    for n, step in enumerate(steps, 1):
        args = {**(step.get("params") or {}), "idempotency_key": f"pipe-{step.get('id', n)}"}
        lines.append({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                      "params": {"name": step["call"], "arguments": args}})
    bridge = subprocess.run([sys.executable, "-m", "vault.cli.main", "mcp"], env=dict(os.environ),
                            input="".join(json.dumps(m) + "\n" for m in lines), capture_output=True, text=True,
                            timeout=max(2.0, float(task["deadline"]) - __import__("time").time() - 1))
    answers = {}
    for line in bridge.stdout.splitlines():
        message = json.loads(line)
        if isinstance(message, dict) and "id" in message and "method" not in message:
            answers[message["id"]] = message
    results = [answers.get(n, {}).get("result", {}).get("structuredContent") for n in range(1, len(steps) + 1)]
    if all(r and r.get("category") == "success" for r in results):
        status = "done"
    else:  # a Result that said never, or an answer that is no Result: the agent cannot say it is done
        status = "not_done"
    said = [r.get("category") if r else answers.get(n + 1, {}).get("error", {}).get("message", "no answer")
            for n, r in enumerate(results)]
    print(json.dumps({"status": status, "results": said}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
