"""How long a client waits on the daemon before it calls the daemon silent: one rule for every client.

A daemon that is stopped (SIGSTOP) or stuck answers nothing, and a client that waits without a bound
hangs with it for ever. An agent's client (the MCP bridge, `vault.client.AgentClient`) gives a request
its own time (a wait's `wait_s`, a call's or lookup's remote work, which the daemon bounds by its call
timeout) plus a little, and never much past the task's deadline, then gives the request up: whether it
was done is unknown. A person's client (the scripted approver, the TUI) gives nothing up (a decision
sent again could be a second one): it says the daemon is not answering once a request has waited
SILENT_AFTER_S, and says so again when the answer comes (`SilenceWatch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

# how much longer than a request's own time the daemon may take before it is called silent, and how
# far past the task's `until` (a deadline less a margin) an agent's request may wait at most
SILENT_AFTER_S, SILENT_PAST_UNTIL_S = 5.0, 1.5
# a call's or lookup's own work at the daemon: the remote, which the daemon bounds by its call timeout
# (30 s by default); never cut shorter, so a slow remote's answer is the agent's and not an
# outcome_unknown of the client's making
DAEMON_WORK_S = 30.0


def answer_within(method: str, wait_s: float | None, until: float | None = None) -> float | None:
    """Seconds the daemon has to answer `method` (with its `wait_s`) before the agent's client calls it
    silent; None when nothing bounds it (a call or resume without `wait_s` may wait up to its
    approval's deadline, which the client does not know, and no `until` was given)."""
    own: float | None
    if method == "call.resume":
        own = wait_s
    elif method == "call":
        own = None if wait_s is None else max(wait_s, DAEMON_WORK_S)
    else:  # a lookup reconciles against the remote; the rest is the daemon's own quick work
        own = DAEMON_WORK_S
    within = None if own is None else own + SILENT_AFTER_S
    if until is not None:
        left = max(0.0, until - time.time()) + SILENT_PAST_UNTIL_S
        within = left if within is None else min(within, left)
    return within


@dataclass
class SilenceWatch:
    """A person's client: `silent(method)` once a request has waited `after_s` unanswered, then
    `answering()` when an answer comes again; the request itself is still waited for."""

    silent: Callable[[str], None]
    answering: Callable[[], None]
    after_s: float = SILENT_AFTER_S
    said: bool = False

    def waited(self, method: str) -> None:
        if not self.said:
            self.said = True
            self.silent(method)

    def answered(self) -> None:
        if self.said:
            self.said = False
            self.answering()
