"""Red team 44c: an agent whose only channel is `vaultsim mcp`, through the official `mcp` SDK.

Written from docs/agent-contract.md and the README's MCP section alone. It starts the bridge
itself over stdio (`mcp.client.stdio.stdio_client`, handing it this process's environment, as the
README says a host under `vaultsim run` must), runs the MCP session on an asyncio loop in a thread
of its own, and drives rt44c_lib's step rules from the main thread: each vault request becomes a
tool call (the operation's own tool, `vault_resume`, `vault_lookup`), with a progress callback and
a per-call read timeout longer than the wait it asks for (seconds as a float: the 2.x SDK). At start it reads what a host reads: the
tool list, the `vault://catalog` resource and the `vault-rules` prompt. The bridge holds the vault
session (one per MCP session); the Result is each answer's structured content (else its text).
`vault.status` has no tool: an answer `vault_locked` stops the task (section 4 allows stopping).
Needs an interpreter with the `mcp` SDK (run it with the venv's python).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import threading
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402


def bridge_program() -> list[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "vaultsim")
    return [beside] if os.path.exists(beside) else [shutil.which("vaultsim") or "vaultsim"]


class McpChannel:
    """What rt44c_lib's Runner holds as its vault: requests as MCP tool calls."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.done: asyncio.Event | None = None
        self.session: ClientSession | None = None
        self.failure: BaseException | None = None
        self.tools: set[str] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.main = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        self.ready.wait(timeout=max(0.5, deadline - 1.5 - __import__("time").time()))
        if self.session is None:              # not up in time: it must not outlive us either
            _kill_children()
            self.main.cancel()
            raise lib.Finish(f"not done: the MCP bridge did not start ({self.failure!r})")

    async def _serve(self) -> None:
        prog = bridge_program()
        params = StdioServerParameters(command=prog[0], args=[*prog[1:], "mcp"], env=dict(os.environ))
        self.done = asyncio.Event()
        try:
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=120.0) as s:
                    init = await s.initialize()
                    listed = await s.list_tools()
                    self.tools = {t.name for t in listed.tools}
                    rules = await s.get_prompt("vault-rules")
                    res = await s.read_resource("vault://catalog")   # type: ignore[arg-type]
                    info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
                    print(f"mcp: server {getattr(info, 'name', '?')}, {len(self.tools)} tools, "
                          f"{len(rules.messages)} rule messages, catalog {len(str(res.contents))} chars",
                          file=sys.stderr, flush=True)
                    self.session = s
                    self.ready.set()
                    await self.done.wait()
        except BaseException as e:  # noqa: BLE001  (reported through the Runner)
            import traceback
            traceback.print_exception(e, file=sys.stderr)
            self.failure = e
            self.ready.set()

    async def _tool(self, name: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.session is not None

        async def progress(p: float, total: float | None, message: str | None) -> None:
            print(f"mcp: progress on {name}: {message or p}", file=sys.stderr, flush=True)

        out = await self.session.call_tool(name, args, read_timeout_seconds=timeout,
                                           progress_callback=progress)
        doc = getattr(out, "structured_content", None) or getattr(out, "structuredContent", None)
        if not isinstance(doc, dict):
            text = "".join(getattr(c, "text", "") for c in out.content)
            doc = json.loads(text)
        return dict(doc)

    def rpc(self, method: str, **params: Any) -> dict[str, Any]:
        import time
        if time.time() > self.deadline - 0.25:
            raise lib.Finish("not done: the deadline came before " + method + " could be sent")
        if method == "session.open":
            return {"session_id": "mcp"}          # the bridge's own, opened at the handshake
        if method == "session.close":
            return {}
        if method == "vault.status":
            raise lib.Finish("not done: the vault is locked; nothing was sent")
        params.pop("session_id", None)
        wait = float(params.get("wait_s") or 0)
        if method == "call":
            name = params.pop("operation")
            args = {**params.pop("params"), **params}
        elif method == "call.resume":
            name, args = "vault_resume", params
        elif method == "lookup":
            name, args = "vault_lookup", {k: v for k, v in params.items() if v is not None}
        else:
            raise lib.VaultError(f"no tool for {method}")
        fut = asyncio.run_coroutine_threadsafe(self._tool(name, args, wait + 30), self.loop)
        return fut.result()

    def close(self) -> None:
        import time
        if self.done is not None:
            self.loop.call_soon_threadsafe(self.done.set)
        try:
            self.main.result(timeout=max(0.1, self.deadline - time.time() - 0.6))
        except Exception:  # noqa: BLE001  (the bridge is gone either way)
            _kill_children()           # still ending at our deadline: it must not outlive us
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=2)


def _kill_children() -> None:
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == me:
                os.kill(int(pid), 9)
        except (OSError, ValueError, IndexError):
            pass


def main() -> int:
    task = lib.load_task()
    chan: McpChannel | None = None
    try:
        chan = McpChannel(float(task["deadline"]))
        # the bridge is a child that must end before we do: stop waiting 3 s before the deadline
        # (an approval given later is no longer ours to collect, section 7) and keep that for
        # the bridge's exit, which takes seconds on a loaded host
        runner = lib.Runner(task, client="rt44c-mcp", vault=chan, margin=2.6)  # type: ignore[arg-type]
        final = runner.run_all()
    except lib.Finish as f:
        final = str(f)
    if chan is not None:
        chan.close()                              # the bridge exits once its stdin closes
    print(final, flush=True)
    sys.stderr.flush()
    # the SDK's loop thread and anyio's helpers make the interpreter's teardown slow on a loaded
    # host (seconds at load 20+): nothing is left to write, so leave at once
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
