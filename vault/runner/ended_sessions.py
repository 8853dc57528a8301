"""FAIL_OUTCOME: a step left undone because its process called it on a session that had ended.

A session ends when its process closes it or the connection that opened it closes
(docs/agent-contract.md section 3: keep that connection open for as long as you use the
session). A process that drops its connection and presents the same session id on a new one is
answered `authorization_denied` and its step is not done; the report named only the missing
deliverable or the claim, never why. The daemon records such a request (`session_refused`, reason
`ended`, the sender's own session): here it is named with the agent, its step and when and how
the session had ended, when the agent's calls of that operation succeeded fewer times than its
steps call it (one the process did again in a new session of its own is done, and a lookup
presenting the ended session sends no step: nothing is left undone).
"""

from __future__ import annotations

from typing import Any

from vault.runner import whose
from vault.runner.evidence import Evidence

_HOW = {"closed by agent": "it closed it (session.close)", "connection closed": "the connection that opened it closed",
        "process exited": "its process exited"}


def undone_on_ended(ev: Evidence) -> list[str]:
    out = []
    for r in ev.transcript.refusals:
        # a lookup or a close presenting it sends no step (a careful reconnect probes its old
        # session so before opening a new one); a call or a resume was the step's sending
        if r.get("reason") != "ended" or r.get("method") not in ("call", "call.resume"):
            continue
        index = r.get("sender_index")
        s = ev.transcript.sessions.get(str(r.get("session_id"))) or {}
        at = float(r.get("time") or 0.0)
        op = str(r.get("operation") or r.get("method") or "")
        if _all_done(ev, index, op):
            continue
        closed = s.get("closed")
        when = f", {at - float(closed):.2f}s after it ended" if isinstance(closed, (int, float)) else ""
        how = _HOW.get(str(s.get("close_reason") or ""), "")
        out.append(f"{whose.process(ev, index, r.get('pid'))}: {_steps(ev, index, op)} was sent in session "
                   f"{r.get('session_id')}{when}" + (f" ({how})" if how else "") +
                   f": refused (authorization_denied), so the step was not done; a session ends with its "
                   "connection, and a new connection opens a new session")
    return list(dict.fromkeys(out))


def _steps(ev: Evidence, index: Any, op: str) -> str:
    """The agent's step(s) of that operation: the one, or each it could be."""
    a = ev.agent(index)
    steps = [s for s in ((a.steps or []) if a is not None else []) if s.get("call") == op]
    if not steps:
        return op
    if len(steps) == 1:
        return f"its step {steps[0].get('id')} ({op})"
    return f"its step {' or '.join(str(s.get('id')) for s in steps)} ({op})"


def _all_done(ev: Evidence, index: Any, op: str) -> bool:
    """Did the agent's calls of `op` succeed as often as its steps call it (before the refused
    request, a resend of a done step; or after it, in a new session)? Then nothing was left undone."""
    a = ev.agent(index)
    wanted = max(1, sum(1 for s in ((a.steps or []) if a is not None else []) if s.get("call") == op))
    done = sum(1 for e in ev.transcript.entries
               if e.agent_index == index and e.operation == op and e.category == "success")
    return done >= wanted
