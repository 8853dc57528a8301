"""Which `vault.status` asks the daemon records (audit `status_asked`), and with what.

`vault.status` does nothing, but asking it is a request to the vault, and §9 holds an agent to its
exit: a process it left behind that still asks after it exited works past it (FAIL_DEADLINE). The
runner can only name what the log shows, so asks are recorded; a status loop must not flood the
log or cost an fsync each, so per process only some are (queued, `record_soon`): the first
STATUS_RECORDED, then powers of two, and every ask whose ancestry differs from the process's last
ask's (an ancestor exited: the agent that started it, for one left behind), which a left-behind
process's first ask after the exit always is.
"""

from __future__ import annotations

import time

from vault.audit_events import StatusAsked
from vault.daemon.limits import PROCESSES_COUNTED, sampled
from vault.daemon.processes import ProcessTable
from vault.lineage import lineage
from vault.daemon.peer import ProcessIdentity

STATUS_RECORDED = 8


class StatusAsks:
    def __init__(self, table: ProcessTable) -> None:
        self.table = table
        # (pid, start) -> (its asks so far, the pids of its ancestry at its last ask)
        self._seen: dict[tuple[int, float], tuple[int, tuple[int, ...]]] = {}

    def asked(self, peer: ProcessIdentity) -> StatusAsked | None:
        """Count one ask of `peer`'s; the event to record when it is one to record."""
        key = (peer.pid, peer.create_time)
        chain = tuple(pid for pid, _ in lineage(peer.pid)) if peer.pid > 0 else ()
        if key not in self._seen and len(self._seen) >= PROCESSES_COUNTED:
            self._seen.clear()  # as PerProcessCount: a forgotten process starts again at its first
        n, before = self._seen.get(key, (0, chain))
        n += 1
        self._seen[key] = (n, chain)
        if not (sampled(n, STATUS_RECORDED) or chain != before):
            return None
        return StatusAsked(count=n, asked=time.time(), **self.table.who(peer))
