"""Plan files: which operations the stub agent calls, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vault.catalog import load_yaml_model

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class Step(BaseModel):
    model_config = _Strict
    call: str
    params: dict[str, Any] = Field(default_factory=dict)
    # "auto": a stable key derived from run id + step; a string: used as given; None: no key
    idempotency_key: str | None = None
    wait_s: float | None = None


class Plan(BaseModel):
    model_config = _Strict
    agent: str = "agent_stub"
    recovery: Literal["safe", "naive"] = "safe"
    steps: list[Step] = Field(default_factory=list)
    final: str | None = None


def load_plan(path: str | Path) -> Plan:
    return load_yaml_model(path, Plan)
