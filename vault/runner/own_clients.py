"""The calls a test makes itself (the pytest plugin's `vaultsim.client()`): the test's, no agent's.

A test's client is a relay process its world adopts (vault.runner.live.LiveWorld.adopt), which
the vault sees as an agent. What it calls is the test's own set-up or check: a record seeded for
the agent to read, a read-back of what the agent made. By time alone its calls read as the
agent's (a process the agent left behind, an operation outside its task, an effect no step asked
for, a second session), which failed a careful agent. So the grade leaves them out as it leaves
out the set-up's and a neighbour's (vault.runner.foreign_sessions: their audit events, the
remote's record of them, the prompts they cost), and the trial's notes name them; the live
transcript keeps them, attributed to no agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vault.audit_events import SessionOpened, read_events
from vault.lineage import same_start
from vault.runner import foreign_sessions
from vault.runner.evidence import Evidence
from vault.runner.transcript import Transcript


def leave_out(ev: Evidence, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit events without those of the sessions `ev.test_clients` opened; their calls leave
    the rest of `ev` too (foreign_sessions.leave_out)."""
    if not ev.test_clients:
        return events
    found = foreign_sessions.Strangers()
    for ev_ in read_events(events):
        if isinstance(ev_, SessionOpened) and _theirs(ev_, ev.test_clients):
            found.sessions[ev_.session_id] = ev_
    return foreign_sessions.leave_out(ev, events, foreign_sessions.with_calls(events, found), _said)


def _theirs(opened: SessionOpened, clients: Mapping[int, float]) -> bool:
    """Opened by one of the test's clients: its pid and start time, so a later process given the
    pid of a client that had ended (an agent's child, by chance or by forking for it) is not."""
    start = clients.get(opened.pid) if opened.pid is not None else None
    first = opened.lineage[0] if opened.lineage else None  # unread: graded as the agent's (fail closed)
    return start is not None and first is not None and first[0] == opened.pid and same_start(first[1], start)


def _said(found: foreign_sessions.Strangers, theirs: list[dict[str, Any]], took: int) -> str:
    who = foreign_sessions.sessions_said(found, theirs)
    return (f"the test's own vaultsim.client() ({'; '.join(who[:3])}{' …' if len(who) > 3 else ''}): "
            f"its {len(found.cids)} call(s) are the test's, not graded as an agent's"
            + (f" ({took} took effect on the remote)" if took else ""))


def unattribute(transcript: Transcript, clients: Mapping[int, float]) -> Transcript:
    """The live transcript's entries of the test's clients' sessions, attributed to no agent."""
    if not clients:
        return transcript
    theirs = {sid for sid, s in transcript.sessions.items()
              if isinstance(s.get("pid"), int) and s["pid"] in clients and s.get("lineage")
              and same_start(float(s["lineage"][0][1]), clients[s["pid"]])}
    for sid in theirs:
        transcript.sessions[sid]["agent_index"] = None
    for e in transcript.entries:
        if e.session_id in theirs:
            e.agent_index = None
    return transcript
