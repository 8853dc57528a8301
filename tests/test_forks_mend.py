"""A writer whose parent exited before the fanotify reader read its ancestry is told below the
process that forked it (vault.runner.forks.Forks.mend, vault.runner.opens_reader.writer_chain).

Why: sshd's session process writes the SSH host's log (ssh/sshd.log) last as its client leaves and
exits as its monitor does. Read from /proc then, its ancestry came out cut short (its monitor gone
between two reads) or as init's orphan (adopted): not below the trial's sshd, so the write was
charged to the agent, FAIL_VAULT_BYPASS (vault.runner.opens: an untold writer fails closed) in a
trial whose agent never touched the host. The kernel's fork reports say who forked it.

Here a shell starts a sleeper and exits: the sleeper, adopted, stands for that session process.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from vault.lineage import lineage
from vault.runner.forks import Forks
from vault.runner.opens_reader import writer_chain

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the proc connector needs root")


@pytest.fixture
def forks() -> Iterator[Forks]:
    heard = Forks.listen()
    if heard is None:
        pytest.skip("no proc connector here (not the initial namespaces, or no CONFIG_PROC_EVENTS)")
    yield heard
    heard.sock.close()


@pytest.fixture
def orphan() -> Iterator[tuple[int, int]]:
    """(the sleeper, the shell that forked it and is gone)."""
    out = subprocess.run(["sh", "-c", "sleep 30 </dev/null >/dev/null 2>&1 & echo $$ $!"],
                         capture_output=True, text=True, check=True, timeout=10).stdout.split()
    shell, sleeper = int(out[0]), int(out[1])
    yield sleeper, shell
    os.kill(sleeper, signal.SIGKILL)


@pytest.mark.timeout(30)
def test_an_adopted_writer_is_told_below_the_process_that_forked_it(forks: Forks, orphan: tuple[int, int]) -> None:
    sleeper, shell = orphan
    read = lineage(sleeper)
    # what the reader read before: neither the shell nor this process (the trial's sshd, there)
    assert read and read[0][0] == sleeper and not {shell, os.getpid()} & {p for p, _ in read}, read
    chain = writer_chain(sleeper, read, forks)
    assert [p for p, _ in chain[:3]] == [sleeper, shell, os.getpid()], chain


@pytest.mark.timeout(30)
def test_an_ancestry_cut_short_is_told_whole(forks: Forks, orphan: tuple[int, int]) -> None:
    sleeper, shell = orphan
    stump = lineage(sleeper)[:1]  # as read when its parent exited between two reads of /proc
    chain = writer_chain(sleeper, stump, forks)
    assert [p for p, _ in chain[:3]] == [sleeper, shell, os.getpid()], chain
    assert chain[-1][0] == 1, chain


@pytest.mark.timeout(30)
def test_an_ancestry_read_whole_is_left_as_read(forks: Forks) -> None:
    me = lineage(os.getpid())
    assert writer_chain(os.getpid(), me, forks) == me
