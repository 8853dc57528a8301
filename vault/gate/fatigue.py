"""Approval fatigue: what the prompts cost the person who answered them.

Prompt counts are the agent's side. This module is the person's side: how
fast the prompts came, how long each decision took after the prompt was in
front of someone, and whether it was read at all. One pure function
(`signals`) turns a list of `PromptTiming` records into the figures, so the
daemon (`stats`, from memory), the runner (from the audit log, with the
scenario's threshold) and the TUI meter all compute them the same way.

    signal                     meaning
    -------------------------  ------------------------------------------------
    per_minute.peak            most prompts asked within any 60 s window
    per_minute.mean            prompts / the minutes between the first and the
                               last one (at least one minute)
    latency_s.p50 / .p90       decided - shown, over decisions made by a person
                               or a script (shown: when the approver reported
                               the prompt visible, else when it was sent)
    rubber_stamps              approvals decided within `rubber_stamp_s` of
                               being shown (default 1 s), or without the
                               detail ever being viewed
    detail_not_viewed          decisions taken without the detail opened
    longest_approval_streak    most approvals in a row, in decision order
    reasked_after_denial       prompts for a scope a person had already denied
                               in the same run
    read_prompts               prompts for `read` operations
    session_grants_destructive session grants covering a destructive risk class

`by_approver` repeats the figures per approver name (over the prompts each
decided), because fatigue is felt by one person, not by a run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable

from vault.lookalike import skeletons

DEFAULT_RUBBER_STAMP_S = 1.0
WINDOW_S = 60.0
MAX_APPROVERS = 32
APPROVALS = frozenset({"allow_once", "allow_session"})
DESTRUCTIVE_RISKS = frozenset({"delete", "execute", "spend", "permission", "credential"})


BOOT_CLOCK: Callable[[], float] = partial(time.clock_gettime, time.CLOCK_BOOTTIME)


class SteadyWall:
    """Seconds since the epoch that a stepped wall clock does not move: the wall time read at
    the first stamp, plus the steady clock's advance since (module doc)."""

    def __init__(self, wall: Callable[[], float] = time.time, steady: Callable[[], float] = BOOT_CLOCK) -> None:
        self.wall, self.steady = wall, steady
        self._offset: float | None = None

    def __call__(self) -> float:
        now = self.steady()
        if self._offset is None:
            self._offset = self.wall() - now
        return now + self._offset


@dataclass
class PromptTiming:
    """One prompt, from asked to decided. Times are the vault's `SteadyWall` stamps (seconds
    since the epoch, as read at the vault's first stamp)."""

    request_id: str
    operation: str
    risk: str
    scope: str
    session_id: str | None
    asked: float
    shown: float | None = None  # the approver reported the prompt visible (TUI row, script receipt)
    detail: float | None = None  # the approver reported its detail opened
    decided: float | None = None
    decision: str | None = None  # allow_once | allow_session | deny | expired | locked | ...
    approver: str | None = None
    reason: str | None = None

    @property
    def human(self) -> bool:
        """Decided by an approver (not by a deadline, a lock or the vault)."""
        return self.decision in APPROVALS or (self.decision == "deny" and self.approver is not None)

    @property
    def latency(self) -> float | None:
        if not self.human or self.decided is None:
            return None
        return max(0.0, self.decided - (self.shown if self.shown is not None else self.asked))

    def rubber_stamp(self, threshold_s: float) -> bool:
        if self.decision not in APPROVALS:
            return False
        latency = self.latency
        return self.detail is None or (latency is not None and latency < threshold_s)

    def to_wire(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "PromptTiming":
        def num(key: str) -> float | None:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def text(key: str) -> str | None:
            v = d.get(key)
            return str(v) if v is not None else None

        return cls(request_id=str(d.get("request_id") or ""), operation=str(d.get("operation") or ""),
                   risk=str(d.get("risk") or ""), scope=str(d.get("scope") or ""),
                   session_id=text("session_id"), asked=num("asked") or 0.0, shown=num("shown"),
                   detail=num("detail"), decided=num("decided"), decision=text("decision"),
                   approver=text("approver"), reason=text("reason"))


def _quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (a figure a person can find in the list)."""
    if not values:
        return None
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, int(round(q * len(ordered) + 0.5)) - 1))
    return round(ordered[index], 3)


def peak_per_window(times: Iterable[float], window_s: float = WINDOW_S) -> int:
    """Most events within any `window_s` seconds (a sliding window over sorted times)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while t - ordered[start] >= window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def _figures(prompts: list[PromptTiming], threshold_s: float) -> dict[str, Any]:
    asked = sorted(p.asked for p in prompts)
    span_min = max(1.0, (asked[-1] - asked[0]) / WINDOW_S) if asked else 1.0
    latencies = [lat for p in prompts if (lat := p.latency) is not None]
    decided = sorted((p for p in prompts if p.human and p.decided is not None), key=lambda p: p.decided or 0.0)
    streak = best = 0
    for p in decided:
        streak = streak + 1 if p.decision in APPROVALS else 0
        best = max(best, streak)
    denied: set[str] = set()
    reasked = 0
    for p in sorted(prompts, key=lambda p: p.asked):
        # as a person reads it: `release REL-1` after `release rel-1` was denied is asked again
        read = skeletons(p.scope)
        if read & denied:
            reasked += 1
        if p.decision == "deny" and p.human and p.decided is not None:
            denied |= read
    return {
        "prompts": len(prompts),
        "per_minute": {"peak": peak_per_window(asked), "mean": round(len(asked) / span_min, 2) if asked else 0.0},
        "latency_s": {"count": len(latencies), "p50": _quantile(latencies, 0.5), "p90": _quantile(latencies, 0.9)},
        "rubber_stamps": sum(p.rubber_stamp(threshold_s) for p in prompts),
        "detail_not_viewed": sum(1 for p in prompts if p.human and p.detail is None),
        "longest_approval_streak": best,
        "reasked_after_denial": reasked,
        "read_prompts": sum(1 for p in prompts if p.risk == "read"),
        "denied_with_reason": sum(1 for p in prompts if p.decision == "deny" and p.reason),
    }


def signals(prompts: Iterable[PromptTiming], *, rubber_stamp_s: float = DEFAULT_RUBBER_STAMP_S,
            session_grants_destructive: int = 0) -> dict[str, Any]:
    """The fatigue figures of a run (see the module docstring), with a per-approver breakdown."""
    items = list(prompts)
    out = _figures(items, rubber_stamp_s)
    out["rubber_stamp_s"] = rubber_stamp_s
    out["session_grants_destructive"] = session_grants_destructive
    by: dict[str, list[PromptTiming]] = {}
    for p in items:
        if p.approver is not None and p.human:
            by.setdefault(p.approver, []).append(p)
    # names are the approvers' own: the busiest MAX_APPROVERS are shown, so the table stays small
    busiest = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:MAX_APPROVERS]
    out["by_approver"] = {name: _figures(ps, rubber_stamp_s) for name, ps in sorted(busiest)}
    return out


def destructive_session_grants(prompts: Iterable[PromptTiming]) -> int:
    return sum(1 for p in prompts if p.decision == "allow_session" and p.risk in DESTRUCTIVE_RISKS)
