"""The call service: from an agent's call, through the gate, to the Result it is told.

`CallService` is built from typed parts (the config's services and timeout,
the catalog, the credential store, diagnostics, executors, the gate, the
audit recorder and the approvers' `notify`); the agent API calls it and the
daemon composes it. It also serves `lookup` and collects resumed calls.

Order, and why: credential and service first (a missing one is refused with
nothing sent); the intent is durable in the audit log before the credential
leaves the vault (the one fdatasync on a call's path); the executor runs; raw
evidence of a failure goes to encrypted diagnostics; the result record is
written before the answer, so a crash or SIGKILL of the daemon after the
answer never loses it, and is synced with the next group commit (at most 5 ms
later; before the answer with ``--durability strict``). If a record cannot be
written after the remote was touched, the agent is told `outcome_unknown`,
never a success the log cannot back.

A call the agent waits for leaves three records: call_requested (before the
gate), intent (durable, before the remote) and the classification it was told,
which carries the executor's `remote_touched` too (plus client_timeout if the
client gave up). Fewer records, fewer bytes to sync and less CPU per call
(issue #19). The executor's result gets a record of its own (remote_result)
only when it is not answered in the same task: an approved call run for a
waiter that may be gone, so it is recorded even if nobody collects it. A
lookup records its reconciliation, then the classification.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import shutil
import time
from collections.abc import Iterable, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

from vault import audit_events as A, lineage
from vault.catalog import Catalog, Operation
from vault.errors import AuditError, CredentialError, MissingCredential, VaultError
from vault.executors.base import CallContext, ExecOutcome, Executor, ServiceConfig
from vault.gate.approvals import State
from vault.gate.engine import Gate, Notify
from vault.ids import correlation_id, remote_key, scope
from vault.models import Category, Result, Retry, make_result
from vault.daemon.limits import REMOTE_LOOKUPS_AT_ONCE, REMOTE_LOOKUPS_PER_S, Paced, sampled
from vault.daemon.gone_watch import REQUEST_GONE
from vault.daemon.recorder import Recorder
from vault.store.secret import Secret
from vault.daemon.sessions import Session
from vault.wire import Activity

log = logging.getLogger("vaultsim.daemon")


# optional audit fields, given only when they apply (absent, not null, otherwise); mypy checks
# them against the model where they are unpacked
class _Folded(TypedDict, total=False):
    remote_touched: bool  # a classification standing for the executor's result
    asked: float  # a resume's or lookup's request time (it has no request record)
    children: list[tuple[int, float]]  # a never, outcome_unknown or lookup-unknown answer's: the told process's children then
    gone: list[int]  # a resume's or lookup's: its process's ancestors that had exited as it came


class _Link(TypedDict, total=False):
    lookup_of: str  # the call a reconciliation settles


# calls the daemon remembers for `lookup` (dicts keep insertion order: oldest first);
# about 150 bytes each. A forgotten call can still be looked up by naming its operation.
MAX_REMEMBERED_CALLS = 100_000
# lookups of ids that are no call of the asking agent's, recorded per session: the first this
# many, then powers of two (as refusals are): an agent probing made-up ids cannot flood the log
STRAYS_RECORDED = 32
STRAY_SESSIONS = 4096  # sessions whose count is kept (the oldest forgotten first)
# lookups by a key text another agent sent and the looker had not, kept until the looker sends
# it (then its own, picked alike by chance: §5), the oldest forgotten first
KEY_LOOKUPS_KEPT = 4096
# answers given with the remote never asked (unless the executor says it was contacted)
_NOT_SENT = frozenset({Category.local_failure, Category.approval_pending, Category.vault_locked,
                       Category.approval_denied, Category.approval_expired, Category.approval_unroutable})


# an idempotency key as one agent's in one run: (run id, agent, key), the remote's key made of it
OwnKey = tuple[str | None, str, str]


@dataclass(frozen=True, slots=True)
class CallRecord:
    operation: str
    idempotency_key: str | None
    session_id: str
    agent: str
    run_id: str | None

    @property
    def own_key(self) -> OwnKey | None:
        """The call's key as its agent's own in its run (another agent's same text is another key)."""
        return None if self.idempotency_key is None else (self.run_id, self.agent, self.idempotency_key)


def _call_id(s: Session) -> str:
    """A correlation id for a call or lookup of this session's agent and run: it ends with their
    digest. The daemon keeps no calls across a restart (and forgets the oldest past
    MAX_REMEMBERED_CALLS), so an id it does not know can still be this agent's call only if
    it ends so; any other (made up, or another agent's) is answered without asking the remote."""
    return correlation_id() + scope(s.run_id, s.agent)


def _timed_out(diagnostic: dict[str, Any] | None) -> bool:
    """Did the executor give up on a deadline? (http: a *Timeout error; ssh: timed_out)"""
    if not diagnostic:
        return False
    error = diagnostic.get("error")
    kind = error.get("type", "") if isinstance(error, dict) else ""
    return bool(diagnostic.get("timed_out")) or "Timeout" in str(kind)


class Credentials(Protocol):
    """Where credentials come from (vault.store.credentials.CredentialStore)."""

    def get(self, name: str) -> Secret: ...


class Diagnostics(Protocol):
    """Where raw evidence of a failure goes, encrypted (vault.daemon.diagnostics.Diagnostics)."""

    async def record_off_loop(self, data: dict[str, Any], *, secrets: Iterable[str | Secret] = ()) -> str: ...


class CallMemory:
    """What `lookup` needs about recent calls: bounded, the oldest forgotten first."""

    def __init__(self) -> None:
        self.calls: dict[str, CallRecord] = {}
        self.by_idem: dict[OwnKey, str] = {}
        # remembered calls refused for good (retry never or human_required), for `lookup`
        self.refused: dict[str, Category] = {}
        # remembered calls answered rate_limited: when their wait ends, for `lookup`
        self.held: dict[str, float] = {}
        # remembered calls answered local_failure with the remote never contacted, and the keys
        # of calls that may have reached it, for `lookup`
        self.unsent: set[str] = set()
        self.reached_keys: set[OwnKey] = set()
        # key text -> the (run, agent) that last sent it: whose a lookup by that text would be
        self.key_senders: dict[str, tuple[str | None, str]] = {}
        # (run, agent, key) looked up by a text another sent -> its record's ref (see `key_stranger`)
        self.key_lookups: dict[OwnKey, int] = {}
        self._key_refs = itertools.count(1)
        # correlation ids given to lookups (oldest first in the deque): a lookup naming one names no call
        self.lookup_ids: set[str] = set()
        self._lookup_order: collections.deque[str] = collections.deque()

    @functools.cached_property
    def _call_order(self) -> "collections.deque[str]":
        """Remembered correlation ids, oldest first. (Finding the oldest by iterating the
        dict would walk every slot its evictions emptied since it was last resized.)"""
        return collections.deque(self.calls)

    def never_sent(self, cid: str, record: CallRecord) -> bool:
        """Did no attempt of this step reach the remote? The call was answered local_failure
        with the remote never contacted, and so was every remembered call under its key.
        (A key's calls leave memory oldest first, the key's mark with the last of them.)"""
        return cid in self.unsent and record.own_key not in self.reached_keys

    def _remember_lookup(self, cid: str) -> None:
        self.lookup_ids.add(cid)
        self._lookup_order.append(cid)
        if len(self._lookup_order) > MAX_REMEMBERED_CALLS:
            self.lookup_ids.discard(self._lookup_order.popleft())

    def _remember(self, cid: str, record: CallRecord) -> None:
        """Keep what `lookup` needs about a call; the oldest go first past the cap."""
        order = self._call_order  # (made from `calls` on first use: before this call is in it)
        self.calls[cid] = record
        order.append(cid)
        if (key := record.own_key) is not None:
            self.by_idem[key] = cid
            self.key_senders[key[2]] = (key[0], key[1])
        while len(self.calls) > MAX_REMEMBERED_CALLS and order:
            old_cid = order.popleft()
            old = self.calls.pop(old_cid, None)
            self.refused.pop(old_cid, None)
            self.held.pop(old_cid, None)
            self.unsent.discard(old_cid)
            if old and (key := old.own_key) is not None and self.by_idem.get(key) == old_cid:
                del self.by_idem[key]
                self.reached_keys.discard(key)
                if self.key_senders.get(key[2]) == (key[0], key[1]):
                    del self.key_senders[key[2]]

    def key_stranger(self, s: Session, idem: str | None) -> tuple[tuple[str, str | None], int] | None:
        """Whose call a lookup by key text `idem` reaches for when `s`'s agent and run never sent
        that text and another agent (or run) did: ((its agent, its run), a ref for the record).
        The vault asks about the looker's own key all the same (§5: nothing crosses). The ref is
        given to the looker's later call under that text (`take_key_lookup`): an agent may pick
        another's text by chance and look its own key up before sending it (§6)."""
        if not idem or (s.run_id, s.agent, idem) in self.by_idem:
            return None
        sender = self.key_senders.get(idem)
        if sender is None or sender == (s.run_id, s.agent):
            return None
        own: OwnKey = (s.run_id, s.agent, idem)
        ref = self.key_lookups.pop(own, None) or next(self._key_refs)
        self.key_lookups[own] = ref  # (re-inserted: the newest last)
        if len(self.key_lookups) > KEY_LOOKUPS_KEPT:
            del self.key_lookups[next(iter(self.key_lookups))]
        return (sender[1], sender[0]), ref

    def take_key_lookup(self, s: Session, idem: str | None) -> int | None:
        """The ref of an earlier lookup by `idem` that `key_stranger` flagged, now that `s`'s agent
        sends that key itself: the text was its own step's."""
        return None if not idem else self.key_lookups.pop((s.run_id, s.agent, idem), None)


class CallService(CallMemory):
    """Performs calls and lookups for agents' sessions."""

    def __init__(self, *, services: dict[str, ServiceConfig], call_timeout_s: float, catalog: Catalog,
                 store: Credentials, diagnostics: Diagnostics | None, executors: dict[str, Executor],
                 gate: Gate, recorder: Recorder, notify: Notify, workdir: Path,
                 listeners: Sized = (1,)) -> None:
        super().__init__()
        self.services = services
        self.call_timeout_s = call_timeout_s
        self.catalog = catalog
        self.store = store
        self.diagnostics = diagnostics
        self.executors = executors
        self.gate = gate
        self.recorder = recorder
        self.notify = notify
        self.listeners = listeners  # who `notify` reaches (the hub's subscribers); empty: nobody
        self.workdir = workdir  # per-call private directories (ssh) are made under it
        self.in_flight = 0  # calls and lookups being served right now
        self.at_remote = 0  # of those, the ones waiting on their executor (the remote's answer)
        self._touched: set[str] = set()  # correlation ids whose remote was contacted
        # correlation id -> the task that will answer it, while `_call` runs
        self._answering: dict[str, asyncio.Task[Any] | None] = {}
        # correlation id -> remote_touched, for an executor result the classification carries
        self._folded: dict[str, bool] = {}
        # session id -> its lookups of ids that are no call of its agent's (see `_stray`)
        self._strays: dict[str, int] = {}
        # per (run, agent): lookups only the remote could answer (see `_paced`)
        self._remote_lookups = Paced(REMOTE_LOOKUPS_AT_ONCE, REMOTE_LOOKUPS_PER_S)

    @property
    def halted(self) -> str | None:
        return self.recorder.halted

    def busy(self) -> int:
        """Calls that share the audit log's next group commit: those being served, less those
        waiting for a person or on the remote. Neither appends before its answer arrives, so
        the log may sync in the loop thread meanwhile (a remote's answer waits in its socket
        for that 0.1-0.3 ms) and spare the hand-off to its flush thread."""
        return max(1, self.in_flight - self.gate.waiting() - self.at_remote)

    async def call(self, s: Session, op: Operation, params: dict[str, Any],
                   idem: str | None, wait_s: float | None) -> Result:
        self.in_flight += 1
        try:
            return await self._call(s, op, params, idem, wait_s)
        finally:
            self.in_flight -= 1

    async def _call(self, s: Session, op: Operation, params: dict[str, Any],
                    idem: str | None, wait_s: float | None) -> Result:
        cid = _call_id(s)
        came = time.time()
        looked_up = self.take_key_lookup(s, idem)
        self._remember(cid, CallRecord(op.name, idem, s.id, s.agent, s.run_id))
        if self.halted:
            self.recorder.refuse()
            return make_result(Category.local_failure, op.name, cid,
                               f"the vault stopped serving calls ({self.halted}); nothing was sent")
        self._answering[cid] = asyncio.current_task()
        try:
            mark: dict[str, Any] = {} if looked_up is None else {"key_lookup": looked_up}  # (given: written)
            if (gone := REQUEST_GONE.get()) is not None:
                mark["gone"] = gone
            await self.recorder.record(A.CallRequested(correlation_id=cid, session_id=s.id, operation=op.name,
                                                       risk=str(op.risk), target=op.scope(params), **mark),
                                       durable=False)
            # a value that could steer the request is refused before the gate: nobody is asked
            # to approve a call the vault would never send (the executors check again)
            refused = op.refusal(params)
            if refused is not None:
                result = make_result(Category.local_failure, op.name, cid,
                                     f"{refused}; nothing was sent and nobody was asked")
            else:
                result = await self.gate.call(s, op, params, cid, wait_s,
                                              lambda: self._execute(s, op, params, cid, idem))
        except AuditError:
            self.recorder.refuse()
            result = make_result(Category.local_failure, op.name, cid,
                                 "the audit log could not record this call; nothing was sent")
        finally:
            del self._answering[cid]
        return await self.record_result(s, result, remote_touched=self._folded.pop(cid, None), came=came)

    async def record_result(self, s: Session, result: Result, resumed: bool = False,
                            remote_touched: bool | None = None, asked: float | None = None,
                            lookup: _Link | None = None, came: float | None = None) -> Result:
        """Record what the agent is told (written before the answer; see `audit_answer`),
        then tell approvers; returns what the agent gets. `remote_touched`: the executor's
        result, when this record stands for it (no remote_result record was written). `asked`:
        when a resume's or lookup's request came (it has no request record of its own).
        `lookup`: this answers a lookup (of the call it names, when the vault knew it). `came`: when
        a call's request came (its request record holds it; told to approvers only)."""
        touched = result.correlation_id in self._touched
        if result.retry in (Retry.never, Retry.human_required) and result.correlation_id in self.calls:
            self.refused[result.correlation_id] = result.category
        elif result.category is Category.rate_limited and result.correlation_id in self.calls:
            self.held[result.correlation_id] = time.time() + (result.retry_after_s or 0.0)
        if (record := self.calls.get(result.correlation_id)) is not None:
            reached = touched or remote_touched is True or result.category not in _NOT_SENT
            if result.category is Category.local_failure and not reached:
                self.unsent.add(result.correlation_id)
            elif reached and (key := record.own_key) is not None:
                self.reached_keys.add(key)
        self._touched.discard(result.correlation_id)
        folded: _Folded = {} if remote_touched is None else {"remote_touched": remote_touched}
        if asked is not None:
            folded["asked"] = asked
            if (gone := REQUEST_GONE.get()) is not None:
                folded["gone"] = gone  # read as the resume or lookup came (vault.daemon.agent_api)
        if result.retry in (Retry.never, Retry.human_required) or result.category is Category.outcome_unknown \
                or (result.reconciled == "unknown" and result.category is not Category.rate_limited):
            # who already ran beside the told process: a worker started in the answer's clock
            # tick read none of it (vault.runner.told); start times alone cannot tell it. Only
            # the answers a process is held to (a stop, reconcile first, a lookup's `unknown`, which
            # stops the task; not a paced one, which says ask again): no cost on the usual path
            folded["children"] = lineage.children(s.identity.pid)
        try:
            await self.recorder.record_answer(A.Classification(
                correlation_id=result.correlation_id, session_id=s.id, operation=result.operation,
                category=str(result.category), retry=str(result.retry), diagnostic_id=result.diagnostic_id,
                resumed=resumed, **folded))
        except AuditError:
            if touched:
                result = make_result(Category.outcome_unknown, result.operation, result.correlation_id,
                                     "the remote was contacted but the result could not be recorded; "
                                     "its outcome must be treated as unknown")
        if self.listeners:  # built only for someone to tell: an idle TUI costs no call anything
            # what it answered, so that a transcript built from these alone (no audit log) tells a
            # lookup from a call and who was told a pending call's token (request id, never the token)
            told = result.request_id if lookup is not None and result.resume_token else None
            self.notify(Activity(
                time=time.time(), agent=s.agent, pid=s.identity.pid, session_id=s.id,
                operation=result.operation, category=str(result.category),
                retry=str(result.retry), correlation_id=result.correlation_id,
                kind="resume" if resumed else "call" if lookup is None else "lookup",
                reconciled=result.reconciled if lookup is not None else None,
                lookup_of=(lookup or {}).get("lookup_of"), request_id=told,
                # as the request came: the call's request record's, the resume's or lookup's own
                gone=REQUEST_GONE.get(), asked=asked if asked is not None else came))
        return result

    def _context(self, s: Session, cid: str, idem: str | None, workdir: str | None,
                 params_checked: bool = False) -> CallContext:
        # the remote gets the key as this agent's in this run: another's same text is another key
        return CallContext(correlation_id=cid, session_id=s.id, run_id=s.run_id,
                           idempotency_key=None if idem is None else remote_key(s.run_id, s.agent, idem),
                           deadline=time.monotonic() + self.call_timeout_s, workdir=workdir,
                           params_checked=params_checked)

    async def _prepare(self, op: Operation, cid: str) -> tuple[Secret, ServiceConfig, Executor] | Result:
        service = self.services.get(op.service)
        executor = self.executors.get(op.executor)
        if service is None or executor is None:
            return make_result(Category.local_failure, op.name, cid,
                               f"service {op.service!r} is not configured in this vault; nothing was sent")
        try:
            credential = self.store.get(op.credential)
        except MissingCredential:
            return make_result(Category.authentication_failed, op.name, cid,
                               f"the vault holds no credential {op.credential!r} for {op.name}; "
                               "an operator must set it (vaultsim secret set). Nothing was sent")
        except CredentialError as exc:
            return make_result(Category.local_failure, op.name, cid,
                               f"the credential store is unavailable ({exc.message}); nothing was sent")
        return credential, service, executor

    async def _execute(self, s: Session, op: Operation, params: dict[str, Any],
                       cid: str, idem: str | None) -> Result:
        prepared = await self._prepare(op, cid)
        if isinstance(prepared, Result):
            return prepared
        credential, service, executor = prepared
        try:
            # on disk before the credential leaves the vault, reads included: no unaudited action
            await self.recorder.record(A.Intent(correlation_id=cid, operation=op.name, target=op.scope(params),
                                                idempotency_key=bool(idem)))
        except AuditError as exc:
            self.recorder.refuse()
            return make_result(Category.local_failure, op.name, cid,
                               "the audit log could not record the intent; the call was refused "
                               f"before anything was sent ({exc.message})")
        workdir = self._workdir(cid) if op.executor == "ssh" else None
        try:
            outcome = await self._run_executor(executor, op, params, credential, service,
                                               # `_call` refused these params or let them by
                                               self._context(s, cid, idem, workdir, params_checked=True))
        finally:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        return await self._finish(op, cid, outcome, credential, A.RemoteResult)

    async def _run_executor(self, executor: Executor, op: Operation, params: dict[str, Any],
                            credential: Secret, service: ServiceConfig, ctx: CallContext) -> ExecOutcome:
        self.at_remote += 1
        try:
            return await executor.execute(op, params, credential, service, ctx)
        except Exception as exc:  # an executor bug: we cannot know what reached the remote
            log.error("executor %s failed: %s", op.executor, type(exc).__name__)
            cat = Category.outcome_unknown if op.mutates else Category.local_failure
            return ExecOutcome(make_result(cat, op.name, ctx.correlation_id,
                                           "the vault's executor failed unexpectedly; "
                                           "the remote outcome is not known"), remote_touched=True)
        finally:
            self.at_remote -= 1

    async def _finish(self, op: Operation, cid: str, outcome: ExecOutcome, credential: Secret,
                      kind: type[A.RemoteResult] | type[A.Reconciliation], link: _Link | None = None) -> Result:
        result = outcome.result
        if outcome.remote_touched:
            self._touched.add(cid)
        # raw evidence is kept for failures only: a success needs no forensics
        if outcome.diagnostic and not result.ok and self.diagnostics is not None:
            try:
                # off the loop: its fsyncs must not hold other clients on a slow disk
                did = await self.diagnostics.record_off_loop(outcome.diagnostic, secrets=[credential])
                result = result.model_copy(update={"diagnostic_id": did})
            except Exception as exc:  # diagnostics are best effort; never block the answer
                log.error("could not store diagnostic: %s", _why_not_kept(exc))
        # the task that will answer this call records its result in the classification; an
        # approved call run for a waiter (who may be gone) records it here, answered or not
        fold = kind is A.RemoteResult and self._answering.get(cid) is asyncio.current_task()
        try:
            if _timed_out(outcome.diagnostic):
                phase = (outcome.diagnostic or {}).get("phase")  # an executor's (ssh: a text)
                await self.recorder.record(A.ClientTimeout(correlation_id=cid,
                                                           phase=None if phase is None else str(phase)),
                                           durable=False)
            if fold:
                self._folded[cid] = outcome.remote_touched
            else:
                await self.recorder.record(kind(correlation_id=cid, category=str(result.category),
                                                remote_touched=outcome.remote_touched,
                                                diagnostic_id=result.diagnostic_id, reconciled=result.reconciled,
                                                **(link or {})),
                                           durable=False)
        except AuditError:
            if outcome.remote_touched:
                return make_result(Category.outcome_unknown, op.name, cid,
                                   "the remote was contacted but the result could not be recorded; "
                                   "its outcome must be treated as unknown")
            return make_result(Category.local_failure, op.name, cid,
                               "the audit log failed; nothing was recorded as sent")
        return result

    def _workdir(self, cid: str) -> str:
        self.workdir.mkdir(mode=0o700, exist_ok=True)
        path = self.workdir / cid
        path.mkdir(mode=0o700)
        return str(path)

    async def lookup(self, s: Session, cid: str | None, idem: str | None, operation: str | None) -> Result:
        self.in_flight += 1
        try:
            return await self._lookup(s, cid, idem, operation, time.time())
        finally:
            self.in_flight -= 1

    async def _lookup(self, s: Session, cid: str | None, idem: str | None, operation: str | None,
                      asked: float) -> Result:
        if cid is None and idem:
            cid = self.by_idem.get((s.run_id, s.agent, idem))
        record = self.calls.get(cid) if cid else None
        lookup_cid = _call_id(s)
        self._remember_lookup(lookup_cid)
        if record is not None and (record.agent != s.agent or record.run_id != s.run_id):
            # another agent's history is not this agent's to read: not from memory, and not from
            # the remote either (naming the operation would otherwise ask it about that call)
            return make_result(Category.success, operation or "lookup", lookup_cid,
                               "no call of this agent has that id; nothing was looked up",
                               reconciled="unknown")
        op_name = record.operation if record else operation
        op = self.catalog.get(op_name) if op_name else None
        if record is None and cid is not None and cid in self.lookup_ids:
            # an agent's slip: asked with `operation`, the remote has never seen this id and says
            # not_found, which licenses a resend of whatever the agent meant to look up
            return make_result(Category.success, operation or "lookup", lookup_cid,
                               f"{cid} names an earlier lookup, not a call; its outcome is unknown here. "
                               "Look the call up by its own correlation_id or its idempotency_key",
                               reconciled="unknown")
        if record is None and cid is not None and not cid.endswith(scope(s.run_id, s.agent)):
            # not a call the vault gave this agent in this run, before a restart or since: asking
            # the remote would tell of another's call (by its id) or probe ids nobody made
            return await self._stray(s, operation or "lookup", lookup_cid, asked)
        if op is None:
            return make_result(Category.success, operation or "lookup", lookup_cid,
                               "no operation is known for that id; tell the vault which operation to look up",
                               reconciled="unknown")
        if self.halted:
            self.recorder.refuse()
            return make_result(Category.local_failure, op.name, lookup_cid,
                               f"the vault stopped serving calls ({self.halted}); nothing was sent")
        refusal = self._refusal(cid) if record is not None and cid is not None else None
        if refusal is not None:
            # answered from what the vault knows, so also while it is locked (nothing is sent).
            # "not_found" alone licenses a resend (§6): a restart that lost the refusal would ask
            # a person who said no again. The lookup repeats the call's answer and its retry: never.
            # A malformed answer may hide a mutation: whether it took effect stays unknown.
            broken = refusal is Category.malformed_response
            result = make_result(refusal, op.name, lookup_cid,
                                 ("Its answer broke its contract; whether it took effect is unknown"
                                  if broken else "It did not take effect: it was refused")
                                 + f" ({refusal}). Do not send it again.",
                                 reconciled="unknown" if broken else "not_found")
            return await self._answer_locally(s, cid, result, asked)
        if self.gate.locked:
            return make_result(Category.vault_locked, op.name, lookup_cid,
                               "the vault is locked; nothing was sent")
        waiting = self.gate.unfinished(cid) if record is not None and cid is not None else None
        if waiting is not None:
            # not at the remote yet, and still able to run: "not_found" would license a resend
            # (two prompts, and with a remote that ignores keys two effects once both are allowed)
            if waiting.state is State.pending:
                now = f"it waits for a person's decision (request {waiting.request_id}) and runs if they allow it"
            elif waiting.run_task is None:
                now = (f"a person allowed it (request {waiting.request_id}) and it runs when collected with "
                       "its resume_token")
            else:
                now = f"a person allowed it (request {waiting.request_id}) and it is running now"
            result = make_result(
                Category.success, op.name, lookup_cid,
                f"The remote has not seen this operation yet, but it is not over: {now}. Do not send it "
                "again: collect it with call.resume (MCP: vault_resume) and this resume_token, or look it "
                "up again later.", reconciled="unknown", request_id=waiting.request_id,
                resume_token=waiting.resume_token, deadline=waiting.deadline)
            return await self._answer_locally(s, cid, result, asked)
        if record is not None and cid is not None and cid in self._answering:
            # still being performed (at the remote, or about to be): the remote's "not_found" (a
            # read leaves no trace; a mutation not committed yet) would license a resend of a call
            # whose answer is not in, as a pool's replacement worker looking up its dead worker's
            # step by key: it then resent a read answered malformed_response (retry never)
            result = make_result(Category.success, op.name, lookup_cid,
                                 "The vault is still performing this call; its outcome is not known yet. Do "
                                 "not send it again: look it up again shortly.", reconciled="unknown")
            return await self._answer_locally(s, cid, result, asked)
        wait = self.held.get(cid, 0.0) - time.time() if record is not None and cid is not None else 0.0
        if wait > 0:
            # as a refusal: "not_found" alone would license a resend before the wait its answer asked
            result = make_result(Category.rate_limited, op.name, lookup_cid,
                                 "It did not take effect: the remote was rate limited. Send it again with the "
                                 "same idempotency key after retry_after_s.", reconciled="not_found",
                                 retry_after_s=round(wait, 3))
            return await self._answer_locally(s, cid, result, asked)
        if record is not None and cid is not None and self.never_sent(cid, record):
            # the vault knows nothing reached the remote (§4 local_failure): asking a remote it
            # could not reach would answer `unknown`, and §6 says to stop at that, taking away
            # the bounded resend the call's own answer allowed
            result = make_result(Category.local_failure, op.name, lookup_cid,
                                 "It did not take effect: nothing reached the remote (local_failure). You may "
                                 "send it again with the same idempotency key, within its bound (at most 3 "
                                 "attempts in all).", reconciled="not_found")
            return await self._answer_locally(s, cid, result, asked)
        if record is None and (wait := self._remote_lookups.wait((s.run_id, s.agent), time.time())) > 0:
            return await self._paced(s, op.name, lookup_cid, wait, asked)
        prepared = await self._prepare(op, lookup_cid)
        if isinstance(prepared, Result):
            return prepared
        credential, service, executor = prepared
        idem = idem or (record.idempotency_key if record else None)  # a record here is this agent's
        ctx = self._context(s, lookup_cid, idem, None)
        self.at_remote += 1
        try:
            outcome = await executor.lookup(op, credential, service, ctx,
                                            correlation_id=cid, idempotency_key=ctx.idempotency_key)
        except Exception as exc:
            log.error("lookup on %s failed: %s", op.executor, type(exc).__name__)
            outcome = ExecOutcome(make_result(Category.success, op.name, lookup_cid,
                                              "the lookup failed; the earlier outcome is still unknown",
                                              reconciled="unknown"))
        finally:
            self.at_remote -= 1
        # the reconciliation names the call it settles, so that call's history includes it
        link: _Link | None = {"lookup_of": cid} if record is not None and cid is not None else None
        result = await self._finish(op, lookup_cid, outcome, credential, A.Reconciliation, link)
        return await self.record_result(s, result, asked=asked, lookup=link or {})

    async def _answer_locally(self, s: Session, cid: str | None, result: Result, asked: float) -> Result:
        """A lookup answered from what the vault knows, the remote not asked: recorded as settling `cid`."""
        try:
            event = A.Reconciliation(correlation_id=result.correlation_id, category=str(result.category),
                                     remote_touched=False, reconciled=result.reconciled, lookup_of=cid)
            if result.resume_token and result.request_id:
                # a told resume token, named by its request (never the token): the looker holds that wait
                event = event.model_copy(update={"request_id": result.request_id})
            await self.recorder.record(event, durable=False)
        except AuditError:
            return make_result(Category.local_failure, result.operation, result.correlation_id,
                               "the audit log failed; nothing was recorded as sent")
        return await self.record_result(s, result, asked=asked, lookup={"lookup_of": cid} if cid else {})

    def stranger(self, s: Session, cid: str | None) -> tuple[Literal["other", "unknown"], CallRecord | None] | None:
        """Whose call a lookup's correlation id names when it is not `s`'s agent's in its run
        (a restart's are its own): ("other", its record) for another agent's or run's call the
        vault remembers, ("unknown", None) for an id no call of this agent and run can have
        (made up, or another's the vault forgot); None for its own or one that may be."""
        if not cid:
            return None
        record = self.calls.get(cid)
        if record is not None:
            return None if (record.agent, record.run_id) == (s.agent, s.run_id) else ("other", record)
        return None if cid.endswith(scope(s.run_id, s.agent)) else ("unknown", None)

    async def _stray(self, s: Session, operation: str, lookup_cid: str, asked: float) -> Result:
        """A lookup of an id that names no call of this agent's: `unknown`, nothing looked up, as
        for another agent's call (§6). Recorded as refusals are sampled, per session."""
        return await self._sampled(s, make_result(Category.success, operation, lookup_cid,
                                                  "no call of this agent has that id; nothing was looked up",
                                                  reconciled="unknown"), asked)

    async def _paced(self, s: Session, operation: str, lookup_cid: str, wait: float, asked: float) -> Result:
        """A lookup the vault does not remember (a key it never saw, a call from before a restart),
        past its agent's pace (vault.daemon.limits): only the remote can answer it, and a loop of
        them would be a flood of requests through the vault. `rate_limited`, `unknown`, nothing
        looked up (§6); recorded as strays are."""
        return await self._sampled(s, make_result(
            Category.rate_limited, operation, lookup_cid,
            "Nothing was looked up: this agent asked about calls the vault does not remember faster than "
            "the vault asks the remote. Look it up again after retry_after_s; do not send it meanwhile.",
            reconciled="unknown", retry_after_s=max(0.001, round(wait, 3))), asked)

    async def _sampled(self, s: Session, result: Result, asked: float) -> Result:
        """`result`, answered without the remote: recorded the first STRAYS_RECORDED times per
        session, then at powers of two."""
        n = self._strays.pop(s.id, 0) + 1
        self._strays[s.id] = n  # (re-inserted: the newest last)
        if len(self._strays) > STRAY_SESSIONS:
            del self._strays[next(iter(self._strays))]
        if not sampled(n, STRAYS_RECORDED):
            return result
        return await self._answer_locally(s, None, result, asked)

    def _refusal(self, cid: str) -> Category | None:
        """The answer (retry never or human_required) that refused the call `cid` for good: a
        person's, the gate's or the remote's, answered to it, or one its approval request was
        settled with while nobody collected it (its waiter gone)."""
        return self.refused.get(cid) or self.gate.refusal(cid)

    # ---- approved calls collected later, requests taken back (call.resume, call.cancel) ----

    async def resume(self, s: Session, resume_token: str, wait_s: float | None) -> Result | None:
        """Collect an approval request's outcome (running it once if approved); None for a
        token this agent and run do not own."""
        asked = time.time()
        result = await self.gate.resume(s, resume_token, wait_s)
        return None if result is None else await self.record_result(s, result, resumed=True, asked=asked)

    async def cancel(self, s: Session, resume_token: str, gone: list[int] | None = None) -> dict[str, Any] | None:
        """Withdraw the agent's own request while nothing ran (None: not its token)."""
        return await self.gate.withdraw(s, resume_token, gone)


def _why_not_kept(exc: Exception) -> str:
    """Why a diagnostic was not kept, for the daemon's log: the store's own text (its directory
    and what is wrong with it) or the system's reason, never an exception's free text."""
    if isinstance(exc, VaultError):
        return exc.message[:300]
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or type(exc).__name__)
    return type(exc).__name__
