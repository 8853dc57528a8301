#!/usr/bin/env python3
"""Red team 43c: an asyncio agent written from docs/agent-contract.md alone (stdlib).

One session per process (section 3), opened on the first of three connections; the process's other
connections present the same session id (the session is the process's, checked per message). The
first connection stays open to the end: the session ends when it closes. Independent steps run as
concurrent tasks, each request on the next connection, several in flight per connection (the
contract matches answers by id and allows 64 in progress on one connection); gated steps one at a
time in order, and a step naming `${ID.FIELD}` once step ID is done (rt43c_core.Plan).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt43c_core as core  # noqa: E402

CONNECTIONS = 3
ids = itertools.count(1)


class AsyncWire:
    def __init__(self, task: dict[str, Any]) -> None:
        self.task = task
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None

    async def open(self, path: str) -> None:
        pause = 0.05
        while True:
            try:
                reader, self.writer = await asyncio.open_unix_connection(path, limit=2 << 20)
                break
            except OSError as e:
                # a full accept queue: back off and try again within the deadline
                if e.errno not in (errno.EAGAIN, errno.ECONNREFUSED) or pause > core.left(self.task):
                    raise
                await asyncio.sleep(pause)
                pause = min(2 * pause, 0.5)
        self.reader_task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                fut = self.pending.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (OSError, asyncio.IncompleteReadError):
            pass
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the vault closed the connection"))
        self.pending.clear()

    async def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if float(self.task["deadline"]) - time.time() < 0.3:
            raise core.TooLate(method)
        assert self.writer is not None
        rid = next(ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self.writer.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                       "params": params}) + "\n").encode())
        await self.writer.drain()
        ans = await fut
        if "error" in ans:
            raise core.RpcError(str(ans["error"].get("message", ""))[:160])
        res: dict[str, Any] = ans.get("result") or {}
        return res

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        if self.reader_task is not None:
            await asyncio.gather(self.reader_task, return_exceptions=True)


async def run_flow(flow: core.Flow, wires: list[AsyncWire], sid: str, store: core.Store,
                   task: dict[str, Any]) -> tuple[str, Any]:
    rr = itertools.cycle(wires)
    answer: Any = None
    error: BaseException | None = None
    try:
        while True:
            op = flow.throw(error) if error is not None else flow.send(answer)
            answer, error = None, None
            try:
                if op[0] == "send":
                    answer = await next(rr).rpc(op[1], {"session_id": sid, **op[2]})
                    core.log(op[1], answer.get("operation", ""), answer.get("category", ""),
                             answer.get("reconciled", ""))
                elif op[0] == "send_plain":
                    answer = await wires[0].rpc(op[1], op[2])
                elif op[0] == "sleep":
                    await asyncio.sleep(max(0.0, min(float(op[1]), core.left(task) + core.MARGIN - 0.3)))
                elif op[0] == "save":
                    store.put(op[1])
            except core.RpcError as e:
                error = e
    except StopIteration as stop:
        return tuple(stop.value)  # type: ignore[return-value]
    except core.RpcError as e:
        return ("failed", f"the vault refused it: {e}")
    except core.TooLate:
        return ("failed", "the deadline came first")
    except OSError as e:
        return ("stop", f"the connection to the vault failed: {e}")


async def main() -> int:
    task = core.load_task()
    store = core.Store(task["state_dir"])
    path = os.environ["VAULTSIM_SOCKET"]
    wires = [AsyncWire(task) for _ in range(CONNECTIONS)]
    try:
        await asyncio.gather(*(w.open(path) for w in wires))
        opened = await wires[0].rpc("session.open", {"agent": task["agent"], "run_id": task["run_id"],
                                                     "client": {"name": "rt43c-async"}})
    except (OSError, core.RpcError, core.TooLate) as e:
        print(f"not done: cannot reach the vault ({e})", flush=True)
        return 0
    sid = str(opened["session_id"])
    try:
        gated = core.gated_ops_from(await wires[1].rpc("catalog", {}))
    except (core.RpcError, OSError):
        gated = None
    plan = core.Plan(task, store, gated)
    running: dict[asyncio.Task[tuple[str, Any]], tuple[dict[str, Any], dict[str, Any]]] = {}
    while True:
        for step, params, rec in plan.ready():
            t = asyncio.create_task(run_flow(core.step_flow(task, step, params, rec), wires, sid, store, task))
            running[t] = (step, rec)
        if not running:
            break
        finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for t in finished:
            step, rec = running.pop(t)
            out = t.result()
            core.record_outcome(store, rec, out)
            plan.finish(step["id"], out)
    print(plan.message(), flush=True)
    try:
        await wires[0].rpc("session.close", {"session_id": sid})
    except Exception:
        pass
    for w in reversed(wires):
        await w.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
