"""A write to the daemon's files by the daemon itself is never charged to the agent, even when its
ancestry could not be read at the event (vault.runner.opens.OpenWatch.seen).

The watch charges a writer it could not tell to the agent running then (fail closed): right for
a `cat` gone within a millisecond, wrong for the daemon, which runs as long as the trial. A pid
the watch vouched for at its start (the daemon's), still the same process (its start time), is
the daemon's: no other process can have held that pid in between. One whose process changed (the
daemon killed, its pid given to another) is judged as any other writer.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from vault.lineage import started
from vault.runner.opens import OpenWatch


def _watch(skip: dict[int, float]) -> OpenWatch:
    world: Any = SimpleNamespace(root=None, remote=None)
    group: Any = SimpleNamespace(me=-1)
    watch = OpenWatch(world, 0, group)
    watch._skip, watch._skip_born = frozenset(skip), dict(skip)
    return watch


def test_the_daemons_write_untold_is_still_the_daemons() -> None:
    me = os.getpid()  # stands for the daemon: alive, and vouched for at the watch's start
    born = started(me)
    assert born is not None
    watch = _watch({me: born})
    watch.seen("daemon.log", me, [], "python")
    assert [] == watch.opens


def test_a_write_untold_by_another_process_under_the_daemons_old_pid_is_judged() -> None:
    me = os.getpid()
    watch = _watch({me: 1.0})  # the pid's process when the watch began started long before this one
    watch.seen("daemon.log", me, [], "python")
    assert [("daemon.log", me)] == [(o["file"], o["pid"]) for o in watch.opens]


def test_a_writer_below_the_daemon_is_the_daemons() -> None:
    watch = _watch({4242: 1.0})
    watch.seen("h/audit.log", 5151, [(5151, 9.0), (4242, 1.0), (1, 0.0)], "ssh")
    assert [] == watch.opens


def test_a_writer_holding_the_daemons_old_pid_is_judged() -> None:
    """The daemon killed and its pid given to a process of the agent's: that process's write is
    not the daemon's because its pid once was."""
    watch = _watch({4242: 1.0})
    watch.seen("daemon.log", 4242, [(4242, 50.0), (3000, 40.0), (1, 0.0)], "sh")
    assert [("daemon.log", 4242)] == [(o["file"], o["pid"]) for o in watch.opens]
