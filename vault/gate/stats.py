"""Prompt statistics: what the approvals cost, per run and per session.

Counted here, at the gate, not reported by agents: prompts by operation, risk
and scope (asked and granted), decisions, time to decision, prompts repeated
for a scope already granted in the run, prompts for reads, and session grants
whose scope covers a destructive operation.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..catalog import DESTRUCTIVE, Risk

DEFAULT_RUN = "default"


@dataclass
class _Counts:
    prompts: int = 0
    by_operation: Counter[str] = field(default_factory=Counter)
    by_risk: Counter[str] = field(default_factory=Counter)
    scopes_asked: Counter[str] = field(default_factory=Counter)
    scopes_granted: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    decision_ms: list[float] = field(default_factory=list)
    repeated_scope_prompts: int = 0
    read_prompts: int = 0
    destructive_session_grants: int = 0
    unroutable: int = 0
    locked_refusals: int = 0

    def to_wire(self) -> dict[str, Any]:
        ms = sorted(self.decision_ms)
        return {
            "prompts": self.prompts,
            "by_operation": dict(self.by_operation),
            "by_risk": dict(self.by_risk),
            "scopes_asked": dict(self.scopes_asked),
            "scopes_granted": dict(self.scopes_granted),
            "decisions": dict(self.decisions),
            "time_to_decision_ms": {
                "count": len(ms),
                "p50": ms[len(ms) // 2] if ms else None,
                "max": ms[-1] if ms else None,
            },
            "repeated_scope_prompts": self.repeated_scope_prompts,
            "read_prompts": self.read_prompts,
            "destructive_session_grants": self.destructive_session_grants,
            "unroutable": self.unroutable,
            "locked_refusals": self.locked_refusals,
        }


class PromptStats:
    def __init__(self) -> None:
        self.runs: dict[str, _Counts] = {}
        self.sessions: dict[str, _Counts] = {}
        self.session_run: dict[str, str] = {}
        # scopes granted so far in each run: a later prompt for one is a repeat
        self._granted_in_run: dict[str, set[str]] = {}

    def _both(self, run_id: str | None, session_id: str) -> tuple[_Counts, _Counts]:
        run = run_id or DEFAULT_RUN
        self.session_run[session_id] = run
        return (self.runs.setdefault(run, _Counts()), self.sessions.setdefault(session_id, _Counts()))

    def prompt(self, run_id: str | None, session_id: str, operation: str, risk: Risk, scope: str) -> bool:
        """Count a prompt shown; returns True if it repeats a scope already granted."""
        repeat = scope in self._granted_in_run.get(run_id or DEFAULT_RUN, set())
        for c in self._both(run_id, session_id):
            c.prompts += 1
            c.by_operation[operation] += 1
            c.by_risk[str(risk)] += 1
            c.scopes_asked[scope] += 1
            if risk is Risk.read:
                c.read_prompts += 1
            if repeat:
                c.repeated_scope_prompts += 1
        return repeat

    def decision(self, run_id: str | None, session_id: str, decision: str, elapsed_s: float | None) -> None:
        for c in self._both(run_id, session_id):
            c.decisions[decision] += 1
            if elapsed_s is not None:
                c.decision_ms.append(round(elapsed_s * 1000, 3))

    def granted(self, run_id: str | None, session_id: str, scope: str, risk: Risk, session_grant: bool) -> None:
        self._granted_in_run.setdefault(run_id or DEFAULT_RUN, set()).add(scope)
        for c in self._both(run_id, session_id):
            c.scopes_granted[scope] += 1
            if session_grant and risk in DESTRUCTIVE:
                c.destructive_session_grants += 1

    def unroutable(self, run_id: str | None, session_id: str) -> None:
        for c in self._both(run_id, session_id):
            c.unroutable += 1

    def locked(self, run_id: str | None, session_id: str) -> None:
        for c in self._both(run_id, session_id):
            c.locked_refusals += 1

    def report(self, run_id: str | None = None) -> dict[str, Any]:
        runs = {r: c for r, c in self.runs.items() if run_id is None or r == run_id}
        return {
            "runs": {r: c.to_wire() for r, c in runs.items()},
            "sessions": {s: {"run_id": self.session_run.get(s), **c.to_wire()}
                         for s, c in self.sessions.items()
                         if run_id is None or self.session_run.get(s) == run_id},
        }
