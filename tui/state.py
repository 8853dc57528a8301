"""What the approver sees, as plain data, built only from what the daemon says.

Kept apart from the widgets so it can be fed recorded notifications (snapshot
tests, the latency bench) and checked without a terminal. Everything here came
over the approver socket, which never carries a credential or the approver
token; the state adds nothing secret of its own. Notifications are read through
the daemon's own models (vault.wire): one that does not fit is a line in the
activity log, never a crash of the approver.

A prompt carries each parameter cut to 80 characters; the selected request's
parameters in full come from `approval.detail` (kept in `full` while the
request waits, with `full_note` saying it is loading or why it could not be
had), so the person can read all of what they approve.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from vault.lookalike import looks_like
from vault.text import doubts, quoted, shown, was_clipped
from vault.wire import (Activity, ApprovalDetail, ApprovalRequested, ApprovalSettled, GrantCreated, GrantEnded, GrantFields,
                        Notification, SessionClosed, SessionOpened, VaultLocked, WireClient, WireError,
                        parse_notification, read)

ACTIVITY_KEEP = 500
# the fatigue meter (vault.gate.fatigue has the vault's own figures; these are this screen's)
RUBBER_STAMP_S = 1.0  # an approval faster than this after the row appeared was not read
METER_WINDOW_S = 300.0  # "prompts in the last 5 minutes"
FAST_PROMPTS = 10  # that many prompts in the window: suggest a session grant or a policy change


# a value that reads as one plain word (`v1.4.2`, `dns-1`) inside the vault's own sentences
_WORD = re.compile(r"[A-Za-z0-9._-]+")

# names the vault itself speaks with: an agent calling itself so is claiming to be the system
VAULT_NAMES = frozenset({"vault", "vaultsim"})


def _client(c: WireClient | None) -> tuple[str | None, bool]:
    """The session's client label as text (a claim the opener made), and whether the daemon
    confirmed its host pid is the opener's ancestor."""
    if c is None or not c.text:
        return None, False
    return c.text, c.host_verified


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
    client_name: str | None = None  # the claim's `name` alone, to compare with approvers' names

    @property
    def who(self) -> str:
        return self.client or self.agent

    @property
    def named(self) -> str:
        """The session's name, and the claim beside it marked as one: a label naming an approver
        (`release-manager via tui`) never stands in for who is asking."""
        return named(self.agent, self.client)

    @classmethod
    def from_note(cls, n: ApprovalRequested) -> "Request":
        client, verified = _client(n.client)
        return cls(client=client, client_verified=verified,
                   client_name=n.client.name if n.client is not None else None,
                   request_id=n.request_id, agent=n.agent,
                   pid=n.pid, session_id=n.session_id, run_id=n.run_id, operation=n.operation,
                   risk=n.risk, params=dict(n.params), scope=n.scope, session_scope=n.session_scope,
                   mode=n.mode, allow_session_offered=n.allow_session_offered, owner=n.owner,
                   deadline=n.deadline, created=n.created, correlation_id=n.correlation_id)

    @classmethod
    def from_wire(cls, d: Any) -> "Request":
        """From `approval.requested` params (or a `subscribe` page); WireError if they do not fit."""
        return cls.from_note(read(ApprovalRequested, d, "approval.requested"))

    @property
    def cut(self) -> bool:
        """Whether a parameter came cut short (or looks it): its full value is to be fetched."""
        return any(was_clipped(v) for v in self.params.values())

    def in_full(self, params: dict[str, Any]) -> "Request":
        """This request with its parameters as `approval.detail` gave them (uncut)."""
        return replace(self, params=dict(params))

    def time_left(self, now: float) -> float:
        return max(0.0, self.deadline - now)

    def params_text(self) -> str:
        # quoted: a value cannot pass for a delimiter or another parameter (`note="x, env=staging"`)
        return ", ".join(f"{shown(k)}={quoted(v)}" for k, v in self.params.items()) or "-"

    def doubts(self, me: str | None = None) -> list[tuple[str, str]]:
        """(field, what could mislead) for the agent's name and each parameter (vault.text.doubts);
        `me` is this approver's own name, which an agent may also take."""
        out = [("agent", d) for d in doubts(self.agent)]
        if self.owner and looks_like(self.agent, {self.owner}):
            # `Release-Manager`, `rеlease-manager`: the approver's own name, to a person's eye
            out.append(("agent", f"reads as the owner's name {quoted(self.owner)} (it is {quoted(self.agent)}): "
                                 "an agent is asking, not the owner"))
        # the name, or the client label (shown beside it), taken from an approver or the vault itself
        claims = [("agent", self.agent)] if not self.owner or not looks_like(self.agent, {self.owner}) else []
        claims += [("acting for", self.client_name)] if self.client_name else []
        for what, text in claims:
            out += [(what, f"{why}: an agent is asking") for why in _impersonates(text, self.owner, me)]
        if self.client:
            out += [("acting for", d) for d in doubts(self.client)]
        out += [("scope", d) for d in doubts(self.scope) if not any(d == x for _, x in out)]
        for k, v in self.params.items():
            # the scope is the vault's sentence with the agent's values put in: `record dns-1 (this
            # call only)` reads as the vault narrowing the grant
            if isinstance(v, str) and not _WORD.fullmatch(v) and v in self.scope:
                out.append(("scope", f"holds {shown(k)}={quoted(v)} as the agent wrote it, not the vault's words"))
        for k, v in self.params.items():
            out += [(f"param {shown(k)}", d) for d in doubts(v)]
        return out

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


def named(agent: str, client: str | None) -> str:
    """An agent's name with its client label beside it, marked as its claim."""
    return f"{agent} (claims {client})" if client else agent


def _impersonates(text: str, owner: str | None, me: str | None) -> list[str]:
    """How `text` (an agent's name or client label) reads as someone it is not, in words."""
    out = [f"reads as {whose} {quoted(name)} (it is {quoted(text)})"
           for whose, name in (("the owner's name", owner), ("your approver name", me)) if name
           and looks_like(text, {name})]
    if looks_like(text, set(VAULT_NAMES)):
        out.append(f"reads as the vault itself (it is {quoted(text)})")
    return out[:1] if owner and me and looks_like(owner, {me}) else out


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
    def from_note(cls, n: GrantFields) -> "Grant":
        return cls(n.grant_id, n.session_id, n.operation, n.scope, n.pid, n.created, n.expires_at)

    @classmethod
    def from_wire(cls, d: Any) -> "Grant":
        """From a grant as `grant.created` and the `sessions` answer carry it; WireError if it does not fit."""
        return cls.from_note(read(GrantFields, d, "grant"))


@dataclass
class AgentSession:
    session_id: str
    agent: str
    pid: int | None
    run_id: str | None
    opened: float
    grants: dict[str, Grant] = field(default_factory=dict)
    client: str | None = None
    exe: str | None = None  # what the vault saw the process run, not what it claims

    @property
    def who(self) -> str:
        return self.client or self.agent

    @property
    def named(self) -> str:
        return named(self.agent, self.client)

    @classmethod
    def from_note(cls, n: SessionOpened) -> "AgentSession":
        return cls(n.session_id, n.agent, n.pid, n.run_id, n.opened, client=_client(n.client)[0], exe=n.exe)

    @classmethod
    def from_wire(cls, d: Any) -> "AgentSession":
        """From a session of the `sessions` answer (`session.opened`'s fields and its grants);
        WireError if the session does not fit. A grant that does not fit is left out."""
        s = cls.from_note(read(SessionOpened, d, "session"))
        grants = d.get("grants") if isinstance(d, dict) else None
        for g in grants if isinstance(grants, list) else []:
            try:
                grant = Grant.from_wire(g)
            except WireError:
                continue
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
    me: str | None = None  # this approver's name (an agent may take it)
    connected: bool = False
    link_note: str = "connecting"
    # the daemon keeps a request unanswered (stopped, or stuck): what waits, until it answers again
    silent: str = ""
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
    # parameters in full of waiting requests (`approval.detail`), and what to say while there are none
    full: dict[str, dict[str, Any]] = field(default_factory=dict)
    full_note: dict[str, str] = field(default_factory=dict)

    # ---- link ------------------------------------------------------------------

    def link_up(self, pending: list[dict[str, Any]], locked: bool, now: float = 0.0) -> None:
        self.connected = True
        self.link_note = "connected"
        self.locked = locked
        # merged, not replaced: a notification may have overtaken the subscribe answer
        # (link_down already dropped what an earlier connection knew)
        for d in pending:
            try:
                self._add_request(Request.from_wire(d))
            except WireError as exc:
                self.note(now, f"ignored: {exc.message}", "gate")

    def daemon_silent(self, method: str, now: float) -> None:
        self.silent = f"{method} waits for it (stopped, or stuck); what you sent is still waiting"
        self.note(now, f"the daemon is not answering: {self.silent}", "gate")

    def daemon_answering(self, now: float) -> None:
        if self.silent:
            self.note(now, "the daemon is answering again", "gate")
        self.silent = ""

    def link_down(self, why: str, now: float) -> None:
        # what we knew is stale once the daemon is gone: a restarted daemon has
        # no pending requests, sessions or grants from before
        if self.connected:
            self.note(now, f"disconnected: {why}", "gate")
        self.connected = False
        self.link_note = why
        self.silent = ""  # a connection that went away is said as such
        self.pending = {}
        self.sessions = {}
        self.shown_at, self.detail_at = {}, {}
        self.full, self.full_note = {}, {}

    def load_sessions(self, sessions: list[dict[str, Any]]) -> None:
        self.sessions = {}
        for d in sessions:
            try:
                s = AgentSession.from_wire(d)
            except WireError:
                continue  # a session it cannot read is left off the list, not the whole list
            self.sessions[s.session_id] = s

    def load_stats(self, report: dict[str, Any]) -> None:
        self.stats = report if isinstance(report, dict) else {}

    # ---- notifications -----------------------------------------------------------

    def apply(self, method: str, p: Any, now: float) -> None:
        """Fold one notification from the daemon into the state. One that does not fit its model
        (vault.wire) is noted in the activity log and otherwise ignored: an approver never crashes
        on what a daemon of another version sends."""
        try:
            n = parse_notification(method, p)
        except WireError as exc:
            self.note(now, f"ignored: {exc.message}", "gate")
            return
        if n is not None:
            self.fold(n, now)

    def fold(self, n: Notification, now: float) -> None:
        """Fold one parsed notification into the state."""
        if isinstance(n, ApprovalRequested):
            self._requested(n, now)
        elif isinstance(n, ApprovalSettled):
            self._settled(n, now)
        elif isinstance(n, Activity):
            self._activity(n, now)
        elif isinstance(n, VaultLocked):
            self._locked(n, now)
        elif isinstance(n, SessionOpened):
            s = AgentSession.from_note(n)
            self.sessions[s.session_id] = s
        elif isinstance(n, SessionClosed):
            self.sessions.pop(n.session_id, None)
        elif isinstance(n, GrantCreated):
            self._grant_created(n, now)
        elif isinstance(n, GrantEnded):
            self._grant_ended(n, now)

    def _add_request(self, req: Request) -> Request:
        self.pending[req.request_id] = req
        self.current_run = req.run_id or "default"
        return req

    def _requested(self, n: ApprovalRequested, now: float) -> None:
        req = self._add_request(Request.from_note(n))
        self.asked_times.append(now)
        self.note(now, f"{req.named}[{req.pid}] asks: {req.operation} ({req.risk}, {req.mode})", "gate")

    def _settled(self, n: ApprovalSettled, now: float) -> None:
        rid = n.request_id
        self.shown_at.pop(rid, None)
        self.detail_at.pop(rid, None)
        self.full.pop(rid, None)
        self.full_note.pop(rid, None)
        req = self.pending.pop(rid, None)
        what = f"{req.operation} for {req.named}[{req.pid}]" if req else rid
        decision = n.decision or n.state
        by = f" by {n.by}" if n.by else ""
        self.note(now, f"{decision}: {what}{by}", "decision")

    def _activity(self, n: Activity, now: float) -> None:
        when = n.time or now
        told = f" (retry: {n.retry})" if n.retry and n.retry != "none" else ""
        who = f"{n.agent or '?'}[{n.pid}]"
        if n.kind == "lookup":
            # a lookup ran nothing: what it found is its `reconciled`; its `success` only says it was
            # answered (read as a call, it showed the person an operation that never ran)
            said = n.reconciled or "unknown"
            if n.category != "success":
                said += f", {n.category}"
            token = f", told the token of request {n.request_id}" if n.request_id else ""
            text = f"{who} lookup of {n.operation} -> {said}{token}{told}"
        elif n.kind == "resume":
            text = f"{who} resume {n.operation} -> {n.category}{told}"
        else:  # a call, or an older daemon's answer of unknown kind
            text = f"{who} {n.operation} -> {n.category}{told}"
        self.note(when, text, "result")

    def _locked(self, n: VaultLocked, now: float) -> None:
        self.locked = n.locked
        by = f" by {n.by}" if n.by else ""
        self.note(now, ("vault locked" if self.locked else "vault unlocked") + by, "gate")
        if self.locked:
            self.pending = {}  # the daemon settles every pending request on lock
            self.full, self.full_note = {}, {}

    def _grant_created(self, n: GrantCreated, now: float) -> None:
        g = Grant.from_note(n)
        s = self.sessions.get(g.session_id)
        if s is not None:
            s.grants[g.grant_id] = g
        self.note(g.created or now, f"grant: {g.scope} for process {g.pid}", "decision")

    def _grant_ended(self, n: GrantEnded, now: float) -> None:
        g = Grant.from_note(n)
        s = self.sessions.get(g.session_id)
        if s is not None:
            s.grants.pop(g.grant_id, None)
        self.note(now, f"grant ended ({n.reason or '?'}): {g.scope}", "gate")

    def note(self, when: float, text: str, kind: str) -> None:
        self.activity.append(ActivityLine(when, text, kind))
        self.activity_seq += 1

    # ---- parameters in full (approval.detail) ----------------------------------------------

    def wants_full(self, request_id: str) -> bool:
        """Whether the full parameters of this waiting request are still to be asked for; if so
        they are marked loading (asked once: a failure is said, not retried in a loop)."""
        req = self.pending.get(request_id)
        if req is None or not req.cut or request_id in self.full or request_id in self.full_note:
            return False
        self.full_note[request_id] = "loading the full values…"
        return True

    def load_full(self, request_id: str, answer: Any) -> None:
        """The `approval.detail` answer for a request; ignored if it has left meanwhile."""
        if request_id not in self.pending:
            return
        try:
            d = read(ApprovalDetail, answer, "approval.detail answer")
        except WireError as exc:
            self.full_failed(request_id, exc.message)
            return
        if d.request_id != request_id or d.params.keys() != self.pending[request_id].params.keys():
            self.full_failed(request_id, "the answer does not match the request")
            return
        self.full[request_id] = dict(d.params)
        self.full_note.pop(request_id, None)

    def full_failed(self, request_id: str, why: str) -> None:
        if request_id in self.pending:
            self.full_note[request_id] = f"the full values could not be read ({why}); shown cut"

    def as_shown(self, req: Request) -> tuple[Request, str]:
        """`req` with its parameters in full when they are here, and a note when they are not."""
        full = self.full.get(req.request_id)
        return (req.in_full(full) if full is not None else req), self.full_note.get(req.request_id, "")

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

    def exe_of(self, req: Request) -> str | None:
        """The program the vault saw the request's process run (its session's), if known."""
        s = self.sessions.get(req.session_id)
        return s.exe if s is not None else None

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

