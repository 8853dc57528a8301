"""Which `vault.status` asks the daemon records (audit `status_asked`): those of a process an agent left behind.

`vault.status` does nothing, but asking it is a request to the vault, and §9 holds an agent to its
exit: a process it left behind that still asks after it exited works past it (FAIL_DEADLINE). The
runner can only name what the log shows. Recording every ask (bd4d9fa, reverted) put every
fixture's and `vaultsim status`'s polls in every log and moved fault tests' records; so only an
ask of a process tied to an agent process that has exited is recorded:

* one of its recorded ancestors (read at its first connection, vault.daemon.processes) opened an
  agent session and has exited (a child, a bridge, a double fork that connected while its agent
  ran), or
* it is in the process group, or the cgroup, of a process that opened an agent session and has
  exited (a child left in its agent's group, or one that left it with `setsid` but not the pids
  cgroup the runner gives each agent, that connects only once the agent is gone: its ancestry
  then runs through the keeper, never the agent), and that it did not start (a supervisor whose
  worker ended, asking while it runs), unless the daemon's own ancestors are in that group or
  cgroup (a shell or test run that started the daemon: its other children are no agent's).

A process that is none of these (a fixture, `vaultsim status`, the runner: below, in the group
of, or in the cgroup of no agent process that has exited) writes nothing. Recorded asks are queued (no fsync of their own) and sampled per
process: the first STATUS_RECORDED, then powers of two.
"""

from __future__ import annotations

import os
import time

from vault.audit_events import StatusAsked
from vault.daemon.limits import PROCESSES_COUNTED, PerProcessCount, sampled
from vault.daemon.peer import Markers, ProcessIdentity, cgroup_of
from vault.daemon.processes import Key, ProcessEntry, ProcessTable
from vault.lineage import exited, lineage

STATUS_RECORDED = 8


def _group(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


class StatusAsks:
    def __init__(self, table: ProcessTable) -> None:
        self.table = table
        # the processes that opened an agent session: (pid, start) -> its process group and cgroup
        # then, and its recorded ancestors; per group and per cgroup, its members among them (start
        # times are read alike everywhere: exact keys). A group or cgroup the daemon's own ancestors
        # are in is no agent's (a shell or test run that started the daemon): not indexed
        self._holders: dict[Key, tuple[int, str, frozenset[Key]]] = {}
        self._groups: dict[int, set[Key]] = {}
        self._cgroups: dict[str, set[Key]] = {}
        own = lineage(os.getpid())
        self._own_groups = {g for p, _ in own if (g := _group(p)) > 0}
        self._own_cgroups = {cgroup_of(p) for p, _ in own} | {""}
        self._counts = PerProcessCount()

    def held(self, entry: ProcessEntry) -> None:
        """`entry` opened an agent session (vault.daemon.agent_sessions)."""
        if entry.key in self._holders:
            return
        if len(self._holders) >= PROCESSES_COUNTED:  # the oldest goes: bounded as the daemon's other counts
            old = next(iter(self._holders))
            group, cgroup, _ = self._holders.pop(old)
            self._groups.get(group, set()).discard(old)
            self._cgroups.get(cgroup, set()).discard(old)
        markers = entry.markers or Markers.of(entry.identity.pid)
        self._holders[entry.key] = (markers.pgid, markers.cgroup, frozenset(self.table.lineage_of(entry)[1:]))
        if markers.pgid > 0 and markers.pgid not in self._own_groups:
            self._groups.setdefault(markers.pgid, set()).add(entry.key)
        if markers.cgroup not in self._own_cgroups:
            self._cgroups.setdefault(markers.cgroup, set()).add(entry.key)

    def asked(self, peer: ProcessIdentity) -> StatusAsked | None:
        """The event to record for this ask of `peer`'s, or None (module doc)."""
        if not self._holders or not self._left_behind(peer):
            return None
        n = self._counts.add((peer.pid, peer.create_time))
        if not sampled(n, STATUS_RECORDED):
            return None
        who = self.table.who(peer)
        entry = self.table.find((peer.pid, peer.create_time))
        if entry is not None and "lineage" in who and (gone := self.table.gone_now(entry)) is not None:
            # which of its ancestors and kin had exited as it asked (vault.daemon.gone_watch)
            who["gone"] = gone
            if (kin := self.table.kin_of(entry)[1]) is not None:
                who["kin"] = kin
        return StatusAsked(count=n, asked=time.time(), **who)

    def _left_behind(self, peer: ProcessIdentity) -> bool:
        if any(k in self._holders and _gone(k) for k in self.table.chain_of(peer)[1:]):
            return True
        me = (peer.pid, peer.create_time)
        if self._groups and self._exited_beside(me, self._groups.get(_group(peer.pid), set())):
            return True
        return bool(self._cgroups) and self._exited_beside(me, self._cgroups.get(cgroup_of(peer.pid), set()))

    def _exited_beside(self, me: Key, holders: set[Key]) -> bool:
        """Has one of `holders` (sharing a group or cgroup with `me`) exited, not `me` itself nor
        one `me` started (a supervisor whose worker ended, asking while it runs)?"""
        return any(k != me and me not in self._holders[k][2] and _gone(k) for k in holders)


def _gone(key: Key) -> bool:
    """Has the process `key` exited (its pid gone, a zombie, or another process's now)?"""
    return exited(key)
