"""The evidence a test reads, as typed objects, and failure messages that read like the run report.

    AgentResult  one agent process: exit, final message, output, and the results the
                 vault gave it (from the audit log, not from what the agent says)
    Prompts      the daemon's prompt statistics: count, by scope / operation / risk,
                 decisions, and the fatigue flags (reads prompted, the same scope
                 asked again, session grants covering a destructive operation;
                 further `*fatigue*` fields of the stats are passed through)
    report()     a graded world in the words of `vaultsim run`'s trial line

No secret is ever in these: the runner redacts credentials from the grade, and
the transcript, ledger and stats never hold one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from vault.runner.evidence import AgentRun
from vault.runner.logical import Timeline
from vault.runner.transcript import Entry, Transcript
from vault.runner.trial import TrialResult

FLAGS = ("read_prompts", "repeated_scope_prompts", "destructive_session_grants")


@dataclass(frozen=True)
class Prompts:
    """Prompt statistics of one world (every run id the daemon served, summed)."""

    count: int = 0
    by_scope: dict[str, int] = field(default_factory=dict)
    by_operation: dict[str, int] = field(default_factory=dict)
    by_risk: dict[str, int] = field(default_factory=dict)
    granted: dict[str, int] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    unroutable: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, stats: dict[str, Any]) -> Prompts:
        return cls(count=int(stats.get("prompts", 0)), by_scope=dict(stats.get("scopes_asked") or {}),
                   by_operation=dict(stats.get("by_operation") or {}), by_risk=dict(stats.get("by_risk") or {}),
                   granted=dict(stats.get("scopes_granted") or {}), decisions=dict(stats.get("decisions") or {}),
                   unroutable=int(stats.get("unroutable", 0)), raw=dict(stats))

    @property
    def fatigue(self) -> dict[str, Any]:
        """The fatigue flags: the counters every build has, plus any `*fatigue*` field the daemon's
        stats add (the hook for richer fatigue measures: they appear here when the daemon sends them)."""
        out: dict[str, Any] = {k: self.raw.get(k, 0) for k in FLAGS}
        out.update({k: v for k, v in self.raw.items() if "fatigue" in k})
        return out

    def describe(self) -> str:
        text = f"{self.count} prompt{'s' if self.count != 1 else ''}"
        if self.by_scope:
            text += " (by scope: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.by_scope.items())) + ")"
        # the counters only: the daemon's whole `fatigue` figures (a nested mapping) stay in
        # .fatigue, not in a failure's one-line summary
        flags = {k: v for k, v in self.fatigue.items() if v and isinstance(v, (int, float))}
        if flags:
            text += "; fatigue: " + ", ".join(f"{k}={v}" for k, v in flags.items())
        return text


def _as_is(text: str) -> str:
    return text


@dataclass
class AgentResult:
    """One agent process and what the vault answered it. Its text (final, stdout, stderr) comes
    with every credential value replaced by `[redacted]`, as in `vaultsim run`'s report: a failing
    assertion prints it into CI logs. (`run` keeps the raw record; the leak check reads that.)"""

    run: AgentRun
    results: list[Entry] = field(default_factory=list)
    redact: Callable[[str], str] = field(default=_as_is, repr=False)

    def __repr__(self) -> str:  # pytest shows it when an assertion on it fails: no raw output
        return (f"AgentResult(name={self.run.name!r}, exit_code={self.exit_code}, final={self.final!r}, "
                f"categories={self.categories})")

    @property
    def exit_code(self) -> int | None:
        return self.run.exit_code

    @property
    def final(self) -> str:
        """The agent's final message (its last stdout line)."""
        return self.redact(self.run.final)

    @property
    def stdout(self) -> str:
        return self.redact(self.run.stdout)

    @property
    def stderr(self) -> str:
        return self.redact(self.run.stderr)

    @property
    def killed_at_deadline(self) -> bool:
        return self.run.killed_at_deadline

    @property
    def categories(self) -> list[str]:
        """The category of every result the vault gave this agent, in order (a call that waited
        for a person non-blocking, as every MCP host's does, shows approval_pending first)."""
        return [e.category for e in self.results]

    @property
    def settled(self) -> list[str]:
        """The settled category of each of this agent's calls, in order: a call and the resumes
        that collected it are one, as `vaultsim run` grades them, so a blocking and a non-blocking
        agent read alike (["approval_denied"], not ["approval_pending", "approval_denied"])."""
        return [c.category for c in Timeline.of(Transcript(entries=list(self.results))).calls]


def trace(entries: list[Entry], prompts: int = 0) -> str:
    """`op > category, op > category`: what the vault answered, in order."""
    return ", ".join(f"{e.operation} > {e.category}" for e in entries) or unanswered(prompts)


def unanswered(prompts: int) -> str:
    """An empty transcript in words. It lists answers: a call still waiting for the person when
    the test ended has none, yet it reached the vault (it said "no call reached the vault")."""
    if prompts:
        return (f"no call answered yet ({prompts} put to the person and not answered: still waiting "
                "when the evidence was read)")
    return "no call reached the vault"


def report(result: TrialResult, name: str, extra: list[str] | None = None) -> str:
    """A graded world as `vaultsim run` prints an unexpected trial, plus the evidence behind it."""
    from vault.runner.table import trial_line, why_lines
    t = result.to_dict()
    head = trial_line(1, 1, name, t, detail=False).plain.split("] ", 1)[-1]
    lines = [f"vaultsim: {head.strip()}"]
    lines += [f"  {why}" for why in why_lines(t, limit=10)] if not result.ok else []
    lines += evidence_lines(result)
    lines += [f"  {x}" for x in extra or []]
    return "\n".join(lines)


def evidence_lines(result: TrialResult) -> list[str]:
    """What the vault and the remote saw in one graded trial: effects, prompts by scope, the
    transcript and each agent's end (a fixture's assertion and a scenario item's failure alike)."""
    lines = []
    s = result.summary
    lines.append("  evidence:")
    lines.append("    effects: " + (json.dumps(s.get("effects") or {}, sort_keys=True)))
    prompts = s.get("prompts") or {}
    lines.append(f"    prompts: {prompts.get('total', 0)} (by scope: "
                 f"{json.dumps(prompts.get('by_scope') or {}, sort_keys=True)})")
    shown = [f"{e.get('operation')} > {e.get('category')}" for e in s.get("transcript") or []]
    lines.append("    transcript: " + (", ".join(shown[:12]) or unanswered(int(prompts.get("total") or 0)))
                 + (f", ... ({len(shown)} in all)" if len(shown) > 12 else ""))
    for a in s.get("agents") or []:
        lines.append(f"    agent {a.get('name')}: exit {a.get('exit_code')}, final {a.get('final')!r}")
    return lines
