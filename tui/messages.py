"""Messages from the approver link to the app, as dataclasses.

The link (a worker) only ever posts these; the app folds them into `TuiState`.
Tests and the bench post the same messages with recorded payloads, so the
screens can be driven without a daemon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class LinkUp(Message):
    """Connected and subscribed: the daemon's snapshot of pending requests and lock state."""

    pending: list[dict[str, Any]]
    locked: bool


@dataclass
class LinkDown(Message):
    """Not connected (yet, or any more); the link keeps retrying."""

    reason: str


@dataclass
class LinkSilent(Message):
    """The daemon has kept a request (`method`) unanswered for a while: stopped, or stuck."""

    method: str


@dataclass
class LinkAnswering(Message):
    """The daemon answers again after `LinkSilent`."""


@dataclass
class DaemonNotice(Message):
    """One notification from the daemon (`approval.requested`, `activity`, ...)."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class SessionsLoaded(Message):
    """The answer to `sessions`: every agent session with its grants."""

    sessions: list[dict[str, Any]]


@dataclass
class StatsLoaded(Message):
    """The answer to `stats`: prompt counts per run and per session."""

    report: dict[str, Any]


@dataclass
class DetailLoaded(Message):
    """The answer to `approval.detail`: a waiting request's parameters in full."""

    request_id: str
    answer: Any


@dataclass
class DetailFailed(Message):
    """`approval.detail` was refused (the request settled meanwhile) or could not be sent."""

    request_id: str
    message: str


@dataclass
class RequestFailed(Message):
    """A method the person asked for was refused or could not be sent."""

    method: str
    message: str
