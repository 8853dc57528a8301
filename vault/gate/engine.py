"""The gate engine: every call passes here before any executor runs.

Order of checks: locked -> policy `deny` -> `auto` -> a live session grant
(only for `session` mode) -> an approver who can receive a prompt -> the caps
on waiting prompts (per session, per process, in all) -> a prompt. The engine
runs an approved call at most once, whether its result is collected by the
original call or by `call.resume`.

The gate knows no wire and no subscriber: it is given three callables, `audit`
(record an event: a `vault.audit_events` model), `notify` (tell the approvers a
notification, never waiting; the daemon passes the approver hub's,
vault.daemon.approver_hub) and `routable` (is
an approver connected who could receive a prompt for this owner?), and it
raises domain errors (vault.errors.Conflict, NotAuthorized) that the
JSON-RPC layer maps to codes. Approvers are named, never handed over as
connections; whether a process may act as an approver at all is
vault.daemon.approver_guard's check, made by the approver API before it calls here.
When the last approver who could receive a prompt leaves (`approver_left`),
the prompt is settled unroutable at once. A
process refused for too many waiting prompts is a flooder: when its session
ends (its process exited, its connection closed) its prompts still waiting
are withdrawn instead of waiting out their deadline in front of a person.
An agent may withdraw its own request too (`call.cancel`, e.g. its MCP client
cancelled the call) as long as nothing has run.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Hashable, Iterator, Protocol, TypedDict

from vault import audit_events as A
from vault.audit_events import AuditEvent
from vault.catalog import Operation
from vault.errors import AuditError, Conflict, NotAuthorized
from vault.daemon.limits import MAX_PENDING, MAX_PENDING_PER_PROCESS, MAX_PENDING_PER_SESSION, TOO_MANY_PENDING_RETRY_S
from vault.models import Category, Result, make_result
from vault.daemon.processes import Key
from vault.daemon.sessions import Session, SessionTable
from vault.wire import ApprovalDetail, ApprovalSettled, GrantCreated, GrantEnded, Notification, VaultLocked
from vault.gate.approvals import Decision, PendingApproval, State, in_full
from vault.gate.fatigue import BOOT_CLOCK, PromptTiming, SteadyWall
from vault.gate.grants import Grant, GrantTable
from vault.gate.policy import Mode, Policy, Rule
from vault.gate.stats import PromptStats


class Audit(Protocol):
    """Record an event; `durable=False` only queues it (see VaultDaemon.audit)."""

    async def __call__(self, event: AuditEvent, durable: bool = True) -> None: ...


class Notify(Protocol):
    """Tell the approvers (those of `owner`, or all); never waits for one."""

    def __call__(self, note: Notification, owner: str | None = None) -> None: ...


Routable = Callable[[str | None], bool]  # is an approver connected who could receive it?


class _DecisionDetail(TypedDict, total=False):
    """A person's decision's optional fields (A.Decision's), given only when known: absent,
    not null, otherwise (mypy checks them against the model where they are unpacked)."""

    asked: float
    shown: float | None
    detail: float | None
    decided: float | None
    detail_viewed: bool
    reason: str

__all__ = ["Audit", "AuditEvent", "Gate", "Notify", "Routable", "MAX_PENDING", "MAX_PENDING_PER_PROCESS",
           "MAX_PENDING_PER_SESSION", "TOO_MANY_PENDING_RETRY_S"]

# settled approvals stay resumable for this long (receipts survive agent restarts)
_SETTLED_KEEP_S = 3600.0
# tokens whose owner (agent, run id) is remembered after the approval is forgotten, newest kept:
# a token presented by another agent is told from one the daemon never issued (vault.runner.foreign_refs)
_TOKEN_OWNERS_KEPT = 20_000
# a settled request's end that refuses its call for good, as the call's answer names it
_REFUSALS = {State.denied: Category.approval_denied, State.expired: Category.approval_expired,
             State.unroutable: Category.approval_unroutable}
# Prompts waiting at once are capped per session, per process and in all (vault.daemon.limits): an
# agent that calls with wait_s=0 in a loop leaves a prompt behind each time; past a cap it is
# told to slow down and nobody is asked.


class Gate:
    def __init__(self, policy: Policy, sessions: SessionTable, audit: Audit, *, notify: Notify,
                 routable: Routable, locked: bool = True, clock: Callable[[], float] = time.time,
                 steady: Callable[[], float] = BOOT_CLOCK) -> None:
        self.policy = policy
        self.sessions = sessions
        self.audit = audit
        self.clock = clock
        self.locked = locked
        self.epoch = 0
        self.grants = GrantTable(clock, steady)
        # a prompt's times (asked, shown, decided): how long a person took, which a stepped wall
        # clock must not change (vault.gate.fatigue)
        self.stamp = SteadyWall(clock, steady)
        self.stats = PromptStats()
        self.pending: dict[str, PendingApproval] = {}
        self.settled: dict[str, PendingApproval] = {}
        self.by_token: dict[str, PendingApproval] = {}
        self.token_owners: dict[str, tuple[str, str | None]] = {}  # token -> (agent, run id), oldest first
        self.notify = notify
        self.routable = routable
        self._reroute_due = False
        self._pending_by_session: Counter[str] = Counter()
        self._pending_by_process: Counter[Key] = Counter()
        self.flooders: set[Key] = set()  # processes refused for too many waiting prompts

    # ---- policy --------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self._policy = policy
        # each operation's rule, resolved once: a policy is frozen, and calls are many
        self._rules: dict[tuple[str, str], Rule] = {}

    def _rule(self, op: Operation) -> Rule:
        rule = self._rules.get((op.name, op.risk))
        if rule is None:
            rule = self._rules[(op.name, op.risk)] = self.policy.rule_for(op)
        return rule

    # ---- approver side -------------------------------------------------------

    def newest_prompt(self) -> int:
        """The newest waiting prompt's position: a new subscriber's snapshot (`routable_for`)
        ends there, and every later prompt reaches it as a notification."""
        return max((ap.seq for ap in self.pending.values()), default=0)

    def routable_for(self, approver: str, after: int = 0, until: int | None = None
                     ) -> list[tuple[int, dict[str, Any]]]:
        """(position, prompt) of each waiting prompt `approver` may decide, oldest first."""
        return [(ap.seq, ap.to_wire()) for ap in self.pending.values()
                if ap.seq > after and (until is None or ap.seq <= until) and ap.owner in (None, approver)]

    def waiting(self) -> int:
        """How many prompts wait for a person."""
        return len(self.pending)

    def requester(self, request_id: str) -> Session | None:
        """The session whose waiting request this is (None: no such request is waiting)."""
        ap = self.pending.get(request_id)
        return ap.session if ap is not None else None

    def approver_left(self) -> None:
        """An approver left (disconnected, dropped for not reading): re-route its prompts."""
        # re-route on the next loop turn: a subscriber may leave in the middle of a broadcast
        if not self._reroute_due:
            self._reroute_due = True
            asyncio.get_running_loop().call_soon(self._reroute)

    def _reroute(self) -> None:
        """Prompts that nobody left can receive are settled unroutable, never left hanging."""
        self._reroute_due = False
        for ap in list(self.pending.values()):
            if ap.state is State.pending and not self.routable(ap.owner):
                who = f"approver {ap.owner!r}" if ap.owner else "approver"
                self._settle(ap, State.unroutable, f"the last {who} who could receive it disconnected")
                self.stats.unroutable(ap.session.run_id, ap.session.id)
                self.notify(ApprovalSettled(request_id=ap.request_id, state="unroutable",
                                                decision="unroutable"))
                self._audit_later(A.Decision(request_id=ap.request_id, correlation_id=ap.correlation_id,
                                             decision="unroutable"))

    def _audit_later(self, event: AuditEvent) -> None:
        async def record() -> None:
            try:
                await self.audit(event)
            except AuditError:
                pass  # the daemon has already stopped serving calls and said why
        asyncio.ensure_future(record())

    def seen(self, approver: str, request_id: str, detail: bool) -> dict[str, Any]:
        """The approver reports a prompt visible (`detail`: its detail opened). The vault's clock
        records when; the first report of each kind counts. Unknown or settled ids are ignored
        (a report may cross the settlement on the wire)."""
        ap = self.pending.get(request_id)
        if ap is None or ap.timing is None:
            return {"recorded": False}
        if ap.owner is not None and approver != ap.owner:
            return {"recorded": False}
        now = self.stamp()
        t = ap.timing
        if t.shown is None:
            t.shown = now
        if detail and t.detail is None:
            t.detail = now
        return {"recorded": True}

    def unfinished(self, correlation_id: str) -> PendingApproval | None:
        """The approval request of this call while the call may still run: waiting for a
        decision, or allowed and not yet finished (collected by a waiter, or not yet). A lookup
        must not call such a call not_found: the remote has not seen it yet, but it runs once a
        person allows it and a waiter (a disconnected MCP host's bridge, a resume) collects it."""
        for ap in self.by_token.values():
            if ap.correlation_id != correlation_id:
                continue
            if ap.state is State.pending or (ap.state is State.allowed
                                              and (ap.run_task is None or not ap.run_task.done())):
                return ap
        return None

    def refusal(self, correlation_id: str) -> Category | None:
        """The refusal a settled approval request of this call ends in (denied, expired,
        unroutable), answered to a waiter or not; None if it ran, was withdrawn or is unknown."""
        for ap in self.by_token.values():
            if ap.correlation_id == correlation_id and ap.state in _REFUSALS:
                return _REFUSALS[ap.state]
        return None

    def _waiting(self, request_id: str) -> PendingApproval:
        """The waiting request `request_id`; Conflict if it is settled or unknown."""
        ap = self.pending.get(request_id)
        if ap is None:
            done = self.settled.get(request_id)
            if done is not None:
                raise Conflict(f"request {request_id} is already settled ({done.state}"
                               + (f": {done.reason}" if done.reason else "") + ")")
            raise Conflict(f"unknown request {request_id[:64]!r}")
        return ap

    def detail(self, approver: str, request_id: str) -> ApprovalDetail:
        """A waiting request's parameters in full, for an approver who could decide it (the one
        its owner names, or any): the same requests `routable_for` lists to that approver."""
        ap = self._waiting(request_id)
        if ap.owner is not None and approver != ap.owner:
            raise NotAuthorized(f"request {request_id} is shown to and decided by {ap.owner!r} only")
        return ap.to_detail()

    async def decide(self, who: str, request_id: str, decision: Decision,
                     reason: str = "") -> dict[str, Any]:
        """`who` (an approver's name) decides a waiting request. Whether its process may approve
        at all (not an agent, nor from the requester's tree) is vault.daemon.approver_guard's check,
        made by the approver API before this is called."""
        ap = self._waiting(request_id)
        if ap.epoch != self.epoch:
            raise Conflict(f"request {request_id} predates a lock; it can no longer be decided")
        if ap.owner is not None and who != ap.owner:
            raise NotAuthorized(f"request {request_id} must be decided by {ap.owner!r}")
        now = self.stamp()
        elapsed = now - ap.timing.asked if ap.timing is not None else None
        note = ""
        grant: Grant | None = None
        stale: list[Grant] = []
        if decision is Decision.deny:
            ap.note = reason
            if ap.timing is not None and reason:
                ap.timing.reason = reason
            self._settle(ap, State.denied, f"denied by {who}", decision, who, at=now)
        else:
            if decision is Decision.allow_session and ap.mode is not Mode.session:
                note = "per_call operation: allow_session was applied as allow_once"
                decision = Decision.allow_once
            if decision is Decision.allow_session and self.sessions.get(ap.session.id) is not None:
                # in place before the waiter wakes: its answer can reach the agent, and the agent's
                # next call of this scope arrive, while the decision's record is still being synced;
                # that call must find the grant, not ask the person again. A grant past its TTL
                # that the sweep has not ended yet is ended first: `add` would hand it back.
                stale = self._remove(self.grants.expired())
                rule = self._rule(ap.operation)
                grant = self.grants.add(ap.session.id, ap.session.identity, ap.operation.name,
                                        ap.scope, rule.ttl_s)
            self._settle(ap, State.allowed, "", decision, who, at=now)
        # read now: the agent may withdraw the call (call.cancel) while the records below are
        # written, and the grant made above stays in force: it must be logged all the same
        allowed = ap.state is State.allowed
        self.stats.decision(ap.session.run_id, ap.session.id, decision, elapsed)
        given: _DecisionDetail = {}
        t = ap.timing
        if t is not None:  # how the person met it (vault.gate.fatigue); absent in older logs
            given = {"asked": t.asked, "shown": t.shown, "detail": t.detail, "decided": t.decided,
                     "detail_viewed": t.detail is not None}
        if decision is Decision.deny and reason:
            given["reason"] = reason
        await self.audit(A.Decision(request_id=ap.request_id, correlation_id=ap.correlation_id,
                                    decision=str(decision), approver=who, **given))
        if allowed:
            session_grant = decision is Decision.allow_session
            self.stats.granted(ap.session.run_id, ap.session.id, ap.scope, ap.operation.risk, session_grant)
            if grant is not None:
                await self._tell_ended(stale, "ttl")
                await self.audit(A.GrantCreated(session_id=grant.session_id, scope=grant.scope,
                                                grant_id=grant.id), durable=False)
                self.notify(GrantCreated.model_validate(grant.to_wire()))
        self.notify(ApprovalSettled(request_id=ap.request_id, state=str(ap.state),
                                             decision=str(decision), by=who))
        out: dict[str, Any] = {"request_id": request_id, "state": str(ap.state), "decision": str(decision)}
        if note:
            out["note"] = note
        return out

    def _settle(self, ap: PendingApproval, state: State, reason: str,
                decision: Decision | None = None, by: str | None = None, at: float | None = None,
                outcome: str | None = None) -> None:
        ap.settle(state, reason, decision, by, at=self.stamp() if at is None else at, outcome=outcome)
        if self.pending.pop(ap.request_id, None) is not None:
            _dec(self._pending_by_session, ap.session.id)
            _dec(self._pending_by_process, ap.session.key)
        self.settled[ap.request_id] = ap
        self._prune()

    def _prune(self) -> None:
        cutoff = self.clock() - _SETTLED_KEEP_S
        for rid, ap in list(self.settled.items()):
            if ap.created < cutoff:
                self.settled.pop(rid, None)
                self.by_token.pop(ap.resume_token, None)

    async def lock(self, by: str) -> dict[str, Any]:
        self.locked = True
        self.epoch += 1
        settled = list(self.pending.values())
        for ap in settled:
            self._settle(ap, State.denied, "the vault was locked while this request was pending", by=by,
                         outcome="locked")
            self.stats.decision(ap.session.run_id, ap.session.id, "locked", None)
            self.notify(ApprovalSettled(request_id=ap.request_id, state="denied",
                                                 decision="locked", by=by))
        grants = self.grants.all()
        out: dict[str, Any] = {"locked": True, "pending_denied": len(settled)}
        try:
            out["grants_ended"] = await self.end_grants(grants, "lock")
            await self.audit(A.Lock(by=by, epoch=self.epoch, pending_denied=len(settled),
                                    grants_ended=out["grants_ended"]))
        except AuditError as exc:
            # the person's brake holds even when the log cannot record it (a full disk): every
            # grant ends all the same, and the answer says it went unrecorded (it was an
            # "internal error", which told the person the lock had failed)
            for g in grants:
                self.grants.remove(g.id)
            out["grants_ended"] = len(grants)
            out["note"] = f"locked, but the audit log could not record it: {exc.message}"
        self.notify(VaultLocked(locked=True, by=by))
        return out

    async def unlock(self, by: str) -> dict[str, Any]:
        # recorded first: an unlock the log cannot hold is not done (the vault stays locked)
        epoch = self.epoch
        await self.audit(A.Unlock(by=by, epoch=epoch))
        if self.epoch != epoch:  # locked again while the record was written: the later lock stands
            raise Conflict("the vault was locked again while this unlock was recorded; it stays locked")
        self.locked = False
        self.notify(VaultLocked(locked=False, by=by))
        return {"locked": False}

    async def end_grants(self, grants: list[Grant], reason: str) -> int:
        ended = self._remove(grants)
        await self._tell_ended(ended, reason)
        return len(ended)

    def _remove(self, grants: list[Grant]) -> list[Grant]:
        """The grants of `grants` still in force, now removed (none covers a call after this)."""
        return [g for g in grants if self.grants.remove(g.id) is not None]

    async def _tell_ended(self, grants: list[Grant], reason: str) -> None:
        for g in grants:
            await self.audit(A.GrantEnded(session_id=g.session_id, scope=g.scope, grant_id=g.id,
                                          reason=reason), durable=False)
            self.notify(GrantEnded.model_validate({**g.to_wire(), "reason": reason}))

    async def revoke_grant(self, grant_id: str, by: str) -> int | None:
        """End one grant (None: no such grant)."""
        g = self.grants.get(grant_id)
        return None if g is None else await self.end_grants([g], f"revoked by {by}")

    async def revoke_session(self, session_id: str, by: str) -> int:
        """End every grant of one session."""
        return await self.end_grants(self.grants.for_session(session_id), f"revoked by {by}")

    async def end_session(self, session: Session, reason: str) -> None:
        await self.end_grants(self.grants.for_session(session.id), reason)
        if session.key in self.flooders:
            self._withdraw(session)

    def _withdraw(self, session: Session) -> None:
        """A flooder's session ended: its prompts leave the approver's queue now."""
        for ap in [a for a in self.pending.values() if a.session.id == session.id]:
            self._settle(ap, State.withdrawn, "its process flooded the approver, then its session ended")
            self.stats.decision(ap.session.run_id, ap.session.id, "withdrawn", None)
            self.notify(ApprovalSettled(request_id=ap.request_id, state="withdrawn",
                                            decision="withdrawn"))
            self._audit_later(A.Decision(request_id=ap.request_id, correlation_id=ap.correlation_id,
                                         decision="withdrawn"))

    def process_exited(self, key: Key) -> None:
        # the exit can be seen before its connections' close ends its sessions: forgetting the
        # mark first left a killed flooder's prompts in front of a person until their deadline
        if key in self.flooders:
            ended = {ap.session.id: ap.session for ap in self.pending.values() if ap.session.key == key}
            for session in ended.values():
                self._withdraw(session)
        self.flooders.discard(key)

    async def sweep(self) -> None:
        """Periodic: end TTL-expired grants."""
        await self.end_grants(self.grants.expired(), "ttl")

    # ---- agent side ----------------------------------------------------------

    async def call(self, session: Session, op: Operation, params: dict[str, Any], correlation_id: str,
                   wait_s: float | None, execute: Callable[[], Awaitable[Result]]) -> Result:
        if self.locked:
            self.stats.locked(session.run_id, session.id)
            return make_result(Category.vault_locked, op.name, correlation_id,
                               "the vault is locked; nothing was sent. Ask an approver to unlock it.")
        rule = self._rule(op)
        if rule.mode is Mode.deny:
            return make_result(Category.authorization_denied, op.name, correlation_id,
                               f"policy denies {op.name}; nothing was sent")
        if rule.mode is Mode.auto:
            return await execute()
        scope = op.scope(params)
        if rule.mode is Mode.session and self.grants.find(session.id, session.identity, scope):
            return await execute()
        owner = rule.owner
        if not self.routable(owner):
            self.stats.unroutable(session.run_id, session.id)
            who = f"approver {owner!r}" if owner else "approver"
            await self.audit(A.PromptUnroutable(correlation_id=correlation_id, operation=op.name, owner=owner))
            return make_result(Category.approval_unroutable, op.name, correlation_id,
                               f"{op.name} needs an approval but no {who} is connected to receive it; "
                               "nothing was sent", owner=owner)
        whose = self._over_cap(session)
        if whose:
            return make_result(Category.rate_limited, op.name, correlation_id,
                               f"{op.name} needs an approval, but too many of {whose} requests already "
                               "wait for one; nobody was asked and nothing was sent. Collect or wait out "
                               "the pending ones, then try again", retry_after_s=TOO_MANY_PENDING_RETRY_S)
        asked = self.stamp()
        loop = asyncio.get_running_loop()
        summary = op.summary(params)
        ap = PendingApproval(session=session, operation=op, mode=rule.mode, params_summary=summary,
                             params_full=in_full(summary, params), scope=scope, owner=owner,
                             deadline=self.clock() + rule.deadline_s, due=loop.time() + rule.deadline_s,
                             epoch=self.epoch,
                             correlation_id=correlation_id, execute=execute)
        ap.timing = PromptTiming(request_id=ap.request_id, operation=op.name, risk=str(op.risk), scope=scope,
                                 session_id=session.id, asked=asked)
        self.pending[ap.request_id] = ap
        self._pending_by_session[session.id] += 1
        self._pending_by_process[session.key] += 1
        self.by_token[ap.resume_token] = ap
        self.token_owners[ap.resume_token] = (session.agent, session.run_id)
        if len(self.token_owners) > _TOKEN_OWNERS_KEPT:
            del self.token_owners[next(iter(self.token_owners))]
        ap.timer = loop.call_at(ap.due, self._expire, ap)
        repeat = self.stats.prompt(session.run_id, session.id, op.name, op.risk, scope, ap.timing)
        await self.audit(A.PromptShown(request_id=ap.request_id, correlation_id=correlation_id,
                                       operation=op.name, risk=str(op.risk), session_id=session.id,
                                       mode=str(rule.mode), scope=scope, repeat=repeat), durable=False)
        self.notify(ap.to_note(), owner)
        return await self._wait(ap, wait_s)

    def _over_cap(self, session: Session) -> str:
        """Whose waiting prompts are at a cap ("" if none): the session's, its process's, or all."""
        if self._pending_by_session[session.id] >= MAX_PENDING_PER_SESSION:
            self.flooders.add(session.key)
            return f"this session's ({MAX_PENDING_PER_SESSION})"
        if self._pending_by_process[session.key] >= MAX_PENDING_PER_PROCESS:
            self.flooders.add(session.key)
            return f"this process's ({MAX_PENDING_PER_PROCESS}, across its sessions)"
        if len(self.pending) >= MAX_PENDING:
            return f"all processes' ({MAX_PENDING})"
        return ""

    def _expire(self, ap: PendingApproval) -> None:
        if ap.state is State.pending:
            self._settle(ap, State.expired, "the deadline passed before anyone decided")
            self.stats.decision(ap.session.run_id, ap.session.id, "expired", None)
            self.notify(ApprovalSettled(request_id=ap.request_id, state="expired", decision="expired"))
            asyncio.ensure_future(self.audit(A.Decision(request_id=ap.request_id,
                                                        correlation_id=ap.correlation_id, decision="expired")))

    async def resume(self, session: Session, resume_token: str, wait_s: float | None) -> Result | None:
        ap = self.by_token.get(resume_token)
        # a receipt is honoured for the same agent and run only (a restarted agent
        # may collect its own one approved call; a different agent may not)
        if ap is None or ap.session.agent != session.agent or ap.session.run_id != session.run_id:
            return None
        return await self._wait(ap, wait_s)

    def token_owner(self, resume_token: str) -> tuple[str, str | None] | None:
        """The agent and run a token was issued to in this daemon's life (None: never, or
        forgotten past _TOKEN_OWNERS_KEPT)."""
        return self.token_owners.get(resume_token)

    async def _wait(self, ap: PendingApproval, wait_s: float | None) -> Result:
        if ap.state is State.pending:
            # the loop's clock, as the expiry timer's: a stepped wall clock moves neither
            left = max(0.0, ap.due - asyncio.get_running_loop().time())
            timeout = left if wait_s is None else min(left, max(0.0, wait_s))
            try:
                await asyncio.wait_for(ap.settled.wait(), timeout=timeout)
            except TimeoutError:
                # A wait that ran to the deadline settles the expiry itself: its timeout may fire
                # just before the expiry timer due at the same instant, and the agent would be
                # told "pending" past its deadline.
                if timeout >= left:
                    self._expire(ap)
        op, cid = ap.operation.name, ap.correlation_id
        if ap.state is State.pending:
            who = ap.owner or "any connected approver"
            return make_result(Category.approval_pending, op, cid,
                               f"waiting for {who} to approve {op}; resume with the token before the deadline",
                               request_id=ap.request_id, owner=who, deadline=ap.deadline,
                               resume_token=ap.resume_token)
        if ap.state is State.expired:
            return make_result(Category.approval_expired, op, cid,
                               f"nobody decided on {op} before the deadline; nothing was sent",
                               request_id=ap.request_id)
        if ap.state is State.denied and ap.decision is Decision.deny:
            # a person said no: the agent learns their reason, never who they are
            why = f"; the approver's reason: {ap.note}" if ap.note else ""
            return make_result(Category.approval_denied, op, cid,
                               f"{op} was denied by the approver{why}; nothing was sent",
                               request_id=ap.request_id)
        if ap.state is State.denied:
            return make_result(Category.approval_denied, op, cid,
                               f"{op} was not approved ({ap.reason}); nothing was sent",
                               request_id=ap.request_id)
        if ap.state is State.unroutable:
            return make_result(Category.approval_unroutable, op, cid,
                               f"{op} needs an approval but {ap.reason}; nothing was sent",
                               request_id=ap.request_id, owner=ap.owner)
        if ap.state is State.withdrawn:
            # final like an expiry (the contract has no category of its own): nobody's "no", and
            # nothing was sent
            return make_result(Category.approval_expired, op, cid,
                               f"{op} was withdrawn before it ran ({ap.reason}); nothing was sent",
                               request_id=ap.request_id)
        if ap.run_task is None:
            ap.run_task = asyncio.ensure_future(ap.execute())
        return await asyncio.shield(ap.run_task)

    # ---- agent withdraws its own request (call.cancel) ----------------------------

    async def withdraw(self, session: Session, resume_token: str,
                       gone: list[int] | None = None) -> dict[str, Any] | None:
        """Take back a request the agent no longer waits for (e.g. its MCP client cancelled).

        Withdrawable while nothing ran: pending, or allowed but not yet collected (execution
        starts only when a waiter collects it). The approver's row goes away (approval.settled);
        a later resume gets the withdrawal, never an execution. Returns None for a token this
        agent does not own (the same rule as resume). `gone`: the withdrawing process's ancestors
        that had exited when it asked (recorded with the decision)."""
        ap = self.by_token.get(resume_token)
        if ap is None or ap.session.agent != session.agent or ap.session.run_id != session.run_id:
            return None
        out: dict[str, Any] = {"request_id": ap.request_id, "correlation_id": ap.correlation_id}
        if not (ap.state is State.pending or (ap.state is State.allowed and ap.run_task is None)):
            return {**out, "withdrawn": False, "state": str(ap.state), "started": ap.run_task is not None}
        was = ap.state
        self._settle(ap, State.withdrawn, "the agent cancelled it", by=session.agent)
        self.stats.decision(session.run_id, session.id, "withdrawn", None)
        # given only when the session's ancestry was recorded (a None given would be written)
        extra: dict[str, Any] = {"gone": gone} if gone is not None else {}
        await self.audit(A.Decision(request_id=ap.request_id, correlation_id=ap.correlation_id,
                                    decision="withdrawn", by="agent", was=str(was), session_id=session.id,
                                    **extra))
        self.notify(ApprovalSettled(request_id=ap.request_id, state="withdrawn", decision="withdrawn",
                                    by=f"{session.agent} (agent)", session_id=session.id, time=time.time(),
                                    gone=gone))
        return {**out, "withdrawn": True, "state": "withdrawn", "was": str(was)}

    def status(self) -> dict[str, Any]:
        return {"locked": self.locked, "epoch": self.epoch, "pending": len(self.pending),
                "grants": len(self.grants)}

    def session_view(self, after: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
        """(position, session with its grants) of each open session, oldest first."""
        by_session: dict[str, list[dict[str, object]]] = {}
        for g in self.grants.all():
            by_session.setdefault(g.session_id, []).append(g.to_wire())
        for s in self.sessions.all():
            if s.seq > after:
                yield s.seq, {**s.to_wire(), "grants": by_session.get(s.id, [])}

    def shutdown(self, reason: str) -> None:
        """Settle every pending approval so waiting calls are answered before exit."""
        for ap in list(self.pending.values()):
            self._settle(ap, State.denied, reason)


def _dec(counter: Counter[Any], key: Hashable) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
