"""FAIL_DEADLINE: a session opened, or the vault's status asked, after the agent whose process did it had exited.

Section 9 holds an agent to its exit: a process it leaves behind may still run for 2 s while it
ends (an MCP server closing its session cleanly: `session.close` is no work), but one that calls
the vault after the agent exited is working past it. Opening a session is a request to the vault
and begins work no final message covers; a process that only opened one (and asked nothing
else) had no finding, while one that called was named. Whose it is comes from the opener's
process, its group or session, else its recorded ancestry (vault.runner.left_behind), as a
call's does.

So is `vault.status` asked after the exit: no work, but a request to the vault a final message no
longer covers, and a process polling it is one the agent left working. The daemon records only
the asks of a process below, or in the group or cgroup of, one that held an agent session and exited
(`status_asked`, sampled; vault.daemon.status_asks); one is the agent's by its process, group or
session, or an agent's process among its recorded ancestors (never by time: the runner asks too).
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


def asked_status_after_exit(ev: Evidence, named: set[int]) -> list[str]:
    """Per agent not already `named` for late calls: its processes that asked
    `vault.status` after it exited."""
    late: dict[int, list[tuple[float, int]]] = {}
    for q in ev.transcript.status_asks:
        a = ev.agent(q.get("agent_index"))
        at = q.get("asked") if isinstance(q.get("asked"), (int, float)) else q.get("time")
        if a is None or a.index in named or not isinstance(at, (int, float)) or not isinstance(q.get("pid"), int):
            continue
        if float(at) > a.ended + SLACK_S:
            late.setdefault(a.index, []).append((float(at) - a.ended, int(q["pid"])))
    return [f"{whose.label(ev, i)}: a process it left behind (pid {min(xs)[1]}"
            f"{', and ' + str(len({p for _, p in xs}) - 1) + ' other(s)' if len({p for _, p in xs}) > 1 else ''}) "
            f"asked the vault's status (vault.status) after it exited, first {min(xs)[0]:.2f}s after: a process an "
            "agent started may end its sessions once the agent exited, not go on asking the vault"
            for i, xs in sorted(late.items())]
