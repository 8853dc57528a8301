"""The approver socket's notifications as typed models: one shape, written once, read by all.

The daemon (the gate, the call pipeline, the session table) builds these and the
approver hub sends them as JSON-RPC notifications; the TUI's state, the scripted
approver, the runner's transcript and the client read them back through
`parse_notification`. One model per method, so a field renamed on one side
cannot drift unnoticed on the other:

    method              model               required to read   sent when
    approval.requested  ApprovalRequested   request_id         a call needs a person
    approval.settled    ApprovalSettled     request_id, state  decided, expired, locked, unroutable, withdrawn
    grant.created       GrantCreated        grant_id, ...      allow_session made a grant
    grant.ended         GrantEnded          grant_id, ...      a grant was revoked, expired, locked away
    vault.locked        VaultLocked         locked             lock / unlock
    session.opened      SessionOpened       session_id         an agent opened a session
    session.closed      SessionClosed       session_id         ... and it ended
    activity            Activity            correlation_id     an agent was told a result

One answer is typed here too, because it carries agent-chosen text to every
approver: `approval.detail`'s (`ApprovalDetail`), a waiting request's
parameters in full (the notification cuts each to 80 characters).

Strict on write, tolerant on read. A producer gives every field (a field left
out or misspelt is an error, so the wire never silently loses one). A reader
parses with `parse_notification` (or `read`): fields it does not know are
dropped (a newer daemon may add some), fields an older daemon did not send take
the defaults below; only the fields a reader cannot do without are required,
and a notification missing one, or with a field of the wrong type, is a
`WireError` naming the method and the field (never the value: it may be text an
agent chose).

The JSON is the wire protocol users rely on (README, DESIGN.md): field names,
order and values are those the daemon always sent. A field in `OMIT_IF_NONE`
is left out when it is None (e.g. `client`, `by`), as before; every other field
is always present, None included.

The audit events (the records of the audit log) are typed the same way, in
`vault.audit_events` (its own module: they are not notifications, and they are
built on every call's hot path, so their write check is pydantic's own, with
no Python validator: the daemon's producers build the models, mypy checks
their fields); they are re-exported here, so ``vault.wire`` is where
every shape the daemon sends or records is found: ``wire.AuditEvent``,
``wire.read_event``, ``wire.check_event`` and the models as
``wire.audit_events.Intent`` etc. (a notification and an audit event may share
a name, e.g. ``SessionOpened``; the bare name here is the notification's).

No import here of the daemon, the JSON-RPC layer, the runner or Textual: the TUI
imports this module.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import (BaseModel, ConfigDict, SerializerFunctionWrapHandler, ValidationError,
                      ValidationInfo, model_serializer, model_validator)

from vault import audit_events
from vault.audit_events import (EVENT_MODELS, AnyAuditEvent, AuditEvent, AuditEventError, check_event,
                           read_event, read_events)
from vault.audit_events import explain as _why
from vault.errors import VaultError

__all__ = ["WireError", "Notification", "WireClient", "ApprovalRequested", "ApprovalSettled",
           "GrantFields", "GrantCreated", "GrantEnded", "VaultLocked", "SessionOpened", "SessionClosed", "Activity",
           "ApprovalDetail",
           "MODELS", "parse_notification", "read",
           # the audit events (vault.audit_events)
           "audit_events", "AuditEvent", "AuditEventError", "AnyAuditEvent", "EVENT_MODELS", "check_event",
           "read_event", "read_events"]

_READING = "vault.wire.read"  # the validation context key that makes a parse tolerant


class WireError(VaultError):
    """A notification that does not fit its model (a field missing or of the wrong type)."""

    code = "wire_error"


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    # left out of the JSON when None (absent on the wire, as before these models)
    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _tolerant_read_strict_write(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        if isinstance(info.context, dict) and info.context.get(_READING):
            # reading: what this version does not know is dropped, not an error
            return {k: v for k, v in data.items() if k in cls.model_fields}
        # writing: every field is given (None where it is none), none is forgotten or misspelt
        missing = [n for n in cls.model_fields if n not in data and n not in cls.OMIT_IF_NONE]
        unknown = [str(k) for k in data if k not in cls.model_fields]
        if missing or unknown:
            raise ValueError(f"{cls.__name__} is written with every field and no other; "
                             + "; ".join(f"{what}: {', '.join(names)}" for what, names
                                         in (("not given", missing), ("unknown", unknown)) if names))
        return data

    @model_serializer(mode="wrap")
    def _omit(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for name in self.OMIT_IF_NONE:
            if out.get(name, 0) is None:
                del out[name]
        return out


class WireClient(_Wire):
    """A session's client label as approvers get it: a claim its opener made (vault.daemon.sessions)."""

    OMIT_IF_NONE = frozenset({"version", "host_pid", "via"})
    name: str = ""
    version: str | None = None
    host_pid: int | None = None
    via: str | None = None
    text: str = ""  # e.g. "claude-code 1.2 (pid 4121) via mcp"
    claimed: bool = True
    host_verified: bool = False  # the daemon confirmed host_pid is an ancestor of the opener


class Notification(_Wire):
    """One notification on the approver socket; `METHOD` is its JSON-RPC method."""

    METHOD: ClassVar[str]

    def to_params(self) -> dict[str, Any]:
        """The JSON-RPC `params` object, exactly as the wire carries it."""
        return self.model_dump()


class ApprovalRequested(Notification):
    """A call waits for a person (vault.gate.approvals.PendingApproval)."""

    METHOD = "approval.requested"
    OMIT_IF_NONE = frozenset({"client"})
    request_id: str
    agent: str = "?"
    pid: int | None = None
    session_id: str = ""
    run_id: str | None = None
    operation: str = "?"
    risk: str = "?"
    params: dict[str, Any] = {}  # only those marked safe to show, truncated (vault.catalog)
    scope: str = ""
    session_scope: str = ""  # what allow_session would grant, in plain words
    mode: str = ""  # "session" or "per_call"
    allow_session_offered: bool = False
    owner: str | None = None  # the only approver who may decide it (None: any)
    deadline: float = 0.0  # wall clock, seconds since the epoch
    created: float = 0.0
    correlation_id: str = ""
    client: WireClient | None = None


class ApprovalDetail(_Wire):
    """The answer to `approval.detail`: a waiting request with every parameter marked safe to
    show in full (at most the catalog's MAX_TEXT characters each, as validated); the others
    are `[hidden]` here too. Only the agent's own parameters: never a credential."""

    request_id: str
    agent: str = "?"
    operation: str = "?"
    risk: str = "?"
    params: dict[str, Any] = {}


class ApprovalSettled(Notification):
    """A request left the queue. `decision`: allow_once, allow_session, deny, or how it ended
    without one (expired, locked, unroutable, withdrawn); `state`: allowed, denied, expired,
    unroutable, withdrawn. `by` is absent when nobody decided. An agent's withdrawal (`call.cancel`)
    also carries, as its audit record does, the withdrawing `session_id`, when it took effect
    (`time`) and `gone` (the withdrawing process's recorded ancestors that had exited then), so the
    fallback transcript can tell a withdrawal after the agent's exit (absent from older daemons)."""

    METHOD = "approval.settled"
    OMIT_IF_NONE = frozenset({"by", "session_id", "time", "gone"})
    request_id: str
    state: str
    decision: str | None = None
    by: str | None = None
    session_id: str | None = None
    time: float | None = None
    gone: list[int] | None = None


class GrantFields(Notification):
    """A session grant as the approver socket shows it (vault.gate.grants.Grant.to_wire): the
    fields of `grant.created` and `grant.ended`, and of each grant in the `sessions` answer."""

    grant_id: str
    session_id: str
    operation: str = ""
    scope: str = ""
    pid: int | None = None
    created: float = 0.0
    expires_at: float | None = None


class GrantCreated(GrantFields):
    """allow_session made a grant for one process."""

    METHOD = "grant.created"


class GrantEnded(GrantFields):
    """A grant ended: `reason` is ttl, lock, revoke, or why its session ended."""

    METHOD = "grant.ended"
    reason: str = ""


class VaultLocked(Notification):
    METHOD = "vault.locked"
    locked: bool
    by: str | None = None


class SessionOpened(Notification):
    METHOD = "session.opened"
    OMIT_IF_NONE = frozenset({"client", "lineage", "kin", "gone"})
    session_id: str
    agent: str = "?"
    run_id: str | None = None
    pid: int | None = None
    exe: str | None = None
    opened: float = 0.0
    client: WireClient | None = None
    # the opener's ancestry as its audit record keeps it ((pid, start), nearest first), where read:
    # whose a helper's session is, and whether the agent was gone at its withdrawal, in the fallback
    lineage: list[list[int | float]] | None = None  # lists, as JSON gives them back
    # as its audit record keeps them: its tree root's older children and which of those and of its
    # ancestors had exited as it opened (vault.daemon.gone_watch), so the fallback transcript reads
    # lateness from the daemon's evidence, not a clock (vault.runner.late_opens)
    kin: list[list[int | float]] | None = None
    gone: list[int] | None = None


class SessionClosed(Notification):
    METHOD = "session.closed"
    session_id: str
    reason: str = ""


class Activity(Notification):
    """What an agent was told (a Result's category and retry instruction), as it was told.

    `kind` says what it answered (call, resume, lookup: a lookup the vault answers from what it
    knows never reaches the remote, so nothing else tells it from a call); a lookup's also carry
    its `reconciled`, the call it looked up (`lookup_of`, when the vault knew it) and, when it told
    that call's resume token, the pending request's id (`request_id`; never the token). Older
    daemons sent none of them: None."""

    METHOD = "activity"
    OMIT_IF_NONE = frozenset({"reconciled", "lookup_of", "request_id", "gone", "asked"})
    time: float = 0.0
    agent: str | None = None
    pid: int | None = None
    session_id: str | None = None
    operation: str = "?"
    category: str
    retry: str = ""
    correlation_id: str
    kind: str | None = None
    reconciled: str | None = None
    lookup_of: str | None = None
    request_id: str | None = None
    # which of the sender's watched processes had exited as its request came, as the call's request
    # record or the resume's or lookup's answer record keeps it (vault.daemon.gone_watch)
    gone: list[int] | None = None
    # when its request came (a call's request record's time, a resume's or lookup's `asked`): a
    # request is late by when it was sent, not by when it was answered (vault.runner.grade)
    asked: float | None = None


MODELS: dict[str, type[Notification]] = {m.METHOD: m for m in (
    ApprovalRequested, ApprovalSettled, GrantCreated, GrantEnded, VaultLocked, SessionOpened,
    SessionClosed, Activity)}

N = TypeVar("N", bound=_Wire)


def read(model: type[N], data: Any, what: str | None = None) -> N:
    """`data` as `model`, tolerantly (see the module doc); a WireError if it does not fit."""
    try:
        return model.model_validate(data, context={_READING: True})
    except ValidationError as exc:
        raise WireError(f"malformed {what or model.__name__}: {_why(exc)}") from None


def parse_notification(method: str, params: Any) -> Notification | None:
    """The model of one notification; None for a method this version does not know (a newer
    daemon's), a WireError for a known one that does not fit its model."""
    model = MODELS.get(method)
    if model is None:
        return None
    return read(model, params, f"{method} notification")
