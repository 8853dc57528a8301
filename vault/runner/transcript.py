"""The transcript: every call and result as the vault saw it, in order.

Built from the decrypted audit log (the daemon records each call request,
decision, grant, intent, reconciliation and the classification the agent was
given), read through the audit event models (`vault.audit_events`: older logs
and unknown fields read too), never from what an agent prints about itself. When the audit log is
unreadable, the approver channel's `activity` notifications are the fallback
(less detail: no targets, session closes placed by the order the daemon sent them, as they carry
no time; an older daemon's do not say which answers were lookups, inferred there from the remote's
event log, nor which call they named).

One `Entry` per answer an agent received:

    kind        call | lookup | resume
    operation   the catalog operation (for a lookup: the one looked up)
    category    what the agent was told, with its retry instruction
    reconciled  for a lookup: found / not_found / unknown
    lookup_of   for a lookup: the correlation id of the call it looked up, when known
    request_id  a call's approval request; for a lookup, the pending request whose
                resume token it told (the call still waited: section 6)
    executed    the call passed the gate and reached an executor
    note        "outcome unknown (no result record)": the log holds the call's
                intent but not its result (the daemon died in between, or a
                power loss took a result record not yet synced); the entry is
                placed at the intent and categorised outcome_unknown
    unreceived  True: the answer came after the process it was for had exited
                (it gave up on a call the vault still held; the runner's teardown
                settled it): the vault's record, but nothing the agent was told,
                unless a restart of its task looked the call up or resumed it after
                that answer; also one written after its connection had gone while
                the agent's other processes ran, unless they looked the call up or
                resumed it (vault.runner.gone_answers)

A call and the resumes that collected it share one correlation id: together
they are one logical call (`vault.runner.logical`).

`refusals`: every request the vault refused because its process was not the one
that opened the session it presented (`session_refused`: an agent handed its
session to a child, or the runner's intruder), as the event's fields, with
`owner_index` (the agent whose session it was) and `sender_index` (the agent
whose process, or process group or session, sent it; None for a process in no
agent's tree, as the runner's intruder).

`unknown_ops`: every call or lookup that named an operation the catalog does not
have (`unknown_operation`: refused, nothing done), as the event's fields, with
`agent_index` (whose session it came in).

`foreign_refs`: every resume, cancel or lookup that named a call not its agent's
(`foreign_reference`), attributed as `unknown_ops` are, with `daemons` (how many
daemon starts the log held by then: vault.runner.foreign_refs).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from vault import audit_events as A
from vault.models import RETRY_FOR, Category
from vault.runner import gone_answers
from vault.runner.left_behind import born_of, left_by
from vault.wire import (Activity, ApprovalRequested, ApprovalSettled, GrantCreated, SessionClosed, SessionOpened,
                        VaultLocked, WireError, parse_notification)

KINDS = ("call", "resume", "lookup")
GATE_CATEGORIES = frozenset({
    Category.vault_locked, Category.approval_pending, Category.approval_denied,
    Category.approval_expired, Category.approval_unroutable,
})


@dataclass
class Entry:
    kind: str
    operation: str
    correlation_id: str
    category: str
    retry: str
    time: float
    requested: float | None = None
    asked: float | None = None  # a resume's or lookup's request, where the log has it (vault.audit_events.Classification)
    session_id: str | None = None
    agent: str | None = None
    pid: int | None = None
    agent_index: int | None = None
    target: str | None = None
    reconciled: str | None = None
    executed: bool = False
    request_id: str | None = None
    lookup_of: str | None = None
    note: str | None = None
    unreceived: bool | None = None
    # a never, outcome_unknown or lookup-unknown answer's: its process's children when it was given
    # (vault.audit_events.Classification)
    children: list[tuple[int, float]] | None = None
    # which of the sender's watched processes had exited as its request came (a call's request
    # record's, a resume's or lookup's answer's; vault.daemon.gone_watch): vault.runner.late_opens
    gone: list[int] | None = None

    def token(self) -> list[str]:
        """The trace tokens of this entry: what was done, then what came back."""
        if self.kind == "lookup":
            return ["lookup", self.reconciled or "unknown"]
        if self.kind == "resume":
            return ["resume", self.category]
        return [self.operation, self.category]

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Transcript:
    entries: list[Entry] = field(default_factory=list)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # by correlation id
    grants: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    unlocks: list[float] = field(default_factory=list)
    locks: list[float] = field(default_factory=list)  # a lock settles every pending approval
    refusals: list[dict[str, Any]] = field(default_factory=list)  # session_refused, attributed
    unknown_ops: list[dict[str, Any]] = field(default_factory=list)  # unknown_operation, attributed
    # correlation id -> its first intent's time: the gate had passed it by then
    gated: dict[str, float] = field(default_factory=dict)
    # connection_refused: a process tree held its share of the vault's connections; attributed
    # (`agent_index`) by the tree's root, else the refused process, its group or session
    floods: list[dict[str, Any]] = field(default_factory=list)
    # request_refused: requests past the bound on those in progress; attributed as floods
    busy: list[dict[str, Any]] = field(default_factory=list)
    # status_asked (sampled): attributed by the asker's process, group or session, else an agent's
    # process among its recorded ancestors; never by time (the runner asks too, as may another run)
    status_asks: list[dict[str, Any]] = field(default_factory=list)
    # foreign_reference: a resume, cancel or lookup naming a call not its agent's; attributed as
    # unknown_ops, with `daemons`: how many daemons had started in the log by then
    foreign_refs: list[dict[str, Any]] = field(default_factory=list)
    # (daemons, ref) of each lookup by key a later call of the looker's under that key cleared
    # (`key_lookup` on call_requested: the text was its own), and how many daemons started in all
    key_lookups_sent: set[tuple[int, int]] = field(default_factory=set)
    daemon_starts: int = 0
    source: str = "none"
    # the fallback's notifications named the call each lookup found (lookup_of), when the vault
    # knew it, as the audit log does; an older daemon's named none (vault.runner.gone_answers,
    # retries: the benefit of the doubt)
    lookups_linked: bool = False


def from_audit(events: list[dict[str, Any]], agent_pids: dict[int, int],
               windows: list[tuple[float, float]], tasks: Sequence[int] | None = None) -> Transcript:
    """Entries from decrypted audit events; `agent_pids` maps pid -> agent index. The prompts,
    decisions and grants are kept as their models' fields (what the log said, as read). `tasks`:
    per agent index, its task (gone_answers.task_ids): whose lookups and resumes taught an agent
    an answer it was not there to read."""
    t = Transcript(source="audit")
    requested: dict[str, A.CallRequested] = {}
    executed: set[str] = set()
    reconciled: dict[str, str] = {}
    looked_up: dict[str, str] = {}
    told: dict[str, str] = {}  # a lookup's correlation id -> the pending request whose token it told
    answered: set[str] = set()
    intents: dict[str, A.Intent] = {}
    decided: dict[tuple[str | None, str | None], float] = {}  # (session, scope) -> an allow_session's time
    daemons = 0
    for ev in A.read_events(events):
        if isinstance(ev, A.DaemonStarted):
            daemons += 1
            for g in t.grants:  # grants live in the daemon's memory: a new daemon holds none of them
                g.setdefault("ended", ev.time)
        elif isinstance(ev, A.SessionOpened):
            t.sessions[ev.session_id] = {"agent": ev.agent, "pid": ev.pid, "run_id": ev.run_id,
                                         "opened": ev.time, "sid": ev.sid, "pgid": ev.pgid,
                                         "client": ev.client, "lineage": ev.lineage, "kin": ev.kin, "gone": ev.gone}
        elif isinstance(ev, A.SessionClosed) and ev.session_id in t.sessions:
            # when and why it ended: a later call presenting it is named so (vault.runner.ended_sessions)
            t.sessions[ev.session_id].update(closed=ev.time, close_reason=ev.reason)
        elif isinstance(ev, A.CallRequested) and ev.correlation_id:
            requested[ev.correlation_id] = ev
            if ev.key_lookup is not None:
                t.key_lookups_sent.add((daemons, ev.key_lookup))
        elif isinstance(ev, A.PromptShown):
            t.prompts.append(_fields(ev))
        elif isinstance(ev, A.Decision):
            if ev.correlation_id:
                t.decisions[ev.correlation_id] = _fields(ev)
                req = requested.get(ev.correlation_id)
                if ev.decision == "allow_session" and req is not None:
                    decided[(req.session_id, req.target)] = ev.decided or ev.time or 0.0
        elif isinstance(ev, A.GrantCreated):
            g = _fields(ev)
            # the gate holds the grant from the decision on; its record is written after the
            # decision's, and a call of its scope can pass the gate (and log its intent) between
            made = decided.pop((ev.session_id, ev.scope), None)
            if made is not None and made < float(g.get("time") or made):
                g["time"] = made
            t.grants.append(g)
        elif isinstance(ev, A.GrantEnded):
            _grant_ended(t, ev)
        elif isinstance(ev, A.Unlock):
            t.unlocks.append(ev.time or 0.0)
        elif isinstance(ev, A.Lock):
            t.locks.append(ev.time or 0.0)
        elif isinstance(ev, A.Intent) and ev.correlation_id:
            executed.add(ev.correlation_id)
            intents[ev.correlation_id] = ev
            t.gated.setdefault(ev.correlation_id, ev.time or 0.0)
        elif isinstance(ev, A.RemoteResult) and ev.correlation_id:
            intents.pop(ev.correlation_id, None)
        elif isinstance(ev, A.Reconciliation) and ev.correlation_id:
            reconciled[ev.correlation_id] = ev.reconciled or "unknown"
            if ev.lookup_of:
                looked_up[ev.correlation_id] = ev.lookup_of
            if ev.request_id:
                told[ev.correlation_id] = ev.request_id
        elif isinstance(ev, A.SessionRefused):
            t.refusals.append(_fields(ev))
        elif isinstance(ev, A.UnknownOperation):
            t.unknown_ops.append(_fields(ev))
        elif isinstance(ev, A.ForeignReference):
            t.foreign_refs.append({**_fields(ev), "daemons": daemons})
        elif isinstance(ev, A.ConnectionRefused):
            t.floods.append(_fields(ev))
        elif isinstance(ev, A.RequestRefused):
            t.busy.append(_fields(ev))
        elif isinstance(ev, A.StatusAsked):
            t.status_asks.append(_fields(ev))
        elif isinstance(ev, A.Classification) and ev.correlation_id:
            t.entries.append(_answer(ev, requested.get(ev.correlation_id), answered, reconciled, looked_up,
                                     executed, told))
            intents.pop(ev.correlation_id, None)
    for cid, intent in intents.items():  # intents no result record followed
        _add_no_result(t, cid, intent, requested.get(cid))
    t.daemon_starts = daemons
    exited = _attribute(t, agent_pids, windows)
    gone_answers.mark(t, {sid for sid, s in t.sessions.items() if _owner(s, agent_pids) is not None}, exited, tasks)
    _attribute_refusals(t, agent_pids)
    for f in t.floods + t.busy:
        root = f.get("tree_pid")
        f["agent_index"] = agent_pids[root] if root in agent_pids else _owner(f, agent_pids)
    for q in t.status_asks:
        below = [agent_pids[p] for p, _ in q.get("lineage") or () if p in agent_pids]
        q["agent_index"] = _owner(q, agent_pids) if _owner(q, agent_pids) is not None else \
            (below[0] if below else None)
    for u in t.unknown_ops + t.foreign_refs:  # sent in the sender's own session: its agent
        s = t.sessions.get(str(u.get("session_id")))
        u["agent_index"] = _owner(s, agent_pids) if s is not None else None
    for e in t.entries:
        d = t.decisions.get(e.correlation_id)
        if d is not None:
            e.request_id = d.get("request_id")
    return t


def _answer(ev: A.Classification, req: A.CallRequested | None, answered: set[str],
            reconciled: dict[str, str], looked_up: dict[str, str], executed: set[str],
            told: dict[str, str]) -> Entry:
    """The entry of one answer the agent was given (a call, a resume, a lookup)."""
    cid = ev.correlation_id
    # the record says whether it answered a resume; only older logs (without `resumed`) are read by
    # order: a call whose waiter went away (its process killed) is answered when its approval is
    # decided or its wait ends, which can be written after the resume of a successor's (red team 35c)
    resumed = ev.resumed if "resumed" in ev.model_fields_set else (cid in answered and req is not None)
    if resumed:
        kind = "resume"
    elif cid in reconciled and req is None:
        kind = "lookup"
    else:
        kind = "call"
    answered.add(cid)
    # the session the answer was given to: a resume may come from a restarted process,
    # a lookup has no request record; older logs name it on the request only
    sid = ev.session_id or (req.session_id if req else None)
    return Entry(kind=kind, operation=ev.operation, correlation_id=cid, category=ev.category,
                 retry=ev.retry if "retry" in ev.model_fields_set else "None", time=ev.time or 0.0,
                 requested=(req.time or 0.0) if req and kind == "call" else None,
                 asked=ev.asked if kind != "call" else None, session_id=sid, target=req.target if req else None,
                 reconciled=reconciled.get(cid) if kind == "lookup" else None,
                 lookup_of=looked_up.get(cid) if kind == "lookup" else None,
                 request_id=told.get(cid) if kind == "lookup" else None,
                 executed=cid in executed, children=ev.children,
                 gone=(req.gone if req else None) if kind == "call" else ev.gone)


def _fields(ev: A.AuditEvent) -> dict[str, Any]:
    """An event as its model read it: the record's seq and time, the fields the log gave."""
    return ev.model_dump(exclude_unset=True)


NO_RESULT = "outcome unknown (no result record)"


def _grant_ended(t: Transcript, ev: A.GrantEnded) -> None:
    """Marks when a grant stopped covering calls (its session ended, a lock, a revoke): a prompt
    after that for its scope is no repeat (vault.runner.grant_elsewhere)."""
    for g in reversed(t.grants):
        same = g.get("grant_id") == ev.grant_id if ev.grant_id else \
            (g.get("session_id"), g.get("scope")) == (ev.session_id, ev.scope)
        if same and "ended" not in g:
            g["ended"] = ev.time
            return


def _add_no_result(t: Transcript, cid: str, intent: A.Intent, req: A.CallRequested | None) -> None:
    """An intent without its result: what reached the remote is unknown. In time order."""
    entry = Entry(kind="call", operation=intent.operation, correlation_id=cid,
                  category=str(Category.outcome_unknown), retry=str(RETRY_FOR[Category.outcome_unknown]),
                  time=intent.time or 0.0,
                  requested=(req.time or 0.0) if req else None,
                  session_id=req.session_id if req else None,
                  target=req.target if req else intent.target, executed=True, note=NO_RESULT,
                  gone=req.gone if req else None)
    bisect.insort(t.entries, entry, key=lambda e: e.time)


def from_activity(notes: Iterable[tuple[str, dict[str, Any]]], remote_events: list[dict[str, Any]],
                  agent_pids: dict[int, int], windows: list[tuple[float, float]],
                  tasks: Sequence[int] | None = None) -> Transcript:
    """The fallback: the approver channel's notifications, (method, params) as received, read
    through their models (vault.wire); lookups told apart by the remote. A notification that
    does not fit its model is left out, as one of a method this version does not know."""
    t = Transcript(source="activity")
    status_cids = {e.get("correlation_id") for e in remote_events if e.get("route") == "operation_status"}
    touched = {e.get("correlation_id") for e in remote_events if e.get("event") == "received"}
    requests: dict[str, ApprovalRequested] = {}
    seen: set[str] = set()
    last = 0.0  # the latest time a notification so far carried (a session's close carries none)
    unlinked = False  # an answer notified without its kind (an older daemon): lookups name no call
    for method, params in notes:
        try:
            n = parse_notification(method, params)
        except WireError:
            continue
        if isinstance(n, SessionOpened):
            last = max(last, n.opened)
            t.sessions[n.session_id] = {"agent": n.agent, "pid": n.pid, "run_id": n.run_id,
                                        "opened": n.opened,
                                        "client": n.client.model_dump() if n.client else None,
                                        **({"lineage": n.lineage} if n.lineage else {}),
                                        # the daemon's evidence, as the audit record has it (late_opens)
                                        **({"kin": n.kin} if n.kin is not None else {}),
                                        **({"gone": n.gone} if n.gone is not None else {})}
        elif isinstance(n, SessionClosed) and n.session_id in t.sessions:
            # the daemon sends its notifications in the order it acts: placed just after the last
            # time one before it carried, an answer notified after it was written after it
            # (vault.runner.gone_answers: unreceived, unless the agent learned the call otherwise)
            t.sessions[n.session_id].update(closed=math.nextafter(last, math.inf), close_reason=n.reason)
        elif isinstance(n, ApprovalRequested):
            requests[n.request_id] = n
            t.prompts.append({"request_id": n.request_id, "correlation_id": n.correlation_id,
                              "operation": n.operation, "scope": n.scope})
        elif isinstance(n, ApprovalSettled):
            req = requests.get(n.request_id)
            if req is not None:
                t.decisions[req.correlation_id] = {"request_id": n.request_id, "decision": n.decision}
                if n.decision == "withdrawn" and n.session_id is not None:
                    # an agent's withdrawal, as its audit record says it (vault.runner.late_opens)
                    last = max(last, n.time or 0.0)
                    t.decisions[req.correlation_id].update(
                        by="agent", session_id=n.session_id, time=n.time,
                        **({"gone": n.gone} if n.gone is not None else {}))
        elif isinstance(n, GrantCreated):
            last = max(last, n.created)
            t.grants.append({"session_id": n.session_id, "scope": n.scope, "time": n.created})
        elif isinstance(n, VaultLocked):
            # (the notification carries no time: the lock is placed at 0, before every entry)
            (t.locks if n.locked else t.unlocks).append(0.0)
        elif isinstance(n, Activity):
            last = max(last, n.time)
            cid = n.correlation_id
            category = Category(n.category)
            if n.kind in KINDS:
                kind = n.kind
            else:  # an older daemon's: a lookup only where it reached the remote
                unlinked = True
                kind = "resume" if cid in seen else ("lookup" if cid in status_cids else "call")
            seen.add(cid)
            looked = kind == "lookup"
            t.entries.append(Entry(
                kind=kind, operation=n.operation, correlation_id=cid, category=str(category),
                retry=str(RETRY_FOR[category]), time=n.time, session_id=n.session_id,
                # a lookup performs nothing (the audit log's transcript holds no intent for one):
                # its `success` says only that it was answered, not that an operation ran
                agent=n.agent, pid=n.pid,
                executed=not looked and (cid in touched or category not in GATE_CATEGORIES),
                reconciled=n.reconciled if looked else None, lookup_of=n.lookup_of if looked else None,
                request_id=n.request_id if looked else None, gone=n.gone,
                # when its request came, as the audit log has it: a call's request, a resume's or
                # lookup's `asked` (a late request is graded by it: vault.runner.grade._late_calls)
                requested=n.asked if kind == "call" else None, asked=n.asked if kind != "call" else None))
    t.lookups_linked = not unlinked
    exited = _attribute(t, agent_pids, windows)
    gone_answers.mark(t, {sid for sid, s in t.sessions.items() if _owner(s, agent_pids) is not None}, exited, tasks)
    return t


def _owner(s: dict[str, Any], agent_pids: dict[int, int]) -> int | None:
    """The agent a session's process belongs to: the agent itself, or a process in its group or
    session. A jailed agent is the child of the process the runner started (its jail's keeper,
    vault.jail.enter), in that process's group and session; so is a helper an agent starts.
    Else the agent below which it was started, by the ancestry recorded as it opened the session:
    `script -qec` (a pty) runs its command in a session of its own, and `setsid` without a fork
    away leaves a child in its own group, both still the agent's (red team 47c). The farthest
    agent in the chain: an earlier agent's pid reused inside a later one's tree is nearer."""
    for key in ("pid", "pgid", "sid"):
        if s.get(key) in agent_pids:
            return agent_pids[s[key]]
    roots = [agent_pids[p[0]] for p in s.get("lineage") or () if isinstance(p, (list, tuple)) and p
             and p[0] in agent_pids]
    return roots[-1] if roots else None


def _attribute_refusals(t: Transcript, agent_pids: dict[int, int]) -> None:
    """Whose session each refused request presented, and which agent's process sent it."""
    for r in t.refusals:
        s = t.sessions.get(str(r.get("session_id")))
        owner = _owner(s, agent_pids) if s is not None else None
        owner_pid = r.get("owner_pid")
        r["owner_index"] = owner if owner is not None or not isinstance(owner_pid, int) else \
            agent_pids.get(owner_pid)
        r["sender_index"] = _owner(r, agent_pids)


def _attribute(t: Transcript, agent_pids: dict[int, int],
               windows: list[tuple[float, float]]) -> list[tuple[Entry, float]]:
    """Which agent process each entry belongs to: by its session's process, else by time window,
    else (a session of a process left behind) by who left it (vault.runner.left_behind). Returns
    each call or resume answer recorded after its agent was seen to exit, with that time: nobody
    read it, unless a restart learned it (vault.runner.gone_answers)."""
    exited: list[tuple[Entry, float]] = []
    owners = {sid: _owner(s, agent_pids) for sid, s in t.sessions.items()}
    for sid, opened in t.sessions.items():
        # whose process opened it, also one that made no call (vault.runner.late_opens)
        opened["agent_index"] = owners[sid] if owners[sid] is not None else \
            born_of(opened.get("lineage"), [start for start, _ in windows])
        if opened["agent_index"] is None and isinstance(opened.get("opened"), (int, float)):
            opened["agent_index"] = left_by(windows, float(opened["opened"]))
    for e in t.entries:
        s = t.sessions.get(e.session_id or "")
        if s is not None:
            e.agent = e.agent or s.get("agent")
            e.pid = e.pid or s.get("pid")
        owner = owners.get(e.session_id or "")
        if owner is None and e.pid is not None:
            owner = agent_pids.get(e.pid)
        if owner is not None:
            e.agent_index = owner
            if e.kind in ("call", "resume") and owner < len(windows) and e.time > windows[owner][1]:
                exited.append((e, windows[owner][1]))  # recorded after its process was seen to exit
            continue
        if s is not None:
            e.agent_index = born_of(s.get("lineage"), [start for start, _ in windows])
            if e.agent_index is not None:
                continue  # a process an agent left behind, by when its branch was born
        for i, (start, end) in enumerate(windows):
            if start - 0.05 <= e.time <= end + 0.05:
                e.agent_index = i
                break
        if e.session_id is None and e.agent_index is not None:
            # a lookup is recorded without its session: it is the agent's open one
            for sid, s in t.sessions.items():
                if owners.get(sid) == e.agent_index:
                    e.session_id, e.agent, e.pid = sid, s.get("agent"), s.get("pid")
        if e.agent_index is None and e.session_id in t.sessions:
            e.agent_index = left_by(windows, e.time)  # a process an agent left behind
    return exited
