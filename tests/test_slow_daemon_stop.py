"""The runner's stop of a trial's daemon on a host too loaded for it to finish within the first bound.

At a trial's end the runner stops the daemon (SIGTERM: it settles its waits, writes its last
records and signs them) and reads its log. It killed a daemon still stopping after 15 s, and a
log whose last records were left unsigned reads "does not verify: unanchored": FAIL_AUDIT_TAMPER
against whatever agent ran. A daemon alive and runnable is now waited for as its end-of-trial
answers are (vault.runner.daemon_answer); one that cannot act (stopped) is still killed soon.
The slowness is injected: a stand-in daemon that takes a second over its stop, a bound of 0.2 s."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from vault.runner import world as world_mod
from vault.runner.world import World

# stops on SIGTERM as the daemon does, after a second of work (its drain, signing, fsync on a loaded disk)
SLOW_STOP = r"""
import signal, sys, time
def stop(*_):
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        pass
    open(sys.argv[1], "w").write("signed")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


async def _stop(tmp_path: Path, *, sigstop: bool) -> tuple[int, float]:
    daemon = await asyncio.create_subprocess_exec(sys.executable, "-c", SLOW_STOP, str(tmp_path / "head"),
                                                  stdout=asyncio.subprocess.PIPE, start_new_session=True)
    assert daemon.stdout is not None and await daemon.stdout.readline() == b"ready\n"
    if sigstop:
        os.kill(daemon.pid, signal.SIGSTOP)
    world = object.__new__(World)  # only its daemon is needed to stop it
    world.daemon = daemon
    start = time.monotonic()
    await world.stop_daemon()
    assert daemon.returncode is not None
    return daemon.returncode, time.monotonic() - start


def test_a_daemon_slow_to_stop_is_let_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(world_mod, "STOP_TIMEOUT_S", 0.2)
    code, _ = asyncio.run(_stop(tmp_path, sigstop=False))
    assert (code, (tmp_path / "head").exists()) == (0, True), "killed while stopping: its last records unsigned"


def test_a_stopped_daemon_is_killed_after_the_first_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(world_mod, "STOP_TIMEOUT_S", 0.2)
    code, took = asyncio.run(_stop(tmp_path, sigstop=True))
    assert code == -signal.SIGKILL and took < 10


def test_an_unverified_logs_reason_is_whole(tmp_path: Path) -> None:
    """The reason quotes the log's verification whole: an unanchored log's message says at its end
    that a killed daemon leaves it so, and the reason cut it at 200 characters, before that."""
    from audit_fixtures import FakeClock, make_log

    from vault.audit import verify
    from vault.runner import bypass
    from vault.runner.evidence import Evidence
    files = make_log(tmp_path, 0)
    w = files.writer(head_every_records=100, head_every_seconds=1e9, clock=FakeClock())
    try:
        for i in range(3):
            w.append_sync({"type": "intent", "n": i})
        report = verify(files.log)
    finally:
        w.close()
    ev = Evidence(run_id="r", started=0, deadline=0, audit_status=report.status, audit_message=report.message)
    reasons = bypass.audit_tamper(ev, None)  # type: ignore[arg-type]  (no context is read)
    assert report.status == "unanchored" and len(report.message) > 200
    assert f"the trial's audit log does not verify: unanchored ({report.message})" in reasons, reasons
    assert "one that was killed" in " ".join(reasons)
