"""Every audit event as a typed model: one shape, written by the daemon, read by every reader.

Why a module of its own, beside `vault.wire` (which re-exports all of it): the
audit events are the encrypted records' contents, not notifications, and
`vault.wire` is imported by the TUI; this module needs nothing but pydantic, so
neither the TUI nor a reader pulls in the daemon or the log's crypto. It lives
outside `vault/audit/` so importing it never loads the writer.

One model per ``type`` (the discriminator), its fields and values exactly those
the daemon has always written (README "Audit log", DESIGN.md: a user contract):

    type               model             written by
    daemon_started     DaemonStarted     the daemon, before it accepts a call
    session_opened     SessionOpened     an agent opened a session
    session_closed     SessionClosed     ... and it ended
    call_requested     CallRequested     an agent asked for an operation
    prompt_unroutable  PromptUnroutable  it needed a person and none could get it
    prompt_shown       PromptShown       a person was asked
    decision           Decision          decided, expired, unroutable, withdrawn
    grant_created      GrantCreated      allow_session made a grant
    grant_ended        GrantEnded        a grant was revoked, expired, locked away
    lock / unlock      Lock / Unlock     the vault was locked / unlocked
    intent             Intent            before the credential leaves the vault
    client_timeout     ClientTimeout     the remote did not answer in time
    remote_result      RemoteResult      what an executor got back
    reconciliation     Reconciliation    what a lookup found
    classification     Classification    what the agent was told (its category)
    approver_attempt   ApproverAttempt   a process acted (or tried to) as an approver
    session_refused    SessionRefused    a process presented a session another process opened
    connection_refused ConnectionRefused a process tree reached its share of the connections
    request_refused    RequestRefused    a request or session past a client's bound
    status_asked       StatusAsked       a process an agent left behind asked vault.status (sampled)
    unknown_operation  UnknownOperation  a call or lookup named an operation no catalog has
    foreign_reference  ForeignReference  a resume, cancel or lookup named a call not the agent's
    prompt_stats       PromptStats       a run's prompt counts left the daemon's memory
    segment_started    SegmentStarted    the log rotated (the writer's own)
    log_recovered      LogRecovered      the writer found a torn or unsigned tail
    dispatch_started   DispatchStarted   (logs written before 2026-12 only)

Building one: ``Intent(correlation_id=cid, operation=..., target=...,
idempotency_key=False)``; `AuditEvent.to_event()` is the dict the log stores:
``type`` first, then exactly the fields given, in the model's order (a field
left out stays absent, a None given is written as null: the JSON of the dicts
the daemon wrote before it built models, byte for byte).

**Strict on write.** Every producer in the daemon (the gate, the call service,
the session keeper, the approver API, the daemon's start, its CLI's prompt
counts) builds a model and hands it to `vault.daemon.recorder`; the sink
(`vault.audit.writer.AuditWriter`) stores its ``to_event()``. mypy --strict
checks each producer's keyword arguments: a misspelt field, a missing required
one or a value of the wrong type is a type error before it runs (pydantic's
models are `dataclass_transform`s). At run time pydantic itself refuses the
same (``extra="forbid"``, required fields, field types, ``type`` a Literal with
its default), with no Python validator on the way: building and storing one
of a call's records costs 2-3 us more than the dict and its field check did.
``seq`` and ``time`` are the record's, and legacy fields (``status_class``)
are read, never written: they are no constructor argument (``init=False``, so
mypy refuses one) and a value given for one is refused unless read
(`_read_only`, which runs only when such a field is given). A dict (tools,
tests, the escaped form of an event whose text could not be encoded) is
checked by the sink with `check_fields` (type and field names, under 1 us) or,
with ``VAULTSIM_AUDIT_CHECK=full``, `check_event` (values too); a misfit is an
`AuditEventError` (an `AuditError`; nothing is written).

**Tolerant on read** (`read_event`, what `audit show`, the runner's transcript
and its evidence use): a field this version does not know is dropped before
validating (a newer daemon's); a field an older daemon did not write takes the
default below; an older log's shapes still read: an event that carried its own
``time`` keeps it (else ``time`` is the record's commit time, as
`decrypt_events` gives it), ``remote_result`` with ``status_class`` in place
of ``category``, ``dispatch_started``. An event of an unknown type, or one that
does not fit its model (a field of the wrong type), reads as `OtherEvent` with
its fields as they were, so a reader shows it rather than failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import (BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError,
                      ValidationInfo, field_validator)

from vault.errors import AuditError

__all__ = [
    "AuditEvent", "AuditEventError", "AnyAuditEvent", "EVENT_ADAPTER", "EVENT_MODELS", "OtherEvent",
    "DaemonStarted", "SessionOpened", "SessionClosed", "CallRequested", "PromptUnroutable", "PromptShown",
    "Decision", "GrantCreated", "GrantEnded", "Lock", "Unlock", "Intent", "ClientTimeout", "RemoteResult",
    "Reconciliation", "Classification", "ApproverAttempt", "SessionRefused", "ConnectionRefused", "RequestRefused",
    "StatusAsked", "UnknownOperation", "ForeignReference",
    "PromptStats", "SegmentStarted", "LogRecovered",
    "DispatchStarted", "check_fields", "check_event", "read_event", "read_events", "explain",
]

_READING = "vault.audit_events.read"  # the validation context key that lets seq, time, legacy in
_META = frozenset({"seq", "time"})  # the record's, filled in by readers
_READ_CONTEXT = {_READING: True}


class AuditEventError(AuditError):
    """An audit event that does not fit its model; names the type and fields, never a value."""

    code = "audit_event_invalid"


class AuditEvent(BaseModel):
    """One audit event. Subclasses fix ``type``; ``seq`` and ``time`` are set when read."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    TYPE: ClassVar[str]
    type: str
    # the record's, set by readers only: not a constructor argument (mypy refuses one), and
    # refused at run time unless read (`_read_only`)
    seq: int | None = Field(default=None, init=False)
    time: float | None = Field(default=None, init=False)  # commit time, or an older event's own
    # set by the daemon when it had to escape an event's text to record it at all
    recorded_as: str | None = None

    @field_validator("seq", "time", mode="before")
    @classmethod
    def _read_only(cls, value: Any, info: ValidationInfo) -> Any:
        # runs only when the field is given, so a producer's model costs nothing for it
        return _read_only(value, info)

    # the fields `to_event` may write, in the model's order (set per model: type, seq, time never)
    WRITTEN: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.WRITTEN = tuple(n for n in cls.model_fields if n not in _META and n != "type")

    def to_event(self) -> dict[str, Any]:
        """The dict the log stores: ``type`` first, then every field given (None included), in
        the model's order; never ``seq`` or ``time``. Nested values are shared, not copied.
        (On every record's path: a comprehension over the model's own dict, half the cost
        of a model_dump.)"""
        given, values = self.__pydantic_fields_set__, self.__dict__
        return {"type": self.type, **{k: values[k] for k in self.WRITTEN if k in given}}


def _read_only(value: Any, info: ValidationInfo) -> Any:
    if isinstance(info.context, dict) and info.context.get(_READING):
        return value
    raise ValueError(f"{info.field_name} is read, never written"
                     + (" (seq and time are the record's)" if info.field_name in _META else ""))


class DaemonStarted(AuditEvent):
    TYPE = "daemon_started"
    type: Literal["daemon_started"] = "daemon_started"
    pid: int | None = None
    version: str = ""


class SessionOpened(AuditEvent):
    """An agent session opened by process `pid` (its `sid`, `pgid`). `lineage`: that process and
    its ancestors when it connected (vault.lineage), absent when they could not be read (and in
    logs written before 2026-12): the runner tells from it whether the opener was another run's."""

    TYPE = "session_opened"
    type: Literal["session_opened"] = "session_opened"
    session_id: str
    agent: str | None = None
    pid: int | None = None
    sid: int | None = None
    pgid: int | None = None
    run_id: str | None = None
    # the opener's client label as approvers get it (the shape of vault.wire.WireClient); a claim
    client: dict[str, JsonValue] | None = None
    lineage: list[tuple[int, float]] | None = None  # (pid, start time) up to init, as ApproverAttempt's
    # with a lineage: the children of its tree's root (a keeper) older than it, read then (the
    # agent among them while it was there: vault.daemon.processes.kin_of), and which of those and
    # of its ancestors below that root had exited then (CallRequested's `gone`). Absent in older logs
    kin: list[tuple[int, float]] | None = None
    gone: list[int] | None = None


class SessionClosed(AuditEvent):
    TYPE = "session_closed"
    type: Literal["session_closed"] = "session_closed"
    session_id: str
    reason: str = ""


class CallRequested(AuditEvent):
    TYPE = "call_requested"
    type: Literal["call_requested"] = "call_requested"
    correlation_id: str
    session_id: str | None = None
    operation: str = ""
    risk: str = ""
    target: str | None = None
    # the ref of a `foreign_reference` (by key) this call's key clears: the looker sent that key
    # itself, so the text was its own step's (picked alike with another agent's by chance)
    key_lookup: int | None = None
    # the pids of the sender's recorded ancestors (its session's lineage) below the one it shares
    # with the daemon (an agent's keeper), and of its session's `kin`, that had exited as the call
    # came (vault.daemon.gone_watch): the runner tells a request after its agent's exit by it, not
    # by clocks. Absent when no lineage was recorded and in logs written before 2026-12-07
    gone: list[int] | None = None


class PromptUnroutable(AuditEvent):
    TYPE = "prompt_unroutable"
    type: Literal["prompt_unroutable"] = "prompt_unroutable"
    correlation_id: str
    operation: str = ""
    owner: str | None = None


class PromptShown(AuditEvent):
    TYPE = "prompt_shown"
    type: Literal["prompt_shown"] = "prompt_shown"
    request_id: str
    correlation_id: str | None = None
    operation: str = ""
    risk: str | None = None
    session_id: str | None = None
    mode: str | None = None
    scope: str = ""
    repeat: bool = False


class Decision(AuditEvent):
    """`decision`: allow_once, allow_session, deny, or how a prompt ended without one
    (expired, unroutable, withdrawn). The timings (vault.gate.fatigue) are absent in older
    logs; `by`, `was` and `session_id` (the session that withdrew it: another task of the same
    name may hold the token, vault.runner.foreign_refs) only when the agent withdrew its request;
    with them `gone`, when the withdrawing session's opener's ancestry was recorded: the pids of
    those ancestors that had exited when the withdrawal came (read then, vault.lineage.ancestors_gone;
    the runner tells a withdrawal after the agent's exit by it, not by clocks; absent in older logs)."""

    TYPE = "decision"
    type: Literal["decision"] = "decision"
    request_id: str
    correlation_id: str | None = None
    decision: str
    approver: str | None = None
    asked: float | None = None
    shown: float | None = None
    detail: float | None = None
    decided: float | None = None
    detail_viewed: bool | None = None
    reason: str | None = None
    by: str | None = None
    was: str | None = None
    session_id: str | None = None
    gone: list[int] | None = None


class _Grant(AuditEvent):
    session_id: str
    scope: str = ""
    grant_id: str | None = None


class GrantCreated(_Grant):
    TYPE = "grant_created"
    type: Literal["grant_created"] = "grant_created"


class GrantEnded(_Grant):
    TYPE = "grant_ended"
    type: Literal["grant_ended"] = "grant_ended"
    reason: str = ""


class Lock(AuditEvent):
    TYPE = "lock"
    type: Literal["lock"] = "lock"
    by: str | None = None
    epoch: int | None = None
    pending_denied: int | None = None
    grants_ended: int | None = None


class Unlock(AuditEvent):
    TYPE = "unlock"
    type: Literal["unlock"] = "unlock"
    by: str | None = None
    epoch: int | None = None


class Intent(AuditEvent):
    """On disk (fdatasync) before the credential leaves the vault. `idempotency_key`: whether
    the call had one (never the key itself)."""

    TYPE = "intent"
    type: Literal["intent"] = "intent"
    correlation_id: str
    operation: str = ""
    target: str | None = None
    idempotency_key: bool | None = None


class ClientTimeout(AuditEvent):
    TYPE = "client_timeout"
    type: Literal["client_timeout"] = "client_timeout"
    correlation_id: str
    phase: str | None = None


class _Outcome(AuditEvent):
    """What an executor got back. `lookup_of`: the call a lookup reconciled."""

    correlation_id: str
    category: str | None = None
    remote_touched: bool | None = None
    diagnostic_id: str | None = None
    reconciled: str | None = None
    lookup_of: str | None = None
    # logs written before 2026-12 carried it in place of category; read, never written
    status_class: str | None = Field(default=None, init=False)

    @field_validator("status_class", mode="before")
    @classmethod
    def _legacy(cls, value: Any, info: ValidationInfo) -> Any:
        return _read_only(value, info)


class RemoteResult(_Outcome):
    TYPE = "remote_result"
    type: Literal["remote_result"] = "remote_result"


class Reconciliation(_Outcome):
    """A lookup's answer. `request_id`: the pending request whose resume token it told (the call
    still waited for its owner, section 6): the looking process then held that wait. Optional:
    older logs have none."""

    TYPE = "reconciliation"
    type: Literal["reconciliation"] = "reconciliation"
    request_id: str | None = None


class Classification(AuditEvent):
    """What the agent was told: the category of the call, with its retry instruction.
    `remote_touched`: the executor's, when no remote_result record was written for it. `asked`:
    a resume's or lookup's, when its request reached the vault (a call's is its call_requested
    record's time): the answer can come later by the remote's time, which is not the agent's."""

    TYPE = "classification"
    type: Literal["classification"] = "classification"
    correlation_id: str
    session_id: str | None = None  # older logs name it on the request only
    operation: str = ""
    category: str
    retry: str = ""
    diagnostic_id: str | None = None
    resumed: bool = False
    remote_touched: bool | None = None
    asked: float | None = None
    # a never or outcome_unknown answer's, or a lookup's `unknown` (not a paced one): the told process's
    # children when it was given, (pid, start) as vault.lineage reads them: a pool's workers started
    # before it, whatever the clock tick. Optional: older logs have none
    children: list[tuple[int, float]] | None = None
    gone: list[int] | None = None  # with `asked`: as CallRequested's, read as the request came


class ApproverAttempt(AuditEvent):
    """A hello, decide, lock or unlock on the approver socket, accepted or refused; `name` and
    `request_id` as sent (bounded). Method `connect`: a process opened a connection to it (its
    first 8, then its 16th, 32nd, ...: vault.daemon.approver_api). `lineage`: the process
    and its ancestors when it acted (vault.lineage). `opener_pid`, `opener_lineage`: who opened
    the connection it acted on."""

    TYPE = "approver_attempt"
    type: Literal["approver_attempt"] = "approver_attempt"
    method: str
    pid: int
    sid: int | None = None
    pgid: int | None = None
    exe: str | None = None
    accepted: bool = False
    reason: str = ""
    name: str | None = None
    request_id: str | None = None
    # the process and its ancestors, (pid, start time) up to init (vault.lineage): the runner
    # tells from it whether the process was another run's, after it is gone
    lineage: list[tuple[int, float]] | None = None
    # the process that opened the connection (SO_PEERCRED at accept, which no process can name
    # for another, unlike a line's writer): its pid on every method but `connect`, and its
    # ancestry as read at accept when it is not the writer (absent when unknown, and in older logs)
    opener_pid: int | None = None
    opener_lineage: list[tuple[int, float]] | None = None


class SessionRefused(AuditEvent):
    """A session-bearing request (call, call.resume, lookup, call.cancel, session.close)
    refused because the process that sent it (`pid`, its `sid`, `pgid` and `exe`) is not the
    one that opened `session_id` (`owner_pid`): `reason` is ``not_owner`` (the owner still
    runs), ``owner_exited`` or ``closed`` (the session had already ended); or ``ended``: the
    sender's own session, which had ended (closed, or its connection gone). `operation` as
    sent (bounded), when the request named one. `count`: the sender's connection's refused
    requests so far (past the 32nd only powers of two are recorded: vault.daemon.agent_api).
    Never the parameters, a resume token or an idempotency key."""

    TYPE = "session_refused"
    type: Literal["session_refused"] = "session_refused"
    session_id: str
    method: str
    operation: str | None = None
    pid: int
    sid: int | None = None
    pgid: int | None = None
    exe: str | None = None
    owner_pid: int | None = None
    reason: str = ""
    count: int | None = None
    # the sender and its ancestors (vault.lineage), absent when unknown (and in older logs): the
    # runner tells from it whether the sender was another run's
    lineage: list[tuple[int, float]] | None = None


class ConnectionRefused(AuditEvent):
    """A connection refused because the process tree of the process that made it (`pid`, its
    `sid`, `pgid` and `exe`; the tree's root `tree_pid`, vault.daemon.processes) already held
    `held` connections, its share (vault.daemon.limits), or the process itself did (`where`). `count`: the tree's refusals so far
    (past the 32nd only powers of two are recorded)."""

    TYPE = "connection_refused"
    type: Literal["connection_refused"] = "connection_refused"
    pid: int
    sid: int | None = None
    pgid: int | None = None
    exe: str | None = None
    tree_pid: int
    held: int
    count: int
    lineage: list[tuple[int, float]] | None = None  # as SessionRefused's
    # "process" when the process itself held its share (256; `held` is then its own count),
    # absent when its tree did (and in logs written before 2026-12-05)
    where: str | None = None


class RequestRefused(AuditEvent):
    """A request refused -32004 (nothing done) for a bound of vault.daemon.limits: `limit`
    "in_progress" (the requests already in progress) or "sessions" (a `session.open` past the
    open sessions), `where` the bound held: "connection", "process", "tree" (of the process
    tree rooted at `tree_pid`) or "all", `at_most` that bound. `pid` and the rest are the
    process whose requests or sessions are counted (for requests, the connection's opener).
    `count`: the tree's such refusals so far (past the 32nd only powers of two are recorded)."""

    TYPE = "request_refused"
    type: Literal["request_refused"] = "request_refused"
    pid: int
    sid: int | None = None
    pgid: int | None = None
    exe: str | None = None
    tree_pid: int
    limit: str
    where: str
    at_most: int
    count: int
    lineage: list[tuple[int, float]] | None = None  # as SessionRefused's


class StatusAsked(AuditEvent):
    """A process an agent left behind (`pid`, its `sid`, `pgid`, `exe`, `lineage` as
    SessionRefused's) asked `vault.status`, at `asked`: one below, or in the process group or cgroup
    of, a process that opened an agent session and has exited (vault.daemon.status_asks); the runner
    names it when the ask came after its agent exited (FAIL_DEADLINE). Other processes' asks (a
    fixture's, `vaultsim status`'s) are never recorded. Sampled per process: its first 8, then
    powers of two (`count`). Never durable on its own (no fsync of its own)."""

    TYPE = "status_asked"
    type: Literal["status_asked"] = "status_asked"
    pid: int
    sid: int | None = None
    pgid: int | None = None
    exe: str | None = None
    count: int
    asked: float | None = None
    lineage: list[tuple[int, float]] | None = None
    kin: list[tuple[int, float]] | None = None  # with a lineage: as SessionOpened's
    gone: list[int] | None = None  # with a lineage: as CallRequested's, read as it asked


class UnknownOperation(AuditEvent):
    """A `call` (refused -32602, nothing done) or a `lookup` (answered `reconciled: unknown`)
    that named an operation the vault's catalog does not have, in a session the sender owns:
    tool misuse a report names. `operation` as sent (bounded, an agent's text). `count`: the
    connection's such requests so far (past the 32nd only powers of two are recorded, as for
    `session_refused`). Never the parameters' values or a key. Also a `call` of an operation the
    catalog has, refused -32602 for parameters it does not declare: `unknown_params` names them
    (bounded; an agent's text), or for values its declared ones refuse: `refused_params` names
    those (never the values): a parameter or value no step gives is tool misuse though nothing ran."""

    TYPE = "unknown_operation"
    type: Literal["unknown_operation"] = "unknown_operation"
    session_id: str
    method: str
    operation: str
    count: int | None = None
    unknown_params: list[str] | None = None
    refused_params: list[str] | None = None


class ForeignReference(AuditEvent):
    """A `call.resume` or `call.cancel` (refused -32602, nothing done) or a `lookup` (answered
    `reconciled: unknown`, nothing looked up) in a session the sender owns that named a call not
    its agent's in this run: `whose` is ``other`` (another agent's or run's: `owner` is that
    agent's name, `owner_run` false when it is another run's) or ``unknown`` (a token the
    daemon never issued in its life, or a correlation id no call of this agent and run can
    have: made up, or another's from before a restart). Never the token or the id (a token is
    a secret). `count` as for `unknown_operation` (the connection's such requests so far).
    `by: idempotency_key`: a lookup by a key text another agent (`owner`) sent and this agent
    and run had not (answered for the looker's own key; never the text, which may hold a
    secret), `key_lookup` the ref a later `call_requested` of the looker's under that text
    carries (then it was its own)."""

    TYPE = "foreign_reference"
    type: Literal["foreign_reference"] = "foreign_reference"
    session_id: str
    method: str
    whose: Literal["other", "unknown"]
    owner: str | None = None
    owner_run: bool | None = None
    operation: str | None = None
    count: int | None = None
    by: Literal["idempotency_key"] | None = None
    key_lookup: int | None = None


class PromptStats(AuditEvent):
    """A run's prompt counts (vault.gate.stats) as it left the daemon's memory."""

    TYPE = "prompt_stats"
    type: Literal["prompt_stats"] = "prompt_stats"
    run_id: str | None = None
    prompts: int = 0
    by_operation: dict[str, int] = {}
    by_risk: dict[str, int] = {}
    scopes_asked: dict[str, int] = {}
    scopes_granted: dict[str, int] = {}
    decisions: dict[str, int] = {}
    time_to_decision_ms: dict[str, JsonValue] = {}
    repeated_scope_prompts: int = 0
    read_prompts: int = 0
    destructive_session_grants: int = 0
    unroutable: int = 0
    locked_refusals: int = 0
    fatigue: dict[str, JsonValue] | None = None


class SegmentStarted(AuditEvent):
    """The first record of a segment: after the `previous` one, or finishing a rotation a
    crash interrupted (`after_crash`)."""

    TYPE = "segment_started"
    type: Literal["segment_started"] = "segment_started"
    previous: str | None = None
    after_crash: bool | None = None


class LogRecovered(AuditEvent):
    TYPE = "log_recovered"
    type: Literal["log_recovered"] = "log_recovered"
    unanchored_records: int = 0
    torn_bytes: int = 0


class LogResumed(AuditEvent):
    """The log failed for lack of room (a full disk or quota) and was written again once there
    was room: what failed, when (`failed_at`, epoch seconds), how long calls were refused
    (`halted_s`) and how many (`refused_calls`, the one whose write failed included). Chained
    after the last record the disk holds."""

    TYPE = "log_resumed"
    type: Literal["log_resumed"] = "log_resumed"
    failed: str
    failed_at: float
    halted_s: float
    refused_calls: int = 0


class DispatchStarted(AuditEvent):
    """Written before 2026-12 between an intent and its result; read, never written now."""

    TYPE = "dispatch_started"
    type: Literal["dispatch_started"] = "dispatch_started"
    correlation_id: str


class OtherEvent(AuditEvent):
    """What a reader makes of an event of a type it does not know, or one that does not fit
    its model: its type (as text) and its other fields as they were."""

    TYPE = "other"
    fields: dict[str, Any] = {}  # as decrypted: untyped by nature


AnyAuditEvent: TypeAlias = Annotated[
    DaemonStarted | SessionOpened | SessionClosed | CallRequested | PromptUnroutable | PromptShown
    | Decision | GrantCreated | GrantEnded | Lock | Unlock | Intent | ClientTimeout | RemoteResult
    | Reconciliation | Classification | ApproverAttempt | SessionRefused | ConnectionRefused | RequestRefused
    | StatusAsked | UnknownOperation | ForeignReference | PromptStats | SegmentStarted | LogRecovered | LogResumed | DispatchStarted,
    Field(discriminator="type")]
# the discriminated union as one way in: EVENT_ADAPTER.validate_python(d, context=...) picks by `type`
EVENT_ADAPTER: TypeAdapter[AnyAuditEvent] = TypeAdapter(AnyAuditEvent)

EVENT_MODELS: dict[str, type[AuditEvent]] = {m.TYPE: m for m in (
    DaemonStarted, SessionOpened, SessionClosed, CallRequested, PromptUnroutable, PromptShown, Decision,
    GrantCreated, GrantEnded, Lock, Unlock, Intent, ClientTimeout, RemoteResult, Reconciliation,
    Classification, ApproverAttempt, SessionRefused, ConnectionRefused, RequestRefused, StatusAsked, UnknownOperation,
    ForeignReference, PromptStats, SegmentStarted, LogRecovered, LogResumed, DispatchStarted)}
_WRITABLE = {t: m for t, m in EVENT_MODELS.items() if m is not DispatchStarted}
# per writable type: (the fields a producer may give, those it must); seq, time and the legacy
# fields are ``init=False``: read, never written
_SHAPES = {t: (frozenset(n for n, f in m.model_fields.items() if f.init is not False),
               frozenset(n for n, f in m.model_fields.items() if f.is_required()))
           for t, m in _WRITABLE.items()}


def check_fields(event: Mapping[str, Any]) -> None:
    """A dict's write check (under 1 us; `check_event`, values too, costs a few us): a known
    ``type``, no field a producer may not write (a misspelt one, seq, time, a legacy one),
    every required field given. AuditEventError if not; values are not checked."""
    kind = event.get("type")
    shape = _SHAPES.get(kind) if isinstance(kind, str) else None
    if shape is None:
        raise _unknown(kind)
    allowed, required = shape
    keys = event.keys()
    if keys <= allowed and required <= keys:
        return
    unknown = sorted(str(k) for k in keys - allowed)
    missing = sorted(required - keys)
    raise AuditEventError(f"malformed {kind} audit event: " + "; ".join(
        f"{what}: {', '.join(names)}" for what, names
        in (("no such field", unknown), ("field required", missing)) if names))


def check_event(event: Mapping[str, Any]) -> AuditEvent:
    """`event` (a dict a producer wrote) as its model, strictly, values included (see the
    module doc); AuditEventError if it does not fit."""
    check_fields(event)  # the type, and no field a producer may not write (seq, time, legacy)
    model = _WRITABLE[event["type"]]
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        raise AuditEventError(f"malformed {event['type']} audit event: {explain(exc)}") from None


def read_event(event: Mapping[str, Any]) -> AuditEvent:
    """One decrypted event (with the record's ``seq`` and ``time``) as its model, tolerantly:
    fields the model does not know are dropped; an unknown type, or an event that does not
    fit, is an `OtherEvent`."""
    kind = event.get("type")
    model = EVENT_MODELS.get(kind) if isinstance(kind, str) else None
    if model is not None:
        known = model.model_fields
        try:
            return model.model_validate({k: v for k, v in event.items() if k in known},
                                        context=_READ_CONTEXT)
        except ValidationError:
            pass
    return OtherEvent.model_construct(
        type=str(kind) if kind is not None else "event", seq=_int(event.get("seq")),
        time=_float(event.get("time")),
        fields={k: v for k, v in event.items() if k not in _META and k != "type"})


def read_events(events: list[dict[str, Any]]) -> list[AuditEvent]:
    return [read_event(ev) for ev in events]


def _unknown(kind: object) -> AuditEventError:
    shown = repr(kind[:64]) if isinstance(kind, str) else type(kind).__name__
    return AuditEventError(f"unknown audit event type {shown}")


def explain(exc: ValidationError) -> str:
    """Which fields and what is wrong with them, never their values."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "event"
        parts.append(f"{where}: {err['msg'].lower()}")
    return "; ".join(parts)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
