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
    prompt_stats       PromptStats       a run's prompt counts left the daemon's memory
    segment_started    SegmentStarted    the log rotated (the writer's own)
    log_recovered      LogRecovered      the writer found a torn or unsigned tail
    dispatch_started   DispatchStarted   (logs written before 2026-12 only)

Building one: ``Intent(correlation_id=cid, operation=..., target=...,
idempotency_key=False)``; `AuditEvent.to_event()` is the dict the log stores,
with exactly the fields given (a field left out stays absent, a None given is
written as null: the JSON of today's dicts, byte for byte).

**Strict on write**: the daemon's audit sink (`vault.audit.adapter.open_audit`)
runs `check_fields` on every dict it is given: an unknown ``type``, a field the
model does not have (a misspelt one) or a missing required field is an
`AuditEventError` (an `AuditError`; nothing is written), so a producer's typo
cannot drift from the readers silently. `check_event` (the model's full
validation, values included) costs 20-40 us a record, too much for the three
records of every call: the sink runs it only with ``VAULTSIM_AUDIT_CHECK=full``
(tests, debugging). ``seq`` and ``time`` are the record's, never the event's;
``status_class`` and ``dispatch_started`` are read, never written.

**Tolerant on read** (`read_event`, what `audit show`, the runner's transcript
and its evidence use): a field this version does not know is ignored (a newer
daemon's); a field an older daemon did not write takes the default below;
an older log's shapes still read: an event that carried its own ``time`` keeps
it (else ``time`` is the record's commit time, as `decrypt_events` gives it),
``remote_result`` with ``status_class`` in place of ``category``,
``dispatch_started``. An event of an unknown type, or one that does not fit its
model (a field of the wrong type), reads as `OtherEvent` with its fields as
they were, so a reader shows it rather than failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import (BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError,
                      ValidationInfo, model_validator)

from vault.errors import AuditError

__all__ = [
    "AuditEvent", "AuditEventError", "AnyAuditEvent", "EVENT_ADAPTER", "EVENT_MODELS", "OtherEvent",
    "DaemonStarted", "SessionOpened", "SessionClosed", "CallRequested", "PromptUnroutable", "PromptShown",
    "Decision", "GrantCreated", "GrantEnded", "Lock", "Unlock", "Intent", "ClientTimeout", "RemoteResult",
    "Reconciliation", "Classification", "ApproverAttempt", "PromptStats", "SegmentStarted", "LogRecovered",
    "DispatchStarted", "check_fields", "check_event", "read_event", "read_events", "explain",
]

_READING = "vault.audit_events.read"  # the validation context key that makes a parse tolerant
_META = frozenset({"seq", "time"})  # the record's, filled in by readers


class AuditEventError(AuditError):
    """An audit event that does not fit its model; names the type and fields, never a value."""

    code = "audit_event_invalid"


class AuditEvent(BaseModel):
    """One audit event. Subclasses fix ``type``; ``seq`` and ``time`` are set when read."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    TYPE: ClassVar[str]
    # fields a reader may meet in an older log that no producer may write
    LEGACY: ClassVar[frozenset[str]] = frozenset()
    type: str
    seq: int | None = None  # the record's (read side only)
    time: float | None = None  # the record's commit time, or an older event's own (read side only)
    # set by the daemon when it had to escape an event's text to record it at all
    recorded_as: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _tolerant_read_strict_write(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        reading = isinstance(info.context, dict) and info.context.get(_READING)
        if reading:  # what this version does not know is dropped, not an error
            data = {k: v for k, v in data.items() if k in cls.model_fields}
        else:
            bad = [str(k) for k in data if k not in cls.model_fields or k in _META or k in cls.LEGACY]
            if bad:
                raise ValueError(f"{getattr(cls, 'TYPE', cls.__name__)} has no field(s) {', '.join(sorted(bad))} to write"
                                 + (" (seq and time are the record's)" if _META & set(bad) else ""))
        if "type" not in data and hasattr(cls, "TYPE"):  # `type` always counts as given
            data = {"type": cls.TYPE, **data}
        return data

    def to_event(self) -> dict[str, Any]:
        """The dict the log stores: ``type`` and every field given (None included), in order."""
        return self.model_dump(mode="json", exclude_unset=True, exclude={"seq", "time"})


class DaemonStarted(AuditEvent):
    TYPE = "daemon_started"
    type: Literal["daemon_started"] = "daemon_started"
    pid: int | None = None
    version: str = ""


class SessionOpened(AuditEvent):
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
    logs; `by` and `was` only when the agent withdrew its request."""

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

    LEGACY = frozenset({"status_class"})
    correlation_id: str
    category: str | None = None
    remote_touched: bool | None = None
    diagnostic_id: str | None = None
    reconciled: str | None = None
    lookup_of: str | None = None
    status_class: str | None = None  # logs written before 2026-12 carried it in place of category


class RemoteResult(_Outcome):
    TYPE = "remote_result"
    type: Literal["remote_result"] = "remote_result"


class Reconciliation(_Outcome):
    TYPE = "reconciliation"
    type: Literal["reconciliation"] = "reconciliation"


class Classification(AuditEvent):
    """What the agent was told: the category of the call, with its retry instruction.
    `remote_touched`: the executor's, when no remote_result record was written for it."""

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


class ApproverAttempt(AuditEvent):
    """A hello, decide, lock or unlock on the approver socket, accepted or refused; `name` and
    `request_id` as sent (bounded)."""

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
    | Reconciliation | Classification | ApproverAttempt | PromptStats | SegmentStarted | LogRecovered
    | DispatchStarted,
    Field(discriminator="type")]
# the discriminated union as one way in: EVENT_ADAPTER.validate_python(d, context=...) picks by `type`
EVENT_ADAPTER: TypeAdapter[AnyAuditEvent] = TypeAdapter(AnyAuditEvent)

EVENT_MODELS: dict[str, type[AuditEvent]] = {m.TYPE: m for m in (
    DaemonStarted, SessionOpened, SessionClosed, CallRequested, PromptUnroutable, PromptShown, Decision,
    GrantCreated, GrantEnded, Lock, Unlock, Intent, ClientTimeout, RemoteResult, Reconciliation,
    Classification, ApproverAttempt, PromptStats, SegmentStarted, LogRecovered, DispatchStarted)}
_WRITABLE = {t: m for t, m in EVENT_MODELS.items() if m is not DispatchStarted}
# per writable type: (the fields a producer may give, those it must)
_SHAPES = {t: (frozenset(m.model_fields) - _META - m.LEGACY,
               frozenset(n for n, f in m.model_fields.items() if f.is_required()))
           for t, m in _WRITABLE.items()}


def check_fields(event: Mapping[str, Any]) -> None:
    """The write check cheap enough for every record (about 1 us, against 20-40 us for a
    full validation): a known ``type``, no field its model lacks (a misspelt one), every
    required field given. AuditEventError if not; values are not checked (`check_event`)."""
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
    kind = event.get("type")
    model = _WRITABLE.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise _unknown(kind)
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        raise AuditEventError(f"malformed {kind} audit event: {explain(exc)}") from None


def read_event(event: Mapping[str, Any]) -> AuditEvent:
    """One decrypted event (with the record's ``seq`` and ``time``) as its model, tolerantly:
    an unknown type, or an event that does not fit, is an `OtherEvent`."""
    kind = event.get("type")
    model = EVENT_MODELS.get(kind) if isinstance(kind, str) else None
    if model is not None:
        try:
            return model.model_validate(event, context={_READING: True})
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
