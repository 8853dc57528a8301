"""Pending approvals: a request with an owner, a deadline and a resume token.

A decision settles a request once. The epoch it was created in is kept so a
decision for a request from before a lock is refused even if it raced the lock.
A request is also settled without a decision when its deadline passes
(expired), when no approver who could receive it is left (unroutable), or
when the agent took it back (call.cancel) or its process flooded the approver
and its session ended (withdrawn).
"""

from __future__ import annotations

import asyncio
import re
import time
import itertools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Awaitable, Callable

from vault.catalog import HIDDEN, Operation
from vault.text import quoted
from vault.ids import new_id, token
from vault.models import Result
from vault.daemon.sessions import Session
from vault.wire import ApprovalDetail, ApprovalRequested, WireClient
from vault.gate.fatigue import PromptTiming
from vault.gate.policy import Mode

_seq = itertools.count(1)


def in_full(summary: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The parameters as `approval.detail` shows them: those the summary shows, uncut; those it
    hides, still `[hidden]` (the summary is the one judge of which is which, vault.catalog)."""
    return {k: HIDDEN if shown == HIDDEN else params[k] for k, shown in summary.items()}


class Decision(StrEnum):
    allow_once = "allow_once"
    allow_session = "allow_session"
    deny = "deny"


class State(StrEnum):
    pending = "pending"
    allowed = "allowed"
    denied = "denied"
    expired = "expired"
    unroutable = "unroutable"  # the last approver who could receive it left
    # never ran, taken back from the agent's side: the agent cancelled it (call.cancel), or its
    # process flooded the approver and then ended its session
    withdrawn = "withdrawn"


_WORD = re.compile(r"[A-Za-z0-9._-]+")


def as_word(claim: str) -> str:
    """A client's claimed name or bridge inside the vault's own sentence: bare when it is one plain
    word (`claude-code`), else quoted, so that `x ends; only this call is granted` cannot finish
    the sentence that says what `allow_session` grants."""
    return claim if _WORD.fullmatch(claim) else quoted(claim)


@dataclass(eq=False)
class PendingApproval:
    session: Session
    operation: Operation
    mode: Mode
    params_summary: dict[str, Any]
    # the same parameters uncut (`in_full`): what `approval.detail` answers while it waits
    params_full: dict[str, Any]
    scope: str
    owner: str | None
    deadline: float  # wall clock, seconds since epoch: what people and agents are told
    # the deadline on the event loop's clock, which the expiry timer and every wait run on
    due: float
    epoch: int
    correlation_id: str
    execute: Callable[[], Awaitable[Result]]
    request_id: str = field(default_factory=lambda: new_id("r"))
    seq: int = field(default_factory=lambda: next(_seq))  # creation order: the cursor of pages
    resume_token: str = field(default_factory=lambda: token(24))
    created: float = field(default_factory=time.time)
    state: State = State.pending
    decision: Decision | None = None
    decided_by: str | None = None
    reason: str = ""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    run_task: "asyncio.Task[Result] | None" = None
    timer: asyncio.TimerHandle | None = None
    # when the approver saw it, opened its detail, decided (vault.gate.fatigue); set by the gate
    timing: PromptTiming | None = None
    # a person's reason for a denial: the one thing of the approver's the agent is told
    note: str = ""

    def plain_scope(self) -> str:
        """What `allow_session` would grant, in plain words."""
        if self.mode is not Mode.session:
            return f"not offered: {self.operation.name} asks every call (per_call)"
        if self.session.client is not None and self.session.client.via:
            # one bridge process may serve several host sessions: the grant ends with this one
            return (f"{self.scope} until this {as_word(self.session.client.via)} session of "
                    f"{as_word(self.session.client.name)} ends (process {self.session.identity.pid})")
        return f"{self.scope} until process {self.session.identity.pid} exits"

    def to_note(self) -> ApprovalRequested:
        """The `approval.requested` notification for this request."""
        client = self.session.client_wire()  # a claim (see vault.daemon.sessions)
        return ApprovalRequested(
            request_id=self.request_id, agent=self.session.agent, pid=self.session.identity.pid,
            session_id=self.session.id, run_id=self.session.run_id, operation=self.operation.name,
            risk=str(self.operation.risk), params=self.params_summary, scope=self.scope,
            session_scope=self.plain_scope(), mode=str(self.mode),
            allow_session_offered=self.mode is Mode.session, owner=self.owner, deadline=self.deadline,
            created=self.created, correlation_id=self.correlation_id,
            client=WireClient.model_validate(client) if client is not None else None)

    def to_detail(self) -> ApprovalDetail:
        """The `approval.detail` answer: every parameter safe to show, in full."""
        return ApprovalDetail(request_id=self.request_id, agent=self.session.agent,
                              operation=self.operation.name, risk=str(self.operation.risk),
                              params=self.params_full)

    def to_wire(self) -> dict[str, Any]:
        """As `approval.requested` carries it (also a page of `subscribe` / `pending`)."""
        return self.to_note().to_params()

    def settle(self, state: State, reason: str = "", decision: Decision | None = None,
               by: str | None = None, at: float | None = None, outcome: str | None = None) -> None:
        if self.timing is not None and self.timing.decided is None:
            self.timing.decided = at if at is not None else time.time()
            self.timing.decision = str(decision) if decision is not None else (outcome or str(state))
            self.timing.approver = by if decision is not None else None
        self.state = state
        self.params_full = {}  # served only while it waits; a settled request is kept an hour
        self.reason = reason
        self.decision = decision
        self.decided_by = by
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.settled.set()
