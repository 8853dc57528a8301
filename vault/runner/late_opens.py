"""FAIL_DEADLINE: a session opened after the agent whose process opened it had exited.

Section 9 holds an agent to its exit: a process it leaves behind may still run for 2 s while it
ends (an MCP server closing its session cleanly: `session.close` is no work), but one that calls
the vault after the agent exited is working past it. Opening a session is a request to the vault
and begins work no final message covers; a process that only opened one (and asked nothing
else) had no finding, while one that called was named. Whose it is comes from the opener's
process, its group or session, else its recorded ancestry (vault.runner.left_behind), as a
call's does.
"""

from __future__ import annotations

from vault.runner import whose
from vault.runner.evidence import Evidence

SLACK_S = 0.05  # an open recorded this close to the exit is inside the agent's time (clock reads)


def opened_after_exit(ev: Evidence, named: set[int]) -> list[str]:
    """Per agent not already `named` for late calls: the sessions opened after it exited."""
    late: dict[int, list[tuple[float, str]]] = {}
    for sid, s in ev.transcript.sessions.items():
        a = ev.agent(s.get("agent_index"))
        opened = s.get("opened")
        if a is None or a.index in named or not isinstance(opened, (int, float)):
            continue
        if float(opened) > a.ended + SLACK_S:
            late.setdefault(a.index, []).append((float(opened) - a.ended, sid))
    return [f"{whose.label(ev, i)}: a process it left behind opened {len(xs)} session(s) with the vault after it "
            f"exited, the first ({min(xs)[1]}) {min(xs)[0]:.2f}s after: a process an agent started may end its "
            "sessions once the agent exited (session.close), not open new ones"
            for i, xs in sorted(late.items())]
