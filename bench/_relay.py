"""The floor under the vault's CPU per call: a relay that does only the plumbing.

    python bench/_relay.py SOCKET REMOTE_URL TOKEN

Serves the agent socket's two methods a `read_issue` agent uses (`session.open`,
`call`) over a real Unix socket with newline-delimited JSON-RPC, and performs
each call as the vault's HTTP executor does: one aiohttp request over a pooled
keep-alive connection to the same fake remote, its JSON answer parsed, a
Result-shaped answer written back. Nothing else: no gate, no sessions to check,
no credential store, no audit log, no catalog, no response contract, no
evidence. Its CPU per call is what asyncio, aiohttp, the two sockets and JSON
cost in this interpreter on this host; `bench/gated_calls.py` prints it beside
the daemon's, so the share of the vault's own work (and what a target below
this floor would ask) is measured rather than guessed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp


async def main(sock_path: str, remote: str, token: str) -> None:
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50, keepalive_timeout=5.0))
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    counter = iter(range(1, 1 << 62))

    async def call(params: dict[str, object]) -> dict[str, object]:
        cid = f"relay-{next(counter)}"
        async with http.get(f"{remote}/v1/issues/{params['issue_id']}",
                            headers={**headers, "X-Correlation-Id": cid}) as response:
            body = await response.json()
        return {"ok": response.status == 200, "category": "success", "operation": "read_issue", "retry": "none",
                "correlation_id": cid, "message": "ok", "data": {"fields": len(body)}}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            msg = json.loads(line)
            if msg["method"] == "session.open":
                result: dict[str, object] = {"session_id": "relay", "pid": os.getpid()}
            else:
                result = await call(msg["params"]["params"])
            writer.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode() + b"\n")
        writer.close()

    server = await asyncio.start_unix_server(serve, sock_path)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
