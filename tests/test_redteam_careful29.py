"""Red team, twenty-ninth pass (c): careful agents with habits a loaded 2-core machine punishes.

tests/agents/rt29c_agent.py, written from docs/agent-contract.md alone, follows the contract and
adds habits real agents have: it thinks 2-4 s before its first connect and 1-3 s between turns
(never past what its deadline leaves for the work), burns CPU in a thread beside its calls, prints
tens of MB of progress lines on stdout and stderr, prints its final message from an atexit
handler after its worker thread is joined, and on SIGTERM finishes its call and says
`not done: stopped`.

Swept over the whole suite (42 scenarios) on this 2-core host, shared with other runs (load 7-11):
`--slow --busy` jailed at `-j 4` beside two `while 1: pass` hogs: 42 of 42 as expected. Two false
FAILs, both the runner's own process being slow under load, not the agents:

* `--loud 20 --atexit --busy --json-final`, jailed, `-j 4`, hogs: 6 of 30 FAIL_DEADLINE (gate-8
  "the agent made no call", gate-6, fresh-process, malformed-3, malformed-4, pair-expired-token).
  The agent's stdout and stderr are pipes of 64 KiB copied by a thread of the runner, which waits
  for the GIL behind the trials' grading at each wake-up: writing 16 MB took 4-11 s beside three
  busy threads (1 s with a 1 MiB pipe), and the agent was held on its own writes past its deadline.
  The pipes now hold 1 MiB (vault.runner.pump): the suite 42 of 42 under the same stress (812 s);
  `--sigterm --slow --loud 10 --atexit` without a jail at `-j 4`, 8 scenarios: 8 of 8.
* `--slow --busy --non-blocking`, `--isolation none`, `-j 8`, hogs (trials 100-240 s): c06a and c07
  FAIL_AUDIT_TAMPER, "the daemon did not answer the runner at the end of the trial". Its
  end-of-trial questions (prompt stats, audit head) had 10 s; a daemon alive and runnable now gets
  up to 120 s (vault.runner.daemon_answer); one stopped, traced or gone is still not waited on.
  The c01-c07 scenarios again under that stress: 8 of 8.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_redteam_careful import vaultsim_run

from vault.jail.probe import problem
from vault.runner import daemon_answer
from vault.runner.pump import CHUNK, OutputPump

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
AGENT = ROOT / "tests" / "agents" / "rt29c_agent.py"
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")

# a real process on a Unix socket that answers one line, but only once it reads "go" on stdin:
# a daemon held back by a loaded host, made deterministic
SLOW_SERVER = r"""
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
conn.makefile("rb").readline()
sys.stdin.readline()
conn.sendall(b'{"answer": 42}\n')
"""


def _server(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    path = str(tmp_path / "d.sock")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVER, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc, path


async def _question(path: str) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(b'{"method": "status"}\n')
        await writer.drain()
        return {"line": (await reader.readline()).decode()}
    finally:
        writer.close()


def test_a_live_daemon_slow_to_answer_is_waited_for(tmp_path: Path) -> None:
    """The daemon answers after the first bound has passed, while it is alive and runnable: the
    answer is taken (before, the trial was FAIL_AUDIT_TAMPER, "did not answer the runner")."""
    proc, path = _server(tmp_path)
    try:
        def go() -> None:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        answer, answered = asyncio.run(daemon_answer.ask(proc.pid, lambda: _question(path), first_s=0.2,
                                                         patient_s=60, on_slow=go))
        assert answered
        assert answer == {"line": '{"answer": 42}\n'}
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_daemon_is_not_waited_for(tmp_path: Path) -> None:
    """A daemon that cannot answer (SIGSTOP'd, as an agent without a jail may) still ends the
    wait soon after the first bound, not at the patient one: the run never hangs on it."""
    proc, path = _server(tmp_path)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        answer, answered = asyncio.run(daemon_answer.ask(proc.pid, lambda: _question(path), first_s=0.2,
                                                         patient_s=60))
        assert (answer, answered) == (None, False)
        assert time.monotonic() - start < 30
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_a_gone_daemon_is_not_waited_for(tmp_path: Path) -> None:
    proc, path = _server(tmp_path)
    pid = proc.pid
    proc.kill()
    proc.wait()
    start = time.monotonic()

    async def never() -> None:
        await asyncio.Event().wait()
    answer, answered = asyncio.run(daemon_answer.ask(pid, never, first_s=0.2, patient_s=60))
    assert (answer, answered) == (None, False)
    assert time.monotonic() - start < 30


def test_an_agent_can_write_a_chunk_to_its_stdout_before_the_runner_reads(tmp_path: Path) -> None:
    """The pipe an agent prints into holds 1 MiB, not the kernel's 64 KiB: the runner's copying
    thread waits for the GIL behind the grading of the trials beside it at every wake-up, and an
    agent printing 20 MB of progress (jailed, -j 4 beside a CPU hog) was held on its own writes
    until it missed its deadline (gate-8: "the agent made no call", FAIL_DEADLINE)."""
    pump = OutputPump(tmp_path / "out")
    try:
        with open(pump.writer, "wb") as w:
            said = subprocess.run([sys.executable, "-c", "import fcntl, sys\n"
                                   "print(fcntl.fcntl(1, fcntl.F_GETPIPE_SZ), file=sys.stderr)\nprint('done')"],
                                  stdout=w, stderr=subprocess.PIPE, text=True, check=True, timeout=60)
    finally:
        pump.finish()
    assert int(said.stderr) >= CHUNK
    assert (tmp_path / "out").read_text() == "done\n"


def _trials(names: tuple[str, ...], agent_args: str, report: Path, *extra: str) -> dict[str, dict[str, Any]]:
    run = vaultsim_run([SCENARIOS / f"{n}.yaml" for n in names], f"python3 {AGENT} {agent_args}", report,
                       "--jobs", "2", *extra, timeout=400)
    trials = {s["id"]: t for s in run["json"].get("scenarios", []) for t in s["trial_results"]}
    assert len(trials) == len(names), run["out"][-2000:]
    return trials


def _surprises(trials: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: (t["verdict"], t["reasons"]) for k, t in trials.items() if not t["ok"]}


@needs_bwrap
def test_a_slow_thinker_with_a_busy_thread_gets_the_expected_verdicts(tmp_path: Path) -> None:
    """2-4 s before its first connect, 1-3 s between turns, a CPU-bound thread beside its calls,
    a SIGTERM handler (the runner sends none in a trial: a process past its deadline is killed):
    the restart that resumes a timed approval, a late response and a wait at the deadline."""
    names = ("gate-6-restart-resumes-receipt", "c05-create-deployment-late-response", "gate-8-deadline")
    trials = _trials(names, "--slow --busy --sigterm", tmp_path / "r.json")
    assert _surprises(trials) == {}
    assert trials["gate-8-deadline"]["verdict"] == "EXPECTED_WAIT"


@needs_bwrap
def test_a_chatty_agent_whose_final_message_comes_from_atexit_is_read(tmp_path: Path) -> None:
    """16 MB of progress lines on stdout and stderr (the first part before its first connect, on
    gate-8's 8 s deadline), the final message (JSON with `status`) printed by an atexit handler
    after its worker thread joined, a busy thread beside it, polling with `wait_s: 0`."""
    names = ("gate-8-deadline", "c07-update-record-rate-limited")
    trials = _trials(names, "--loud 16 --atexit --busy --json-final --non-blocking", tmp_path / "r.json")
    assert _surprises(trials) == {}
    assert trials["gate-8-deadline"]["verdict"] == "EXPECTED_WAIT"
    assert trials["c07-update-record-rate-limited"]["verdict"] == "PASS"
