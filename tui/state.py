"""What the approver sees, as plain data, built only from what the daemon says.

Kept apart from the widgets so it can be fed recorded notifications (snapshot
tests, the latency bench) and checked without a terminal. Everything here came
over the approver socket, which never carries a credential or the approver
token; the state adds nothing secret of its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

ACTIVITY_KEEP = 500
# the fatigue meter (vault.gate.fatigue has the vault's own figures; these are this screen's)
RUBBER_STAMP_S = 1.0  # an approval faster than this after the row appeared was not read
METER_WINDOW_S = 300.0  # "prompts in the last 5 minutes"
FAST_PROMPTS = 10  # that many prompts in the window: suggest a session grant or a policy change


def _str(value: Any, default: str = "") -> str:
    return default if value is None else str(value)


def _float(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _client(d: dict[str, Any]) -> tuple[str | None, bool]:
    """The session's client label as text (a claim the opener made), and whether the daemon
    confirmed its host pid is the opener's ancestor."""
    c = d.get("client")
    if not isinstance(c, dict) or not isinstance(c.get("text"), str):
        return None, False
    return c["text"], c.get("host_verified") is True


@dataclass(frozen=True)
class Request:
    """One pending approval, as `approval.requested` describes it."""

    request_id: str
    agent: str
    pid: int | None
    session_id: str
    run_id: str | None
    operation: str
    risk: str
    params: dict[str, Any]
    scope: str
    session_scope: str
    mode: str
    allow_session_offered: bool
    owner: str | None
    deadline: float
    created: float
    correlation_id: str
    client: str | None = None  # e.g. "claude-code 1.2 (pid 4121) via mcp": claimed by the agent
    client_verified: bool = False

    @property
    def who(self) -> str:
        return self.client or self.agent

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "Request":
        # tolerant on purpose: a daemon a version ahead must not crash the approver
        pid = d.get("pid")
        params = d.get("params")
        client, verified = _client(d)
        return cls(client=client, client_verified=verified,
            request_id=_str(d.get("request_id")), agent=_str(d.get("agent"), "?"),
            pid=pid if isinstance(pid, int) else None, session_id=_str(d.get("session_id")),
            run_id=d.get("run_id") if isinstance(d.get("run_id"), str) else None,
            operation=_str(d.get("operation"), "?"), risk=_str(d.get("risk"), "?"),
            params=params if isinstance(params, dict) else {}, scope=_str(d.get("scope")),
            session_scope=_str(d.get("session_scope")), mode=_str(d.get("mode")),
            allow_session_offered=bool(d.get("allow_session_offered", False)),
            owner=d.get("owner") if isinstance(d.get("owner"), str) else None,
            deadline=_float(d.get("deadline")), created=_float(d.get("created")),
            correlation_id=_str(d.get("correlation_id")),
        )

    def time_left(self, now: float) -> float:
        return max(0.0, self.deadline - now)

    def params_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items()) or "-"

    def meanings(self) -> list[tuple[str, str, bool]]:
        """(key, what the answer means in plain words, offered?) for each answer."""
        session = (f"allow for session: {self.session_scope}" if self.allow_session_offered
                   else f"allow for session: not offered ({self.operation} asks on every call)")
        return [
            ("o", "allow once: this call only", True),
            ("s", session, self.allow_session_offered),
            ("d", f"deny: {self.agent} gets approval_denied and nothing is sent", True),
            ("D", "deny with a reason: the agent receives your note", True),
        ]


@dataclass
class Grant:
    grant_id: str
    session_id: str
    operation: str
    scope: str
    pid: int | None
    created: float
    expires_at: float | None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "Grant":
        exp = d.get("expires_at")
        return cls(_str(d.get("grant_id")), _str(d.get("session_id")), _str(d.get("operation")),
                   _str(d.get("scope")), d.get("pid") if isinstance(d.get("pid"), int) else None,
                   _float(d.get("created")), _float(exp) if exp is not None else None)


@dataclass
class AgentSession:
    session_id: str
    agent: str
    pid: int | None
    run_id: str | None
    opened: float
    grants: dict[str, Grant] = field(default_factory=dict)
    client: str | None = None

    @property
    def who(self) -> str:
        return self.client or self.agent

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "AgentSession":
        s = cls(_str(d.get("session_id")), _str(d.get("agent"), "?"),
                d.get("pid") if isinstance(d.get("pid"), int) else None,
                d.get("run_id") if isinstance(d.get("run_id"), str) else None, _float(d.get("opened")),
                client=_client(d)[0])
        for g in d.get("grants") or []:
            if isinstance(g, dict):
                grant = Grant.from_wire(g)
                s.grants[grant.grant_id] = grant
        return s


@dataclass(frozen=True)
class ActivityLine:
    time: float
    text: str
    kind: str  # "result", "decision", "gate", "demo": picks the colour


@dataclass
class TuiState:
    home: str = ""
    connected: bool = False
    link_note: str = "connecting"
    locked: bool | None = None
    pending: dict[str, Request] = field(default_factory=dict)
    sessions: dict[str, AgentSession] = field(default_factory=dict)
    activity: deque[ActivityLine] = field(default_factory=lambda: deque(maxlen=ACTIVITY_KEEP))
    activity_seq: int = 0  # lines ever added: widgets append only what is new
    stats: dict[str, Any] = field(default_factory=dict)
    current_run: str | None = None
    pinned_run: str | None = None
    # the fatigue meter: when each pending row appeared and its detail was shown (this screen's
    # clock), prompts asked lately, and this person's rubber-stamps since the TUI started
    shown_at: dict[str, float] = field(default_factory=dict)
    detail_at: dict[str, float] = field(default_factory=dict)
    asked_times: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    approvals: int = 0
    rubber_stamps: int = 0
    last_stamp: str = ""  # why the newest approval was a rubber-stamp ("" if it was not)

    # ---- link ------------------------------------------------------------------

    def link_up(self, pending: list[dict[str, Any]], locked: bool) -> None:
        self.connected = True
        self.link_note = "connected"
        self.locked = locked
        # merged, not replaced: a notification may have overtaken the subscribe answer
        # (link_down already dropped what an earlier connection knew)
        for d in pending:
            self._add_request(d)

    def link_down(self, why: str, now: float) -> None:
        # what we knew is stale once the daemon is gone: a restarted daemon has
        # no pending requests, sessions or grants from before
        if self.connected:
            self.note(now, f"disconnected: {why}", "gate")
        self.connected = False
        self.link_note = why
        self.pending = {}
        self.sessions = {}
        self.shown_at, self.detail_at = {}, {}

    def load_sessions(self, sessions: list[dict[str, Any]]) -> None:
        self.sessions = {}
        for d in sessions:
            if isinstance(d, dict):
                s = AgentSession.from_wire(d)
                self.sessions[s.session_id] = s

    def load_stats(self, report: dict[str, Any]) -> None:
        self.stats = report if isinstance(report, dict) else {}

    # ---- notifications -----------------------------------------------------------

    def apply(self, method: str, p: dict[str, Any], now: float) -> None:
        """Fold one notification from the daemon into the state."""
        handler = _HANDLERS.get(method)
        if handler is not None:
            handler(self, p, now)

    def _add_request(self, d: dict[str, Any]) -> Request:
        req = Request.from_wire(d)
        self.pending[req.request_id] = req
        self.current_run = req.run_id or "default"
        return req

    def _requested(self, p: dict[str, Any], now: float) -> None:
        req = self._add_request(p)
        self.asked_times.append(now)
        self.note(now, f"{req.who}[{req.pid}] asks: {req.operation} ({req.risk}, {req.mode})", "gate")

    def _settled(self, p: dict[str, Any], now: float) -> None:
        rid = _str(p.get("request_id"))
        self.shown_at.pop(rid, None)
        self.detail_at.pop(rid, None)
        req = self.pending.pop(rid, None)
        what = f"{req.operation} for {req.who}[{req.pid}]" if req else _str(p.get("request_id"))
        decision = _str(p.get("decision"), _str(p.get("state")))
        by = f" by {p['by']}" if p.get("by") else ""
        self.note(now, f"{decision}: {what}{by}", "decision")

    def _activity(self, p: dict[str, Any], now: float) -> None:
        when = _float(p.get("time"), now)
        retry = _str(p.get("retry"))
        told = f" (retry: {retry})" if retry and retry != "none" else ""
        self.note(when, f"{_str(p.get('agent'), '?')}[{p.get('pid')}] {_str(p.get('operation'), '?')}"
                        f" -> {_str(p.get('category'), '?')}{told}", "result")

    def _locked(self, p: dict[str, Any], now: float) -> None:
        self.locked = bool(p.get("locked"))
        by = f" by {p['by']}" if p.get("by") else ""
        self.note(now, ("vault locked" if self.locked else "vault unlocked") + by, "gate")
        if self.locked:
            self.pending = {}  # the daemon settles every pending request on lock

    def _session_opened(self, p: dict[str, Any], now: float) -> None:
        s = AgentSession.from_wire(p)
        self.sessions[s.session_id] = s

    def _session_closed(self, p: dict[str, Any], now: float) -> None:
        self.sessions.pop(_str(p.get("session_id")), None)

    def _grant_created(self, p: dict[str, Any], now: float) -> None:
        g = Grant.from_wire(p)
        s = self.sessions.get(g.session_id)
        if s is not None:
            s.grants[g.grant_id] = g
        self.note(g.created or now, f"grant: {g.scope} for process {g.pid}", "decision")

    def _grant_ended(self, p: dict[str, Any], now: float) -> None:
        g = Grant.from_wire(p)
        s = self.sessions.get(g.session_id)
        if s is not None:
            s.grants.pop(g.grant_id, None)
        self.note(now, f"grant ended ({_str(p.get('reason'), '?')}): {g.scope}", "gate")

    def note(self, when: float, text: str, kind: str) -> None:
        self.activity.append(ActivityLine(when, text, kind))
        self.activity_seq += 1

    # ---- the person's pace -----------------------------------------------------------

    def mark_shown(self, request_id: str, now: float, detail: bool) -> bool:
        """The row (or, with `detail`, its detail) is on screen; True the first time."""
        if request_id not in self.pending:
            return False
        seen = self.detail_at if detail else self.shown_at
        if request_id in seen:
            return False
        seen[request_id] = now
        if detail:
            self.shown_at.setdefault(request_id, now)
        return True

    def record_decision(self, request_id: str, decision: str, now: float) -> None:
        """Count this person's approval as considered or a rubber-stamp."""
        if decision not in ("allow_once", "allow_session"):
            return
        self.approvals += 1
        shown = self.shown_at.get(request_id)
        if request_id not in self.detail_at:
            self.last_stamp = "approved without opening the detail"
        elif shown is not None and now - shown < RUBBER_STAMP_S:
            self.last_stamp = f"approved {now - shown:.1f} s after it appeared"
        else:
            self.last_stamp = ""
        if self.last_stamp:
            self.rubber_stamps += 1

    def meter(self, now: float) -> tuple[int, int, str]:
        """(prompts in the last 5 minutes, rubber-stamps this session, a warning or "")."""
        recent = sum(1 for t in self.asked_times if now - t <= METER_WINDOW_S)
        if self.last_stamp:
            warning = f"slow down: {self.last_stamp}; read the detail before you approve"
        elif recent >= FAST_PROMPTS:
            warning = f"{recent} prompts in 5 min: a session grant or `vaultsim policy suggest` would ask less"
        else:
            warning = ""
        return recent, self.rubber_stamps, warning

    # ---- views -------------------------------------------------------------------

    def pending_oldest_first(self) -> list[Request]:
        return sorted(self.pending.values(), key=lambda r: (r.created, r.request_id))

    def run_counts(self) -> tuple[str | None, dict[str, Any]]:
        """The run whose prompts are shown, and its counts from `stats`."""
        runs = self.stats.get("runs") or {}
        run = self.pinned_run or self.current_run
        if run is None and runs:
            run = sorted(runs)[-1]
        return run, (runs.get(run) or {}) if run else {}

    def sessions_sorted(self) -> list[AgentSession]:
        return sorted(self.sessions.values(), key=lambda s: (s.opened, s.session_id))


_HANDLERS = {
    "approval.requested": TuiState._requested,
    "approval.settled": TuiState._settled,
    "activity": TuiState._activity,
    "vault.locked": TuiState._locked,
    "session.opened": TuiState._session_opened,
    "session.closed": TuiState._session_closed,
    "grant.created": TuiState._grant_created,
    "grant.ended": TuiState._grant_ended,
}
