"""Approval policy: which operations prompt, how often, who decides, how long.

Resolution is field by field: an operation's own rule, then its risk class's
rule, then the default. A bad file is rejected naming the file, field and why.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from vault.catalog import Operation, Risk, load_yaml_model
from vault.resources import DEFAULT_POLICY

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class Mode(StrEnum):
    auto = "auto"
    session = "session"
    per_call = "per_call"
    deny = "deny"


class RuleSpec(BaseModel):
    model_config = _Strict
    mode: Mode | None = None
    deadline_s: float | None = Field(default=None, gt=0, le=86400)
    owner: str | None = None
    ttl_s: float | None = Field(default=None, gt=0)


class Rule(BaseModel):
    """The effective rule for one operation."""

    model_config = _Strict
    mode: Mode
    deadline_s: float = 120.0
    owner: str | None = None
    ttl_s: float | None = None


class Policy(BaseModel):
    model_config = _Strict
    default: RuleSpec = RuleSpec(mode=Mode.per_call)
    risks: dict[Risk, RuleSpec] = Field(default_factory=dict)
    operations: dict[str, RuleSpec] = Field(default_factory=dict)

    def rule_for(self, op: Operation) -> Rule:
        merged: dict[str, object] = {"mode": Mode.per_call, "deadline_s": 120.0}
        for spec in (self.default, self.risks.get(op.risk), self.operations.get(op.name)):
            if spec is not None:
                merged.update(spec.model_dump(exclude_none=True))
        return Rule.model_validate(merged)


def load_policy(path: str | Path | None = None) -> Policy:
    policy: Policy = load_yaml_model(path or DEFAULT_POLICY, Policy)
    return policy
