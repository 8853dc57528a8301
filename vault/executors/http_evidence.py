"""What an HTTP attempt proves, and the category that honestly follows from it.

The agent plans on the category, so it must follow from evidence, not from
which exception class happened to fire. Evidence comes from where aiohttp takes
each step (vault.executors.http's connection pool and request mark it on a `Trace`;
not aiohttp's request tracing, whose signals cost more per call): whether any request
byte may have left this process, whether the answer's head arrived, whether
the body was complete; and from the answer itself checked against the
operation's response contract (vault.contracts).

| evidence | category |
| --- | --- |
| DNS failure, refused, connect timeout, deadline gone: nothing written | local_failure |
| 401 | authentication_failed |
| 403 | authorization_denied |
| 429 | rate_limited (`retry_after_s` from Retry-After, else a default) |
| 4xx/5xx with an error envelope and `done: false`; 4xx envelope without `done` | confirmed_failure |
| 5xx envelope without `done` on a mutating op | outcome_unknown (a 5xx may come after the commit) |
| 2xx failing the contract, HTML, truncated or invalid JSON, 3xx, oversize | malformed_response |
| request (partly) written, then timeout / connection closed, mutating op | outcome_unknown |
| request written, then timeout / closed, read-only op | local_failure |
| an answer whose X-Correlation-Id names another request, mutating op | outcome_unknown |
| the same, read-only op | local_failure |

The last row is a decision: a read has no remote effect, so nothing is
"unknown" about the remote's state and a bounded retry is safe, which is
local_failure's instruction; the message still says the remote may have seen
the request, and `remote_touched` stays true for the audit. "Bytes may have
left" starts once a connection is in hand, since the request head is written
right after (a partial write can not be ruled out), not when it completes.
"""

from __future__ import annotations

import email.utils
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.http_exceptions import ContentEncodingError

from vault import contracts
from vault.models import Category

DEFAULT_RETRY_AFTER_S = 5.0

# transport errors: their text is about the wire (OS or parser messages), worth keeping scrubbed
WIRE_ERRORS = (aiohttp.ClientError, TimeoutError)


class NotSent(Exception):
    """The request was refused before any connection was used (bad header value, no URL).

    Its text is plain words for the agent's message and never holds a value."""


class Trace:
    """Transport milestones of one request with their time in ms.

    Only the milestone's name and time are kept (never the request, which
    holds the credential in its headers).
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        # (name, monotonic time): made into ms only if `steps` is read (a failure's diagnostic)
        self._marks: list[tuple[str, float]] = []
        self._seen: set[str] = set()

    def mark(self, name: str) -> None:
        self._marks.append((name, time.monotonic()))
        self._seen.add(name)

    @property
    def steps(self) -> list[tuple[str, float]]:
        return [(name, round((t - self.t0) * 1000, 1)) for name, t in self._marks]

    def saw(self, name: str) -> bool:
        return name in self._seen

    @property
    def request_started(self) -> bool:
        # a connection in hand: the request head is written next
        return self.saw("connection.connect.complete") or self.saw("connection.reused")

    @property
    def response_started(self) -> bool:
        return self.saw("response.head_received")


@dataclass
class Attempt:
    """Everything observed about one HTTP exchange."""

    trace: Trace = field(default_factory=Trace)
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False
    oversize: bool = False
    error: BaseException | None = None
    # the answer's X-Correlation-Id named another request: not this call's answer (its own
    # may still be on the way), whatever its status and body say
    foreign_answer: bool = False

    @property
    def bytes_left(self) -> bool:
        if isinstance(self.error, NotSent):
            return False
        # an answer proves a request arrived, whatever the trace says
        return self.trace.request_started or self.status is not None

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass
class Verdict:
    category: Category
    message: str
    data: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    violations: list[dict[str, str]] = field(default_factory=list)
    reason: str = ""


def classify(attempt: Attempt, *, mutates: bool, contract: str | None,
             params: dict[str, Any]) -> Verdict:
    if attempt.foreign_answer:  # before the status: another request's 401 or 200 says nothing of this one
        return _not_ours(mutates)
    status = attempt.status
    if status in (401, 403, 429):  # the status line alone is the evidence
        return _by_status(attempt, status)
    if attempt.error is not None or (status is None):
        return _interrupted(attempt, mutates)
    if attempt.oversize:
        return _malformed("the answer is larger than the vault accepts", "oversize")
    if 200 <= status < 300:
        if contract is None:
            return Verdict(Category.success, "Done.")
        checked = contracts.check(contract, attempt.body, params)
        if not checked.ok:
            return _malformed(f"it does not satisfy the {contract} contract", "contract",
                              [v.to_dict() for v in checked.violations])
        return Verdict(Category.success, "Done.", data=checked.model.project())  # type: ignore[union-attr]
    if status < 400:
        return _malformed(f"unexpected HTTP status {status}", "unexpected_status")
    return _error_status(attempt, status, mutates)


def _by_status(attempt: Attempt, status: int) -> Verdict:
    if status == 401:
        return Verdict(Category.authentication_failed,
                       "The remote rejected the credential (expired or revoked). Do not retry; "
                       "the credential needs recovery by a person.", reason="401")
    if status == 403:
        return Verdict(Category.authorization_denied,
                       "The remote refused this operation for this credential. Do not retry.",
                       reason="403")
    wait = retry_after(attempt.header("retry-after"))
    if wait is None:
        return Verdict(Category.rate_limited,
                       f"The remote is rate limiting and gave no delay; wait {DEFAULT_RETRY_AFTER_S:g} "
                       "seconds before retrying.", extra={"retry_after_s": DEFAULT_RETRY_AFTER_S}, reason="429")
    return Verdict(Category.rate_limited,
                   f"The remote is rate limiting; wait {wait:g} seconds before retrying.",
                   extra={"retry_after_s": wait}, reason="429")


def _interrupted(attempt: Attempt, mutates: bool) -> Verdict:
    what = describe_error(attempt)
    if not attempt.bytes_left:
        return Verdict(Category.local_failure,
                       f"The call failed before any request reached the remote ({what}); nothing was "
                       "changed, so a bounded retry is safe.", reason="before_send")
    if _decoding_failed(attempt.error):
        return _malformed("its content encoding could not be decoded", "decoding")
    if mutates:
        return Verdict(Category.outcome_unknown,
                       f"The request was sent but no complete answer arrived ({what}); the remote may "
                       "have applied it. Look it up before retrying.", reason="after_send")
    return Verdict(Category.local_failure,
                   f"The request was sent but no complete answer arrived ({what}); this operation only "
                   "reads, so nothing was changed and a bounded retry is safe.", reason="read_after_send")


def _not_ours(mutates: bool) -> Verdict:
    what = ("The request was sent, but the answer that came back was another request's (it named "
            "another correlation id), so it was not used")
    if mutates:
        return Verdict(Category.outcome_unknown, f"{what}; the remote may have applied this call. Look it "
                       "up before retrying.", reason="foreign_answer")
    return Verdict(Category.local_failure, f"{what}; this operation only reads, so nothing was changed and "
                   "a bounded retry is safe.", reason="foreign_answer")


def _error_status(attempt: Attempt, status: int, mutates: bool) -> Verdict:
    envelope = contracts.error_envelope(attempt.body)
    if envelope is None:
        return _malformed(f"an HTTP {status} without a readable error envelope", "error_body")
    if envelope.done is True:
        return _malformed(f"an HTTP {status} whose body claims the work was done", "error_body")
    code = envelope.error if envelope.error.replace("_", "").isalnum() and len(envelope.error) <= 40 else "error"
    if envelope.done is False or status < 500 or not mutates:
        return Verdict(Category.confirmed_failure,
                       f"The remote answered that it did not do the work ({status} {code}).",
                       reason=f"{status}")
    return Verdict(Category.outcome_unknown,
                   f"The remote answered with a server error ({status} {code}) without saying whether "
                   "the work was done. Look it up before retrying.", reason=f"{status}")


def _malformed(why: str, reason: str, violations: list[dict[str, str]] | None = None) -> Verdict:
    return Verdict(Category.malformed_response,
                   f"The remote's answer could not be used ({why}); nothing further was done with it. "
                   "Do not retry.", violations=violations or [], reason=reason)


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds or seconds == float("inf"):
        return None
    return max(0.0, round(seconds, 3))


def describe_error(attempt: Attempt) -> str:
    """Plain words for what went wrong; never the exception text itself."""
    exc = attempt.error
    chain = _chain(exc)
    if isinstance(exc, NotSent):
        return str(exc)  # written for the agent, and never holds a value
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or any(isinstance(e, socket.gaierror) for e in chain):
        return "the service host name could not be resolved"
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "the connection was refused"
    if isinstance(exc, aiohttp.ConnectionTimeoutError) or (
            isinstance(exc, TimeoutError) and not attempt.trace.request_started):
        return "the connection could not be established in time"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "the connection could not be established"
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return "the service URL is not a usable http(s) URL"
    if isinstance(exc, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        if attempt.trace.response_started:
            return "timed out while the answer was arriving"
        return "timed out waiting for the answer"
    if attempt.trace.response_started:
        return "the connection closed while the answer was arriving"
    if exc is None:
        return "no answer"
    return "the connection closed before an answer"


def _decoding_failed(exc: BaseException | None) -> bool:
    """Did the answer's Content-Encoding fail to decode? (aiohttp wraps it in a payload error)"""
    return any(isinstance(e, ContentEncodingError) for e in _chain(exc)) or (
        isinstance(exc, aiohttp.ClientPayloadError) and "encoding" in str(exc).lower())


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 10:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen
