"""Reading the audit log with the key: decrypt, then project for a person.

`decrypt_events` turns the log back into event dicts; the projections are
plain functions over that list so the TUI, the runner and tests can reuse them:

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
a name cannot smuggle terminal control sequences onto an operator's screen.
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

from ..errors import AuditError, BadInput
from ..text import printable
from . import files as F
from . import records as R
from .keys import check_data_key


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
    fd = F.open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError as exc:
        raise BadInput(f"cannot read audit log {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    lines.pop()  # "" after the final newline, or a torn line a dead writer left
    for line in lines:
        if line.startswith(R.HEAD_START):
            continue
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
        except ValueError:  # authentic, yet not JSON this reader can load (an int past 4,300 digits)
            event = {"type": "unreadable"}
        if not isinstance(event, dict):
            event = {"type": "unknown", "value": event}
        events.append({"seq": rec.seq, "time": rec.time, **event} | {"seq": rec.seq})


def sessions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per session id, in order of opening."""
    rows: dict[str, dict[str, Any]] = {}
    for ev in events:
        sid = ev.get("session_id")
        if not isinstance(sid, str):
            continue
        row = rows.setdefault(sid, {"session_id": sid, "agent": None, "pid": None, "run_id": None,
                                    "opened": None, "closed": None, "close_reason": None, "calls": 0})
        kind = ev.get("type")
        if kind == "session_opened":
            row.update(agent=ev.get("agent"), pid=ev.get("pid"), run_id=ev.get("run_id"), opened=ev.get("time"))
        elif kind == "session_closed":
            row.update(closed=ev.get("time"), close_reason=ev.get("reason"))
        elif kind == "call_requested":
            row["calls"] += 1
    return list(rows.values())


def correlation(events: list[dict[str, Any]], correlation_id: str) -> list[dict[str, Any]]:
    """Events naming `correlation_id`, plus decisions on their prompts and the lookups
    that reconciled it (a lookup has its own correlation id; its reconciliation names
    the call in ``lookup_of``), in time order."""
    ids = {correlation_id} | {_cid(ev) for ev in events
                              if ev.get("type") == "reconciliation" and ev.get("lookup_of") == correlation_id}
    requests = {ev.get("request_id") for ev in events
                if _cid(ev) in ids and ev.get("request_id") is not None}
    picked = [ev for ev in events
              if _cid(ev) in ids
              or (ev.get("request_id") is not None and ev.get("request_id") in requests)]
    return sorted(picked, key=lambda ev: (_num(ev.get("time")), ev["seq"]))


def no_result(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The intent events that no result record (``remote_result`` or ``classification``
    of the same correlation id) follows, in log order."""
    open_: dict[str | None, dict[str, Any]] = {}
    for ev in events:
        kind = ev.get("type")
        if kind == "intent":
            open_[_cid(ev)] = ev
        elif kind in ("remote_result", "classification"):
            open_.pop(_cid(ev), None)
    return list(open_.values())


# what each known event type shows, in this order; anything else shows all its fields
_FIELDS: dict[str, tuple[str, ...]] = {
    "session_opened": ("session_id", "agent", "pid", "run_id"),
    "session_closed": ("session_id", "reason"),
    "call_requested": ("correlation_id", "session_id", "operation", "risk", "target"),
    "prompt_shown": ("request_id", "correlation_id", "scope"),
    "decision": ("request_id", "decision", "approver"),
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
    "prompt_stats": ("run_id", "prompts"),
}
_META = {"seq", "time", "type"}


def describe(ev: dict[str, Any]) -> str:
    """One line: ``2024-05-01T10:00:00.123Z #12 decision request_id=r-1 decision=deny ...``."""
    kind = ev.get("type")
    names = _FIELDS.get(kind) if isinstance(kind, str) else None
    if names is None:
        names = tuple(k for k in ev if k not in _META)
    parts = [f"{k}={_clean(ev[k])}" for k in names if k in ev and ev[k] is not None]
    return f"{_when(ev.get('time'))} #{ev.get('seq')} {_clean(kind or 'event')} {' '.join(parts)}".rstrip()


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


def _cid(ev: dict[str, Any]) -> str | None:
    v = ev.get("correlation_id")
    return v if isinstance(v, str) else None


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _when(t: Any) -> str:
    if not isinstance(t, int | float) or isinstance(t, bool):
        return "?"
    try:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return "?"


def _clean(v: Any) -> str:
    """A field value as printable text: control characters escaped, long values cut."""
    return printable(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str), 200)
