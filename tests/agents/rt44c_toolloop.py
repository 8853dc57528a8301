"""Red team 44c: an LLM-tool-loop agent, written from docs/agent-contract.md alone (stdlib).

The shape of a function-calling host: a JSON tool schema, a "model" that reads the conversation
and answers with one tool call at a time (arguments as a JSON string), the host executing each
call on the vault socket and feeding the result back as a `tool` message, until the model's
final assistant message, which is printed as the final message (section 7). Every tool result
is logged verbatim to stderr, as hosts log at debug level.

The model here is a planner over the task file: rt44c_lib's Runner, whose every request is a
tool call it waits on (it never touches the socket: the host owns the tools). So the vault sees
a host that holds the connection and session, and a model that is slow to decide between calls.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "vault_rpc", "description": "One request on the vault's agent socket (JSON-RPC method and params).",
        "parameters": {"type": "object", "required": ["method", "params"], "additionalProperties": False,
                       "properties": {"method": {"type": "string", "enum": [
                           "session.open", "call", "call.resume", "lookup", "catalog", "vault.status",
                           "session.close"]},
                                      "params": {"type": "object"}}}}},
]
THINK_S = float(os.environ.get("RT44C_THINK_S", "0.05"))   # the model's time to decide


def debug(*parts: object) -> None:
    print("toolloop DEBUG", *parts, file=sys.stderr, flush=True)


class ToolChannel:
    """What the model holds instead of a socket: each rpc is a tool call the host answers."""

    def __init__(self, outbox: queue.Queue[dict[str, Any]], inbox: queue.Queue[dict[str, Any]],
                 deadline: float) -> None:
        self.outbox, self.inbox, self.deadline = outbox, inbox, deadline
        self.n = 0

    def rpc(self, method: str, **params: Any) -> dict[str, Any]:
        if time.time() > self.deadline - 0.25:
            raise lib.Finish("not done: the deadline came before " + method + " could be sent")
        time.sleep(THINK_S)
        self.n += 1
        call_id = f"call_{self.n:04d}"
        self.outbox.put({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "vault_rpc", "arguments": json.dumps({"method": method, "params": params})}}]})
        reply = self.inbox.get()
        assert reply["tool_call_id"] == call_id
        body = json.loads(reply["content"])
        if "error" in body:
            raise lib.VaultError(str(body["error"].get("message", "error")))
        result: dict[str, Any] = body["result"]
        return result

    def close(self) -> None:
        pass


def model(task: dict[str, Any], outbox: queue.Queue[dict[str, Any]], inbox: queue.Queue[dict[str, Any]]) -> None:
    """The planner: ends the conversation with one assistant message holding the final message."""
    chan = ToolChannel(outbox, inbox, float(task["deadline"]))
    try:
        runner = lib.Runner(task, client="toolloop-host", vault=chan,  # type: ignore[arg-type]
                            blocking=os.environ.get("RT44C_WAIT") != "poll", poll_s=0.4, log=debug)
        text = runner.run_all()
        runner.close()
    except lib.Finish as f:
        text = str(f)
    except Exception as e:  # a model that errs still answers, as hosts surface it
        text = f"not done: the planner failed ({type(e).__name__})"
    outbox.put({"role": "assistant", "content": text})


class Host:
    def __init__(self, task: dict[str, Any]) -> None:
        self.task = task
        self.vault = lib.Vault(os.environ["VAULTSIM_SOCKET"], float(task["deadline"]))
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a release agent. Use only the tools. Tools: " + json.dumps(TOOLS)},
            {"role": "user", "content": json.dumps({"goal": task.get("goal"), "steps": task.get("steps")})},
        ]

    def execute(self, call: dict[str, Any]) -> str:
        fn = call["function"]
        if fn["name"] != "vault_rpc":
            return json.dumps({"error": {"message": f"unknown tool {fn['name']}"}})
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            return json.dumps({"error": {"message": "arguments are not JSON"}})
        if set(args) != {"method", "params"} or not isinstance(args["params"], dict):
            return json.dumps({"error": {"message": "arguments do not match the tool's schema"}})
        try:
            return json.dumps({"result": self.vault.rpc(args["method"], **args["params"])})
        except lib.VaultError as e:
            return json.dumps({"error": {"message": str(e)}})

    def loop(self) -> str:
        outbox: queue.Queue[dict[str, Any]] = queue.Queue()
        inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        t = threading.Thread(target=model, args=(self.task, outbox, inbox), daemon=True)
        t.start()
        while True:
            msg = outbox.get()
            self.messages.append(msg)
            if not msg.get("tool_calls"):
                t.join()
                return str(msg.get("content") or "not done: the model said nothing")
            for call in msg["tool_calls"]:
                try:
                    content = self.execute(call)
                except lib.Finish as f:  # the connection went away: the model is told so
                    content = json.dumps({"error": {"message": str(f)}})
                debug("tool result", call["id"], content)
                tool_msg = {"role": "tool", "tool_call_id": call["id"], "content": content}
                self.messages.append(tool_msg)
                inbox.put(tool_msg)


def main() -> int:
    task = lib.load_task()
    host = Host(task)
    final = host.loop()
    debug(f"conversation: {len(host.messages)} messages")
    host.vault.close()
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
