"""agent_stub's plan files: which operations the stub calls, in order, and how it recovers.

This format is agent_stub's own, not the agent contract: an outside agent
gets its work from the task file's `steps` (docs/agent-contract.md) and never
sees a plan. A plan stands in for what a model would decide. Its steps are
fixed so a scenario is deterministic (the runner gives them to every agent as
the task's steps, `id`, `call` and `params` only); the recovery policy (`safe`
or `naive`) and the options below decide what the stub does after each
Result, which is what the release gate grades.

    agent: stub
    recovery: safe            # safe | naive (see agent_stub.recovery)
    max_retries: 2            # bounded retries for local/confirmed failures
    reserve_s: 0.5            # time kept before the task deadline for verification
    steps:
      - id: create            # name for later references
        call: create_issue
        params: {title: "Flaky login test"}
      - call: attach_note
        params: {issue_id: "${create.id}", text: "triaged"}   # from an earlier result
      - call: read_issue
        params: {issue_id: "${create.id}"}
        verify: true          # may run inside the reserve
    final: "done: filed and triaged"   # the final message when every step succeeded
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vault.catalog import load_yaml_model

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}")


class Step(BaseModel):
    model_config = _Strict
    call: str
    params: dict[str, Any] = Field(default_factory=dict)
    # "auto": a stable key derived from run id + step; a string: used as given;
    # None: the recovery policy decides (safe: stable key; naive: a fresh one)
    idempotency_key: str | None = None
    wait_s: float | None = Field(default=None, ge=0)
    id: str | None = None
    # a verification step may use the reserve kept before the deadline
    verify: bool = False


class Plan(BaseModel):
    model_config = _Strict
    agent: str = "agent_stub"
    recovery: Literal["safe", "naive"] = "safe"
    steps: list[Step] = Field(default_factory=list)
    final: str | None = None
    max_retries: int = Field(default=2, ge=0, le=10)
    reserve_s: float = Field(default=0.5, ge=0)
    # how the safe agent settles an unknown outcome: ask the vault first, or
    # resend with the same idempotency key (only for idempotent operations)
    reconcile: Literal["lookup", "same_key"] = "lookup"
    # how often the safe agent asks again while the remote says "still working"
    lookup_polls: int = Field(default=2, ge=1, le=20)
    # careless-agent behaviour for leak scenarios: print the environment to stderr
    debug_env: bool = False


def load_plan(path: str | Path) -> Plan:
    return load_yaml_model(path, Plan)


def resolve(params: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Replace `${step.field}` with a field of an earlier step's result data."""
    def one(value: Any) -> Any:
        if not isinstance(value, str):
            return value

        def sub(m: re.Match[str]) -> str:
            data = results.get(m.group(1)) or {}
            return str(data.get(m.group(2), "unknown"))
        return REF.sub(sub, value)
    return {k: one(v) for k, v in params.items()}
