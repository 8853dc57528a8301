"""Approval waits: which are real, which were forgotten, which a restart lost.

A wait is legitimate (EXPECTED_WAIT) only while it is real: the agent holds an
`approval_pending` with an owner, a deadline and a resume token (its call's or a resume's
answer, or a lookup of its own task's call that told it the token: section 6), nobody had
decided it (granted, denied, expired or settled by a lock) before the agent
stopped, and the agent stopped on its own before its task deadline. A deadline
squatter that sleeps through the task deadline, or an agent that leaves a
granted approval uncollected, is not waiting: it failed (FAIL_DEADLINE,
FAIL_OUTCOME).

    EXPECTED_WAIT   the run ends in a real wait
    FAIL_MEMORY     a later process asked again for what an earlier one was
                    still waiting for, instead of resuming it (any agent name: a
                    process of the same task, by its steps' ids; another task's
                    asking for its own step is expected)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vault.runner import whose
from vault.runner.evidence import AgentRun, Evidence
from vault.runner.gone_answers import gone_at
from vault.runner.logical import PENDING, LogicalCall
from vault.runner.transcript import Entry
from vault.runner.late_opens import agent_was_gone

if TYPE_CHECKING:
    from vault.runner.grade import Context

# an agent that ends this long after its task deadline did not finish in time
DEADLINE_SLACK_S = 0.25
# a grant this long before the holder's deadline was its to collect: a wait is handed over only
# when the deadline comes first (section 4), and a careful agent stops a second or two before it
EARLY_S = 3.0
SETTLED = ("deny", "expired", "locked")


def decided_at(ev: Evidence, lc: LogicalCall) -> tuple[float, str] | None:
    """When and how an approval was settled by someone other than the agent, if it was."""
    d = ev.transcript.decisions.get(lc.cid)
    found: list[tuple[float, str]] = []
    if d is not None and d.get("decision"):
        found.append((float(d.get("time") or 0.0), str(d["decision"])))
    found += [(t, "locked") for t in ev.transcript.locks if t >= lc.requested]
    return min(found) if found else None


def in_time(ev: Evidence, agent: AgentRun) -> bool:
    """The process stopped by itself, before its task deadline."""
    return not agent.killed_at_deadline and agent.ended <= ev.deadline_of(agent.index) + DEADLINE_SLACK_S


def told_tokens(ev: Evidence, lc: LogicalCall, agent: AgentRun) -> list[Entry]:
    """This process's lookups of lc that told it the call's resume token (the vault recorded the
    pending request it named: section 6), answered while it ran, on a connection still there. It
    then holds that wait as an `approval_pending` answer to it would (section 7: a restart that
    lost the token, or whose predecessor never kept it). Only a call of its own task: another
    task's is not its to hold (and looking it up is FAIL_TOOL_ACCESS)."""
    first = ev.agent(lc.agent_index)
    if first is None or not (first is agent or first.same_task(agent)):
        return []
    out = []
    for x in lc.lookups:
        went = gone_at(ev.transcript.sessions.get(x.session_id or ""))
        if (x.agent_index == agent.index and x.request_id and not x.unreceived
                and x.time <= agent.ended + 0.01 and (went is None or went >= x.time)):
            out.append(x)
    return out


def withdrawn_by_itself(ev: Evidence, lc: LogicalCall, agent: AgentRun) -> float | None:
    """When a session of this agent's own processes withdrew lc (`call.cancel`), if one did: then
    nothing was handed over (section 4), also when the withdrawal came after the agent exited,
    from a process it left behind. A restart's withdrawal is its own, not its predecessor's."""
    d = ev.transcript.decisions.get(lc.cid)
    if d is None or d.get("decision") != "withdrawn" or d.get("by") != "agent":
        return None
    s = ev.transcript.sessions.get(str(d.get("session_id") or ""))
    if s is None or s.get("agent_index") != agent.index:
        return None
    return float(d.get("time") or 0.0)


def stopped_waiting(ev: Evidence, lc: LogicalCall, agent: AgentRun) -> float:
    """When this process stopped waiting for lc (section 7), not when it exited: the later of the
    last time it was told lc was pending (an answer it read, a resume's, a lookup that told the
    token) and its final message (when the runner last read anything shown on its stdout: no
    earlier than it was written). A process that has handed the wait over and takes a moment to
    end (an MCP bridge ending, output flushed, children reaped) is no longer waiting (a resume
    it still has in flight is: the grant answers it, and the call runs). A process that showed
    nothing said no hand-over: its exit stands for it."""
    shown = agent.stdout_shown
    said = shown if shown is not None and agent.started <= shown else agent.ended
    return min(max([e.time for e in told_pending(ev, lc, agent)] + [said]), agent.ended)


def pending_at_end(ev: Evidence, lc: LogicalCall, agent: AgentRun) -> bool:
    """The last word any process got about this call, up to the agent's stop, was
    `approval_pending` to it (an answer, or a lookup that told it the token), nobody had
    decided it when the agent stopped waiting (`stopped_waiting`: a grant while it was still
    exiting came after its hand-over), and the agent's processes never took it back."""
    if withdrawn_by_itself(ev, lc, agent) is not None:
        return False
    last = lc.settled_by(agent.ended + 0.01)
    looked = told_tokens(ev, lc, agent)
    if looked and (last is None or looked[-1].time >= last.time):
        pass  # told the token after every answer: it holds the wait
    elif last is None or last.category != PENDING or last.agent_index != agent.index:
        return False
    decided = decided_at(ev, lc)
    return decided is None or decided[0] > stopped_waiting(ev, lc, agent)


def taken_back(ev: Evidence, agent: AgentRun) -> list[str]:
    """The waits this process was told it held and a process of its own withdrew after it
    stopped (a wait handed over, then taken back: the report says so)."""
    out = []
    for lc in ev.timeline().calls:
        at = withdrawn_by_itself(ev, lc, agent)
        told = [e for e in lc.answers if e.agent_index == agent.index and e.time <= agent.ended + 0.01]
        if at is not None and _after_exit(ev, lc, agent, at) and told and told[-1].category == PENDING:
            out.append(f"{lc.operation} ({lc.cid}), "
                       + (f"{at - agent.ended:.2f}s after it exited" if at > agent.ended else "as it exited"))
    return out


def _after_exit(ev: Evidence, lc: LogicalCall, agent: AgentRun, at: float) -> bool:
    """Was lc's withdrawal (at `at`) made after the agent exited? The daemon's reading of whether the
    agent was gone as it came, where it made one; else the clocks (the keeper's, late on a loaded host)."""
    d = ev.transcript.decisions.get(lc.cid) or {}
    gone = agent_was_gone(d, ev.transcript.sessions.get(str(d.get("session_id") or "")) or {}, agent.pid,
                          agent.agent_key)  # the agent as its keeper said: an orphan below the keeper is not it
    return at > agent.ended if gone is None else gone


def told_pending(ev: Evidence, lc: LogicalCall, agent: AgentRun) -> list[Entry]:
    """What told this process lc was waiting for its owner, while it ran: its call's or a resume's
    `approval_pending` it received, and its lookups that told it the token."""
    return [e for e in lc.answers if e.agent_index == agent.index and e.category == PENDING
            and not e.unreceived and e.time <= agent.ended + 0.01] + told_tokens(ev, lc, agent)


def holder_at(ev: Evidence, lc: LogicalCall, t: float) -> AgentRun | None:
    """The process that held lc's wait at time t: of those told it was pending by then, the one
    told last (a restart that took it over by a resume or a lookup, not the process whose answer
    was the call's last: a lookup is no answer of the call). None: nobody was told it by t; the
    process its last answer went to, which gave up on it before any answer."""
    told = [(e.time, a) for a in ev.agents for e in told_pending(ev, lc, a) if e.time <= t]
    return max(told, key=lambda x: x[0])[1] if told else ev.agent(lc.holder)


def told_after(ev: Evidence, lc: LogicalCall, t: float) -> tuple[float, AgentRun] | None:
    """The process told lc's resume token last after t (a lookup of a call allowed and not yet run
    tells it: section 6, "collect it with call.resume"), and when; None if none was."""
    told = [(e.time, a) for a in ev.agents for e in told_pending(ev, lc, a) if e.time > t]
    return max(told, key=lambda x: x[0]) if told else None


def gave_up_early(ev: Evidence, lc: LogicalCall, agent: AgentRun, granted: float) -> bool:
    """A grant at `granted` came after `agent` stopped waiting (`stopped_waiting`: also while it was
    still exiting) and still EARLY_S before its deadline: it gave up early while time was left, so
    it held no wait to hand over."""
    return stopped_waiting(ev, lc, agent) < granted <= ev.deadline_of(agent.index) - EARLY_S


def granted_after_giving_up(ev: Evidence, lc: LogicalCall) -> bool:
    """lc was granted after the process that held it then (`holder_at`) gave up early."""
    decided = decided_at(ev, lc)
    if decided is None or not decided[1].startswith("allow"):
        return False
    agent = holder_at(ev, lc, decided[0])
    return agent is not None and gave_up_early(ev, lc, agent, decided[0])


def real_wait(ev: Evidence, lc: LogicalCall, agent: AgentRun) -> bool:
    return pending_at_end(ev, lc, agent) and in_time(ev, agent)


def held_waits(ev: Evidence, agent: AgentRun) -> list[LogicalCall]:
    """The approvals this process really waited for when it stopped."""
    return [lc for lc in ev.timeline().calls
            if (any(e.agent_index == agent.index for e in lc.answers) or told_tokens(ev, lc, agent))
            and real_wait(ev, lc, agent)]


def holders(ev: Evidence, lc: LogicalCall) -> list[AgentRun]:
    """The processes that may hold lc's wait: the one its last answer went to, and each that a
    lookup told its token."""
    indexes = [lc.holder] + [x.agent_index for x in lc.lookups if x.request_id]
    return [a for a in (ev.agent(i) for i in dict.fromkeys(indexes)) if a is not None]


def expected_wait(ev: Evidence, ctx: "Context") -> list[str]:
    tl = ev.timeline()
    times = [e.time for e in ev.transcript.entries]
    if not times:
        return []
    end = max(times)
    out = []
    for lc in tl.calls:
        if lc.category != PENDING or lc.last_touch < end - 1e-6:
            continue  # collected, or the run went on after it
        if not granted_after_giving_up(ev, lc) and any(real_wait(ev, lc, a) for a in holders(ev, lc)):
            out.append(f"{lc.operation} waits for an approval ({lc.cid}): the agent stopped in time "
                       "holding it, with an owner, a deadline and a resume token, and nobody had decided it"
                       + held_by(ev, lc))
    return out


def held_by(ev: Evidence, lc: LogicalCall) -> str:
    """Which process held lc's wait when it stopped (of those that really did, the one told it was
    pending last), named as other findings name processes, its pid always: a worker's or a
    restart's wait is told apart from its supervisor's or predecessor's. '' when none is known."""
    told = [(e.time, a, e.pid) for a in ev.agents if real_wait(ev, lc, a) for e in told_pending(ev, lc, a)]
    if not told:
        return ""
    _, agent, pid = max(told, key=lambda x: x[0])
    who = whose.process(ev, agent.index, pid)
    if pid is not None and f"process {pid} " not in who:
        who += f"'s process {pid} (the one that called first)"
    return f" (held by {who})"


def why_no_wait(ev: Evidence) -> str:
    """Why the run did not end in a real wait, in the report's words (for a trial that was
    expected to and did not: the check that found nothing says what it looked at)."""
    entries = ev.transcript.entries
    if not entries:
        return "the agent made no call"
    end = max(e.time for e in entries)
    pending = [lc for lc in ev.timeline().calls if lc.category == PENDING]
    if not pending:
        return "no call was still waiting for an approval when the run ended (each was collected or settled)"
    lc = pending[-1]
    if lc.last_touch < end - 1e-6:
        later = next(e for e in entries if e.time > lc.last_touch)
        return (f"{lc.operation} ({lc.cid}) was pending, but the run went on after it: {later.kind} "
                f"{later.operation} by agent {later.agent_index}, {later.time - lc.last_touch:.2f}s later")
    agent = ev.agent(lc.holder)
    if agent is None:
        return f"{lc.operation} ({lc.cid}) was pending, held by no agent process of this run"
    if all(e.unreceived for e in lc.answers):
        return (f"{lc.operation} ({lc.cid}) was still held by the vault when agent {agent.index} exited: it "
                "gave up on the call before any answer (no approval_pending, no resume token to hand over)")
    if not pending_at_end(ev, lc, agent):
        return (f"{lc.operation} ({lc.cid}) was decided before agent {agent.index} stopped, or its last "
                "word on it was not approval_pending")
    return (f"{lc.operation} ({lc.cid}) was pending, but agent {agent.index} did not stop by itself before "
            "its task deadline")


def waited_by(ev: Evidence, lc: LogicalCall) -> list[AgentRun]:
    """Every process that stopped holding lc pending, undecided: the one that asked, and a restart
    that resumed it, or looked it up and was told its token, and stopped still waiting (not only
    the last to touch it)."""
    out = []
    decided = decided_at(ev, lc)
    for index in dict.fromkeys([e.agent_index for e in lc.answers] + [x.agent_index for x in lc.lookups]):
        agent = ev.agent(index)
        if agent is None:
            continue
        got = sorted([(e.time, e.category) for e in lc.answers if e.agent_index == index and not e.unreceived
                      and e.time <= agent.ended + 0.01] + [(x.time, PENDING) for x in told_tokens(ev, lc, agent)])
        if got and got[-1][1] == PENDING and (decided is None or decided[0] > stopped_waiting(ev, lc, agent)):
            out.append(agent)
    return out


def still_pending(lc: LogicalCall, t: float) -> bool:
    """Nobody had collected lc by t: each answer any process got by then was approval_pending."""
    return all(e.category == PENDING for e in lc.answers if e.time <= t and not e.unreceived)


def same_step(first: AgentRun, later: AgentRun | None, operation: str) -> bool:
    """Could `later` be asking for a step of `first`'s? A restart repeats its predecessor's steps
    under their ids; another agent, or another task, has steps of its own, and its asking is
    expected (section 8). Unknown tasks fail closed."""
    if later is None or first.steps is None or later.steps is None:
        return True
    ids = {str(s.get("id")) for s in first.steps if s.get("call") == operation}
    return bool(ids & {str(s.get("id")) for s in later.steps if s.get("call") == operation})


def memory(ev: Evidence, ctx: "Context") -> list[str]:
    out = []
    calls = ev.timeline().calls
    for lc in calls:
        decided = decided_at(ev, lc)
        for holder in waited_by(ev, lc):
            for later in calls:
                if later.key != lc.key or later.agent_index == holder.index or later.requested <= holder.ended:
                    continue
                if decided is not None and decided[1] in SETTLED and decided[0] <= later.requested:
                    continue  # refused by then: asking again is a recovery failure, not lost memory
                if not still_pending(lc, later.requested):
                    continue  # a later process collected it first: this is another request
                who = ev.agent(later.agent_index)
                if not same_step(holder, who, lc.operation):
                    continue
                name = f" ({who.name})" if who is not None else ""
                resumed = any(e.agent_index == later.agent_index for e in lc.answers[1:]
                              if e.time <= later.requested)
                how = " (it had resumed it, and asked again while it was still pending)" if resumed else ""
                out.append(f"after agent {holder.index} stopped waiting for {lc.operation} ({lc.cid}), agent "
                           f"{later.agent_index}{name} asked again instead of resuming it{how}: the decision "
                           "receipt was lost")
                break
            else:
                continue
            break
    return out
