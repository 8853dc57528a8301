"""Reading the audit log with the key: decrypt, then project for a person.

`decrypt_events` turns the log back into event dicts (what ``audit show
--json`` prints); the projections are plain functions over that list so the
TUI, the runner and tests can reuse them, and they read each event through
its model (`vault.audit_events.read_event`: tolerant of older logs and of
fields a newer daemon adds):

* `sessions`     one row per session: agent, pid, run, opened/closed time, calls.
* `activity`     one human line per event, in log (seq) order.
* `correlation`  every event of one correlation id (and the decisions on its
                 prompts, linked by request_id, and the lookups that reconciled
                 it, linked by ``lookup_of``), in time order.
* `no_result`    calls whose intent is in the log but whose result record is
                 not: the process died between the two, or (default
                 durability) a power loss took a result record that had not
                 been synced yet. What reached the remote is unknown: they are
                 shown as ``outcome unknown (no result record)``.

Every returned event carries ``seq`` (the record's, authoritative) and ``time``
(the event's own ``time`` field if it has one, else the record's commit time).
Rendering never trusts field values: agent-chosen strings are escaped so that
a name cannot smuggle terminal control sequences onto an operator's screen,
quoted when they hold a space, `=` or `"` so that they cannot pass for more
fields, and a long one is cut in the middle with how much was left out
(`--json` has every value whole).
This module checks each record's AEAD tag (so a record altered or moved is
refused) but not the chain or the heads: that is `verify`'s job.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vault.audit_events import (AuditEvent, CallRequested, Classification, Intent, OtherEvent,
                            Reconciliation, RemoteResult, SessionClosed, SessionOpened, read_event)
from vault.errors import AuditError, BadInput
from vault.text import quoted, shown
from vault.audit import files as F
from vault.audit import records as R
from vault.audit.chain import LineReader
from vault.audit.keys import check_data_key


NO_RESULT = "outcome unknown (no result record)"


def decrypt_events(path: str | os.PathLike[str], key: bytes) -> list[dict[str, Any]]:
    """All events of the log set at `path` (every kept segment, oldest first; a rotated
    segment's path: that segment only), in seq order. AuditError on a bad record or key;
    BadInput if there is no log or it is not a regular file."""
    check_data_key(key)
    path = Path(path)
    base = F.base_of(path)
    if path != base:
        paths = [path]
    else:
        paths = [p for _, p in F.rotated(base)]
        if os.path.lexists(base) or not paths:
            paths.append(base)
    aes = AESGCM(bytes(key))
    events: list[dict[str, Any]] = []
    for p in paths:
        _decrypt_file(p, aes, events)
    return events


def _decrypt_file(path: Path, aes: AESGCM, events: list[dict[str, Any]]) -> None:
    # a chunk at a time, as verify reads: a segment holding a 1 GB junk line is refused, not held
    # whole (a torn last line, which a dead writer leaves, stays in the reader's `rest`)
    reader = LineReader(path)
    try:
        for chunk in reader:
            for line in chunk:
                _decrypt_line(path, line, aes, events)
    finally:
        reader.close()


def _decrypt_line(path: Path, line: bytes, aes: AESGCM, events: list[dict[str, Any]]) -> None:
    if line.startswith(R.HEAD_START):
        return
    rec = R.parse_record(line)
    after = events[-1]["seq"] if events else None
    where = f"after seq {after}" if after is not None else "at the start"
    if rec is None:
        raise AuditError(f"damaged record {where} in {path}; run `vaultsim audit verify`")
    try:
        plain = aes.decrypt(rec.nonce, rec.ct, rec.aad)
    except InvalidTag:
        raise AuditError(f"cannot decrypt record {rec.seq} of {path}: wrong key, "
                         "or the record was altered") from None
    try:
        event = json.loads(plain)
    except (ValueError, RecursionError):  # authentic, yet not JSON we can load (a 4,301-digit int, deep)
        event = {"type": "unreadable"}
    if not isinstance(event, dict):
        event = {"type": "unknown", "value": event}
    events.append({"seq": rec.seq, "time": rec.time, **event} | {"seq": rec.seq})


def sessions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per session id, in order of opening."""
    rows: dict[str, dict[str, Any]] = {}
    for ev in map(read_event, events):
        sid = _named(ev, "session_id")
        if sid is None:
            continue
        row = rows.setdefault(sid, {"session_id": sid, "agent": None, "pid": None, "run_id": None,
                                    "opened": None, "closed": None, "close_reason": None, "calls": 0})
        if isinstance(ev, SessionOpened):
            row.update(agent=ev.agent, pid=ev.pid, run_id=ev.run_id, opened=ev.time)
        elif isinstance(ev, SessionClosed):
            row.update(closed=ev.time, close_reason=ev.reason if "reason" in ev.model_fields_set else None)
        elif isinstance(ev, CallRequested):
            row["calls"] += 1
    return list(rows.values())


def correlation(events: list[dict[str, Any]], correlation_id: str) -> list[dict[str, Any]]:
    """Events naming `correlation_id`, plus decisions on their prompts and the lookups
    that reconciled it (a lookup has its own correlation id; its reconciliation names
    the call in ``lookup_of``), in time order."""
    read = [(ev, read_event(ev)) for ev in events]
    ids = {correlation_id} | {_cid(m) for _, m in read
                              if isinstance(m, Reconciliation) and m.lookup_of == correlation_id}
    requests = {rid for _, m in read if _cid(m) in ids and (rid := _rid(m)) is not None}
    picked = [(ev, m) for ev, m in read
              if _cid(m) in ids or (_rid(m) is not None and _rid(m) in requests)]
    return [ev for ev, _ in sorted(picked, key=lambda p: (p[1].time or 0.0, p[1].seq or 0))]


def no_result(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The intent events that no result record (``remote_result`` or ``classification``
    of the same correlation id) follows, in log order."""
    open_: dict[str | None, dict[str, Any]] = {}
    for ev in events:
        m = read_event(ev)
        if isinstance(m, Intent):
            open_[m.correlation_id] = ev
        elif isinstance(m, RemoteResult | Classification):
            open_.pop(m.correlation_id, None)
    return list(open_.values())


# what each known event type shows, in this order; anything else shows all its fields
_FIELDS: dict[str, tuple[str, ...]] = {
    "session_opened": ("session_id", "agent", "pid", "run_id"),
    "session_closed": ("session_id", "reason"),
    "call_requested": ("correlation_id", "session_id", "operation", "risk", "target"),
    "prompt_shown": ("request_id", "correlation_id", "scope"),
    "decision": ("request_id", "decision", "approver", "reason", "by", "was"),  # by/was: the agent withdrew it
    "grant_created": ("session_id", "scope", "reason"),
    "grant_ended": ("session_id", "scope", "reason"),
    "lock": ("by",),
    "unlock": ("by",),
    "intent": ("correlation_id", "operation", "target"),
    "dispatch_started": ("correlation_id",),  # logs written before 2026-12
    # status_class: what logs written before 2026-12 carried in place of the category
    "remote_result": ("correlation_id", "category", "remote_touched", "reconciled", "diagnostic_id",
                      "status_class"),
    "client_timeout": ("correlation_id",),
    "reconciliation": ("correlation_id", "lookup_of", "reconciled"),
    "classification": ("correlation_id", "category", "retry", "remote_touched"),
    "segment_started": ("previous",),
    "log_recovered": ("unanchored_records", "torn_bytes"),
    "log_resumed": ("failed", "failed_at", "halted_s", "refused_calls"),
    "prompt_stats": ("run_id", "prompts"),
    # another process presented a session: who sent it, whose it was, why refused
    "session_refused": ("session_id", "method", "operation", "pid", "exe", "owner_pid", "reason", "count"),
    "unknown_operation": ("session_id", "method", "operation", "count", "unknown_params", "refused_params"),
    # a resume, cancel or lookup naming another's call (whose, by name) or one never given (never the token)
    "foreign_reference": ("session_id", "method", "whose", "owner", "owner_run", "operation", "count", "by"),
    # a process tree held its share of the connections: who was refused, whose tree, how many
    "connection_refused": ("pid", "exe", "tree_pid", "held", "count", "where"),
    # a request or session past a client's bound: whose, which bound, where it held, how many so far
    "request_refused": ("pid", "exe", "tree_pid", "limit", "where", "at_most", "count"),
}
_META = {"seq", "time", "type"}


def describe(ev: dict[str, Any] | AuditEvent) -> str:
    """One line: ``2024-05-01T10:00:00.123Z #12 decision request_id=r-1 decision=deny ...``.
    A known event shows its fields (those it carries) in the order above; an unknown one, or
    one that does not fit its model, shows every field it has."""
    m = ev if isinstance(ev, AuditEvent) else read_event(ev)
    if isinstance(m, OtherEvent):
        given = m.fields
        parts = [f"{k}={_clean(v)}" for k, v in given.items() if k not in _META and v is not None]
    else:
        names = _FIELDS.get(m.type) or (*(n for n in type(m).model_fields if n not in _META | {"recorded_as"}),
                                         "recorded_as")
        parts = [f"{k}={_clean(v)}" for k in names
                 if k in m.model_fields_set and (v := getattr(m, k)) is not None]
    return f"{_when(m.time)} #{m.seq} {_clean(m.type)} {' '.join(parts)}".rstrip()


def activity(events: list[dict[str, Any]]) -> list[str]:
    return [describe(ev) for ev in events]


def render(events: list[dict[str, Any]], correlation_id: str | None = None) -> str:
    """The text `vaultsim audit show` prints."""
    if correlation_id is not None:
        picked = correlation(events, correlation_id)
        head = f"correlation {_clean(correlation_id)}: {len(picked)} events"
        if no_result(picked):
            head += f"; {NO_RESULT}"
        return "\n".join([head, *(f"  {describe(ev)}" for ev in picked)])
    out = [f"sessions ({len(rows := sessions(events))})"]
    for r in rows:
        closed = _when(r["closed"]) if r["closed"] is not None else "open"
        out.append(f"  {_clean(r['session_id'])}  agent={_clean(r['agent'])} pid={_clean(r['pid'])} "
                   f"run={_clean(r['run_id'])}  opened {_when(r['opened'])}  closed {closed}  "
                   f"calls {r['calls']}")
    out.append(f"activity ({len(events)} events)")
    out.extend(f"  {line}" for line in activity(events))
    missing = no_result(events)
    if missing:
        out.append(f"calls with no result record ({len(missing)}): {NO_RESULT}")
        out.extend(f"  {_clean(ev.get('correlation_id'))} {_clean(ev.get('operation'))} "
                   f"target={_clean(ev.get('target'))} intent #{ev.get('seq')} at {_when(ev.get('time'))}"
                   for ev in missing)
    return "\n".join(out)


def _cid(m: AuditEvent) -> str | None:
    return _named(m, "correlation_id")


def _rid(m: AuditEvent) -> str | None:
    return _named(m, "request_id")


def _named(m: AuditEvent, name: str) -> str | None:
    """A text field of any event: an event this version does not know may name a call too."""
    v = m.fields.get(name) if isinstance(m, OtherEvent) else getattr(m, name, None)
    return v if isinstance(v, str) else None


def _when(t: Any) -> str:
    if not isinstance(t, int | float) or isinstance(t, bool):
        return "?"
    try:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return "?"


def _clean(v: Any) -> str:
    """A field value as one unambiguous token: escaped (`vault.text.shown`), a long one cut in
    the middle saying how much (`--json` has it whole), and quoted when it holds a space, `=`
    or `"`, so an agent's name or parameter cannot pass for more fields (`agent="x decision=deny"`)."""
    text = shown(v, 200)
    if isinstance(v, str) and (not text or any(c.isspace() or c in '="' for c in text)):
        return quoted(v) if len(text) == len(shown(v)) else '"' + text.replace('"', '\\"') + '"'
    return text
