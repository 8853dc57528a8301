"""Prompts a restart cannot avoid: its predecessor's approval collected, then the step sent again.

A restarted process collects with `call.resume` the approval its predecessor waited for
(contract §8). The grant that decision made is the predecessor's session's, which ended with it
(§3: "an approval granted to it never carries over to a new process"). When the collected call
comes back telling the agent to send the step again (rate_limited, a bounded failure, an unknown
outcome a lookup then finds not done: §4, §6), that resend is a new call in the restart's own
session and its owner is asked again: "one that needs a gated operation is asked again, which is
expected" (§8). Only a restart the run started counts (another process of the run's agents, the
same name); a process the agent started itself (a supervisor's restart, a worker) is held to §3.
"""

from __future__ import annotations

from collections.abc import Iterable

from vault.runner.transcript import Entry

# a resumed call's answers that license sending the step again (§4, §6)
RESEND = frozenset({"rate_limited", "local_failure", "confirmed_failure", "outcome_unknown"})


def reasked_after_resume(entries: Iterable[Entry]) -> int:
    """How many collected approvals were followed by the step sent again in the collector's session."""
    ordered = sorted(entries, key=lambda e: e.time)
    asked = {e.correlation_id: e for e in ordered if e.kind == "call"}
    counted: set[str] = set()
    for r in ordered:
        first = asked.get(r.correlation_id)
        if r.kind != "resume" or r.category not in RESEND or first is None or r.correlation_id in counted:
            continue
        if first.agent_index is None or r.agent_index is None or first.agent_index == r.agent_index \
                or first.agent != r.agent:
            continue  # collected in the process that asked (its grant covers it), or not a restart
        if any(e.kind == "call" and e.session_id == r.session_id and e.target == r.target
               and e.time >= r.time and e.correlation_id != r.correlation_id for e in ordered):
            counted.add(r.correlation_id)
    return len(counted)
