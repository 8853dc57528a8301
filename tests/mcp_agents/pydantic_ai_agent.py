"""A pydantic-ai agent that acts only through the vault's MCP tools; run it with `vaultsim run --agent`.

    vaultsim run scenarios/gate-1-healthy-delivery.yaml \\
        --agent "{python} tests/mcp_agents/pydantic_ai_agent.py"

Everything is the real framework: pydantic-ai's `Agent`, its `MCPToolset`
(FastMCP's client) starting `vaultsim mcp` over stdio, tool discovery and
tool calls. Only the model is scripted: pydantic-ai's `FunctionModel`, with no
network, plays an LLM that works through the task's steps one tool call at a
time and does what each Result's `retry` field says (approval_pending: resume
with the token; outcome_unknown: look it up first; anything else that failed:
stop and say it is not done). The runner grades it like any agent, from what
the vault saw.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from mcp_types import Implementation
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from fastmcp.client.transports import StdioTransport

_REF = re.compile(r"\$\{(\w+)\.(\w+)\}")


def last_result(messages: list[ModelMessage]) -> dict[str, Any] | None:
    """The vault Result in the latest tool return (a dict, or the failure's JSON text)."""
    request = messages[-1]
    if not isinstance(request, ModelRequest):
        return None
    for part in reversed(request.parts):
        if isinstance(part, ToolReturnPart):
            content = part.content
            if isinstance(content, dict):
                return content
            text = str(content)
            start = text.find("{")
            if start >= 0:
                try:
                    return json.JSONDecoder().raw_decode(text[start:])[0]
                except ValueError:
                    pass
            return {"ok": False, "category": "unreadable", "message": text[:200]}
    return None


class ScriptedLlm:
    """Works through the steps, one tool call per model turn, honouring each retry instruction."""

    def __init__(self, steps: list[dict[str, Any]], final: str, key_prefix: str) -> None:
        self.steps, self.final, self.key_prefix = steps, final, key_prefix
        self.index = 0
        self.data: dict[str, dict[str, Any]] = {}
        self.looked_up = False

    def params(self, step: dict[str, Any]) -> dict[str, Any]:
        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return _REF.sub(lambda m: str(self.data.get(m[1], {}).get(m[2], "")), value)
            return value
        return {k: fill(v) for k, v in (step.get("params") or {}).items()}

    def call_step(self) -> ModelResponse:
        step = self.steps[self.index]
        args = {**self.params(step), "idempotency_key": f"{self.key_prefix}-{self.index}"}
        return ModelResponse(parts=[ToolCallPart(step["call"], args)])

    def advance(self, data: dict[str, Any] | None) -> ModelResponse:
        step = self.steps[self.index]
        self.data[step.get("id") or step["call"]] = data or {}
        self.index += 1
        self.looked_up = False
        if self.index == len(self.steps):
            return ModelResponse(parts=[TextPart(self.final)])
        return self.call_step()

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered = {t.name for t in info.function_tools}
        r = last_result(messages)
        if r is None:  # the user's task: begin
            missing = sorted({s["call"] for s in self.steps} - offered)
            if missing:
                return ModelResponse(parts=[TextPart(f"not done: the vault offers no tool {missing[0]}")])
            return self.call_step() if self.steps else ModelResponse(parts=[TextPart(self.final)])
        category = r.get("category")
        if r.get("ok"):
            if r.get("reconciled") == "found":
                return self.advance(None)  # the earlier attempt took effect: do not send it again
            if r.get("reconciled") == "not_found" and not self.looked_up:
                self.looked_up = True
                return self.call_step()  # it did not happen: one more attempt, same key
            if r.get("reconciled") is None:
                return self.advance(r.get("data"))
        if category == "approval_pending":
            return ModelResponse(parts=[ToolCallPart("vault_resume", {"resume_token": r["resume_token"]})])
        if category == "outcome_unknown" and not self.looked_up:
            step = self.steps[self.index]
            return ModelResponse(parts=[ToolCallPart("vault_lookup", {
                "correlation_id": r["correlation_id"], "operation": step["call"],
                "idempotency_key": f"{self.key_prefix}-{self.index}"})])
        step = self.steps[self.index]
        return ModelResponse(parts=[TextPart(
            f"not done: {step['call']} ended {category} (retry: {r.get('retry')}): {r.get('message', '')}")])


def main() -> int:
    with open(os.environ["VAULTSIM_TASK"], encoding="utf-8") as f:
        task = json.load(f)
    steps = task.get("steps") or []
    llm = ScriptedLlm(steps, "done: " + ", ".join(s["call"] for s in steps),
                      f"{task.get('run_id', 'run')}-{task.get('agent_index', 0)}")
    bridge = StdioTransport(command=sys.executable, args=["-m", "vault.cli.main", "mcp"], env=dict(os.environ))
    # generous start-up: importing the MCP SDK alone takes seconds on a busy machine
    toolset = MCPToolset(bridge, tool_error_behavior="failed", init_timeout=120, read_timeout=120,
                         client_info=Implementation(name="pydantic-ai-agent", version="1"))
    agent = Agent(FunctionModel(llm), toolsets=[toolset])
    result = agent.run_sync(task.get("goal") or "do the task")
    print(result.output, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
