"""Prompt statistics: what the approvals cost, per run and per session.

Counted here, at the gate, not reported by agents: prompts by operation, risk
and scope (asked and granted), decisions, time to decision, prompts repeated
for a scope already granted in the run, prompts for reads, and session grants
whose scope covers a destructive operation.

Bounded, so a daemon that serves runs for months holds no more than this:

* the newest ``MAX_RUNS`` runs (by last activity) and ``MAX_SESSIONS``
  sessions; an older run's final counts go to `archive` (the daemon writes
  them to the audit log as a ``prompt_stats`` event, see ``vaultsim audit
  show``) and leave memory. The runner reads a run's counts as soon as its
  agents exit, long before that;
* ``MAX_KEYS`` distinct operations or scopes per counter: further ones are
  counted under ``OTHER`` (an agent choosing a new target each call cannot grow
  the table), and as many granted scopes per run for repeat detection;
* time to decision: count and max exact, p50 over the newest ``MAX_SAMPLES``;
* fatigue (`vault.gate.fatigue`): computed over the newest ``MAX_SAMPLES``
  prompts' timings (asked, shown, detail viewed, decided, by whom).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vault.catalog import DESTRUCTIVE, Risk
from vault.gate.fatigue import DEFAULT_RUBBER_STAMP_S, PromptTiming, signals

DEFAULT_RUN = "default"
MAX_RUNS = 1024
MAX_SESSIONS = 8192
MAX_KEYS = 256
MAX_SAMPLES = 1000
OTHER = "(other)"

log = logging.getLogger("vaultsim.daemon")


def _bump(counter: Counter[str], key: str) -> None:
    counter[key if key in counter or len(counter) < MAX_KEYS else OTHER] += 1


@dataclass
class _Counts:
    prompts: int = 0
    by_operation: Counter[str] = field(default_factory=Counter)
    by_risk: Counter[str] = field(default_factory=Counter)
    scopes_asked: Counter[str] = field(default_factory=Counter)
    scopes_granted: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    decision_ms: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    decided: int = 0
    slowest_ms: float | None = None
    repeated_scope_prompts: int = 0
    read_prompts: int = 0
    destructive_session_grants: int = 0
    unroutable: int = 0
    locked_refusals: int = 0
    timings: deque[PromptTiming] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def to_wire(self, rubber_stamp_s: float | None = DEFAULT_RUBBER_STAMP_S) -> dict[str, Any]:
        """The counts; with `rubber_stamp_s` (runs, not sessions: fatigue is a person's, over a
        run) the fatigue figures too."""
        ms = sorted(self.decision_ms)
        out = {
            "prompts": self.prompts,
            "by_operation": dict(self.by_operation),
            "by_risk": dict(self.by_risk),
            "scopes_asked": dict(self.scopes_asked),
            "scopes_granted": dict(self.scopes_granted),
            "decisions": dict(self.decisions),
            "time_to_decision_ms": {
                "count": self.decided,
                "p50": ms[len(ms) // 2] if ms else None,
                "max": self.slowest_ms,
            },
            "repeated_scope_prompts": self.repeated_scope_prompts,
            "read_prompts": self.read_prompts,
            "destructive_session_grants": self.destructive_session_grants,
            "unroutable": self.unroutable,
            "locked_refusals": self.locked_refusals,
        }
        if rubber_stamp_s is not None:
            out["fatigue"] = signals(self.timings, rubber_stamp_s=rubber_stamp_s,
                                     session_grants_destructive=self.destructive_session_grants)
        return out


class PromptStats:
    def __init__(self, archive: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.runs: OrderedDict[str, _Counts] = OrderedDict()  # least recently active first
        self.sessions: OrderedDict[str, _Counts] = OrderedDict()
        self.session_run: dict[str, str] = {}
        # scopes granted so far in each run: a later prompt for one is a repeat
        self._granted_in_run: dict[str, set[str]] = {}
        # called with (run_id, its counts) when a run leaves memory; set by the daemon
        self.archive = archive

    def _both(self, run_id: str | None, session_id: str) -> tuple[_Counts, _Counts]:
        run = run_id or DEFAULT_RUN
        counts = self.runs.get(run)
        if counts is None:
            counts = self.runs[run] = _Counts()
            while len(self.runs) > MAX_RUNS:
                self._evict_run()
        else:
            self.runs.move_to_end(run)
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = _Counts()
            self.session_run[session_id] = run
            while len(self.sessions) > MAX_SESSIONS:
                old, _ = self.sessions.popitem(last=False)
                self.session_run.pop(old, None)
        else:
            self.sessions.move_to_end(session_id)
        return counts, session

    def _evict_run(self) -> None:
        run, counts = self.runs.popitem(last=False)
        self._granted_in_run.pop(run, None)
        for sid in [s for s, r in self.session_run.items() if r == run]:
            self.sessions.pop(sid, None)
            del self.session_run[sid]
        if self.archive is not None:
            try:
                self.archive(run, counts.to_wire())
            except Exception as exc:  # the audit log refuses: the counts are lost, the gate goes on
                log.error("could not archive the prompt statistics of a run: %s", type(exc).__name__)

    def prompt(self, run_id: str | None, session_id: str, operation: str, risk: Risk, scope: str,
               timing: PromptTiming | None = None) -> bool:
        """Count a prompt shown; returns True if it repeats a scope already granted. `timing` is
        kept (the gate fills in shown, detail and decided on the same object) for the fatigue figures."""
        repeat = scope in self._granted_in_run.get(run_id or DEFAULT_RUN, set())
        for c in self._both(run_id, session_id):
            if timing is not None:
                c.timings.append(timing)
            c.prompts += 1
            _bump(c.by_operation, operation)
            _bump(c.by_risk, str(risk))
            _bump(c.scopes_asked, scope)
            if risk is Risk.read:
                c.read_prompts += 1
            if repeat:
                c.repeated_scope_prompts += 1
        return repeat

    def decision(self, run_id: str | None, session_id: str, decision: str, elapsed_s: float | None) -> None:
        for c in self._both(run_id, session_id):
            _bump(c.decisions, decision)
            if elapsed_s is not None:
                ms = round(elapsed_s * 1000, 3)
                c.decision_ms.append(ms)
                c.decided += 1
                c.slowest_ms = ms if c.slowest_ms is None else max(c.slowest_ms, ms)

    def granted(self, run_id: str | None, session_id: str, scope: str, risk: Risk, session_grant: bool) -> None:
        counts = self._both(run_id, session_id)
        scopes = self._granted_in_run.setdefault(run_id or DEFAULT_RUN, set())
        if len(scopes) < MAX_KEYS * 16:
            scopes.add(scope)
        for c in counts:
            _bump(c.scopes_granted, scope)
            if session_grant and risk in DESTRUCTIVE:
                c.destructive_session_grants += 1

    def unroutable(self, run_id: str | None, session_id: str) -> None:
        for c in self._both(run_id, session_id):
            c.unroutable += 1

    def locked(self, run_id: str | None, session_id: str) -> None:
        for c in self._both(run_id, session_id):
            c.locked_refusals += 1

    def report(self, run_id: str | None = None, rubber_stamp_s: float = DEFAULT_RUBBER_STAMP_S) -> dict[str, Any]:
        runs = {r: c for r, c in self.runs.items() if run_id is None or r == run_id}
        return {
            "runs": {r: c.to_wire(rubber_stamp_s) for r, c in runs.items()},
            "sessions": {s: {"run_id": self.session_run.get(s), **c.to_wire(None)}
                         for s, c in self.sessions.items()
                         if run_id is None or self.session_run.get(s) == run_id},
        }
