"""A process's start time is the kernel's, read the same way everywhere (vault.lineage.started).

Found in a CI run of an hour: psutil's create_time adds /proc/stat's btime, a whole second that
moves when the wall clock is adjusted, while the ancestry reader cached it once. The same orphan
then read as a second older than the agent that made it (refused as a neighbour's, never graded),
and a neighbour's flood was no longer recognised past the scan budget (graded as a bypass).
Here the wall clock's boot time moves by a second mid-test; nothing that names a process may.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import psutil
import pytest

from helpers import PY
from vault.daemon.peer import ProcessIdentity
from vault.lineage import Trial, boot_clock, lineage, same_start, started
from vault.remote.vouch import Vouch


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def adjust_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """What an NTP step does to /proc/stat's btime, as psutil reads it on every call."""
    lineage(1)  # a reader that caches the boot time has it now, before the clock moves
    moved = psutil.boot_time() + 1.0

    def adjust() -> None:
        monkeypatch.setattr(psutil, "boot_time", lambda: moved)
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: moved)
    return adjust


def test_a_session_owner_is_still_itself_after_the_clock_moves(child: subprocess.Popen[bytes],
                                                              adjust_clock: Callable[[], None]) -> None:
    identity = ProcessIdentity.of(child.pid, 0)
    adjust_clock()
    assert identity is not None and identity.alive()
    assert same_start(lineage(child.pid)[0][1], identity.create_time)
    assert identity == ProcessIdentity.of(child.pid, 0)
    child.kill()
    child.wait()
    assert not identity.alive()


def test_a_process_born_after_the_trials_agent_is_never_older_than_it(child: subprocess.Popen[bytes],
                                                                      adjust_clock: Callable[[], None]) -> None:
    v = Vouch("m", set())
    adjust_clock()
    v.add_root(child.pid)
    later = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        born = lineage(later.pid)[0][1]  # as the remote reads a connection's holder
        assert v.roots_born is not None and born is not None and born >= v.roots_born
        assert v.since <= boot_clock()
        # an orphan hanging at init, born after the trial's first agent: not provably outside
        trial = Trial(runner=10**7, roots=frozenset({child.pid}), roots_born=v.roots_born, inside=frozenset())
        assert not trial.outside([(later.pid, born), (1, 0.0)])
    finally:
        later.kill()
        later.wait()
