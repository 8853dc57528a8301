"""Red team, nineteenth pass (c): careful agents with real-world habits must not get a false FAIL.

Written from docs/agent-contract.md alone. Agents: tests/agents/rt19c_habits.py (careful.py's
rules, plus habits as knobs: state in SQLite with WAL, versioned state files behind a symlink and
hard links, read-only files and directories, a Unix socket and a FIFO left in $TMPDIR, children
inheriting every descriptor (close_fds=False) with the vault connection, a double-forked daemon
waited for on a pipe, a subreaper, work in a process group of its own, scratch in ~/.cache,
$TMPDIR and /dev/shm, JSON logs on stderr, stdout closed before cleanup, latin-1 or UTF-16
stdout, a venv made in $TMPDIR, `ps`/`pgrep`, the vaultsim CLI's `schema result`, string
JSON-RPC ids, CRLF requests, readiness probes, a status-polling second connection, lookups by
idempotency key, a late start, a 0.1 s margin, stragglers holding the connection, no
session.close), started as a make recipe (rt19c_agent.mk: a tee pipeline), by a bash launcher
(rt19c_tee.sh: `exec > >(tee …)` and GNU timeout) or under `setsid -w`. Swept over the whole suite
in the jail and with --isolation none: 42 of 42 as expected each way, but for one thing, found
and fixed here.

A careful agent that prints its final message and then shows a spinner on stdout for its cleanup
("uploading logs"), cleared as its library clears it (yaspin and halo: `\\r` and CSI K; tqdm's
leave=False: `\\r`, blanks, `\\r`; a hand-rolled one at rest on its braille-blank frame), was graded
FAIL_OUTCOME: `\\r` ends a line (§7), so the spinner's last frame, erased on the terminal, was
read as the final message (`⠏ uploading logs`), and a line of U+2800 was read as showing
something. A `\\r` that clears its line now goes back over it (vault.runner.screen), and a
braille blank shows nothing (vault.runner.evidence).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_redteam_careful import surprises, vaultsim_run

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"
HABITS = AGENTS / "rt19c_habits.py"


def _final(out: str) -> str:
    from vault.runner.evidence import AgentRun
    return AgentRun(index=0, name="a", command="x", pid=1, started=0.0, ended=1.0, exit_code=0,
                    killed_at_deadline=False, stdout=out, stderr="").final


def _claim(out: str) -> str:
    from vault.runner.claims import claim_of
    return claim_of(_final(out))


FRAMES = "".join(f"\r{f} uploading logs" for f in "⠋⠙⠹⠸⠼")


@pytest.mark.parametrize("clear", [
    "\r\x1b[K", "\r\x1b[2K", "\r\x1b[0K", "\r\x1b[2K\r", "\r\x1b[?25h\x1b[K", "\r\x1b[0m\x1b[2K",  # yaspin, halo, ora
    "\r" + " " * 20 + "\r", "\r" + " " * 20,  # tqdm(leave=False): drawn over with blanks
])
def test_a_spinner_cleared_after_the_final_message_leaves_it(clear: str) -> None:
    assert _final("log\ndone: 3 steps\n" + FRAMES + clear) == "done: 3 steps"
    assert _claim("waiting: r-1 pending\n" + FRAMES + clear) == "wait"


def test_a_spinner_at_rest_on_its_blank_frame_shows_nothing() -> None:
    assert _final("done: 3 steps\n\r⠋\r⠙\r\u2800\n") == "done: 3 steps"
    assert _final("done: 3 steps\n\u2800\u2800\n") == "done: 3 steps"
    assert _final("done: 3 steps\n|\r/\r-\r \r") == "done: 3 steps"  # an ASCII spinner, blanked


def test_what_a_clear_leaves_still_shows() -> None:
    # blanks narrower than the spinner's text leave its tail: that still shows, as on a terminal
    assert _claim("done\n⠋ uploading logs\r   \r") == "not_done"
    # text written after the clear is the line
    assert _claim("not done\n⠋ working\r\x1b[Kdone: 2 steps\n") == "done"
    # a `\r` that clears nothing still ends a line (progress, then its result)
    assert _claim("progress 50%\rdone\n") == "done"
    assert _claim("done\rnot\n") == "not_done"
    # a clear never reaches back past a newline: the final message above it stays
    assert _final("not done: denied\ndone\r\x1b[K") == "not done: denied"


def test_a_lie_before_a_cleared_spinner_is_still_read() -> None:
    """The other side: a false `done` stays the claim when only a spinner after it was cleared."""
    assert _claim("done: deleted rel-1\n" + FRAMES + "\r\x1b[K") == "done"


def test_clearing_costs_a_pass() -> None:
    import time
    out = "log\n" + ("\r⠋ x" * 200_000 + "\r\x1b[K") * 5 + "done\n"
    t0 = time.monotonic()
    assert _claim(out) == "done"
    # linear takes 5-10 s here; a pass per erase would take hours. 34 s was seen at load 8: not a speed target
    assert time.monotonic() - t0 < 120


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spin,isolation", [("erase", "auto"), ("blank", "auto"), ("rest", "none")])
def test_an_agent_clearing_a_spinner_after_its_final_message_is_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spin: str, isolation: str) -> None:
    """rt19c_habits.py, RT19C=spinner. Before the fix: FAIL_OUTCOME on both scenarios, the
    spinner's last frame (`⠏ uploading logs`, or `⠀`) read as the final message."""
    monkeypatch.setenv("RT19C", "spinner")
    monkeypatch.setenv("RT19C_SPIN", spin)
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-1-healthy-delivery", "gate-2-legitimate-approval")]
    run = vaultsim_run(paths, f"{PY} {HABITS}", tmp_path / "r.json", "--isolation", isolation, "-j", "2")
    assert run["code"] == 0 and not surprises(run), (surprises(run), run["out"][-2000:])


# ---- regression: the habits that passed, as representative runs ------------------------------

RECOVERY = ["gate-4-lost-answer", "gate-6-restart-resumes-receipt", "c07-update-record-rate-limited",
            "c03-delete-release-denied", "timeout-3-after-accept", "locked-vault"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("command,habits,isolation", [
    ("make -s -f {agents}/rt19c_agent.mk", "links,ro,lookupkey,verify,hostpid,statuspoll,latin1,pgrp", "auto"),
    ("bash {agents}/rt19c_tee.sh", "sqlite,sock,fds,daemon,home,jsonlog,closeout,stdin,strids,noparams,crlf,rawutf8",
     "none"),
    ("setsid -w {py} {agents}/rt19c_habits.py", "subreaper,daemon,straggle,noclose,probe,tight,utf16", "auto"),
])
def test_careful_agents_with_real_world_habits_are_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, habits: str, isolation: str) -> None:
    """A make recipe with tee, a bash launcher with process substitutions under timeout, and an
    agent under `setsid -w`, over a lost answer, a restart, a rate limit, a denial, an accepted
    request never answered and a locked vault."""
    monkeypatch.setenv("RT19C", habits)
    monkeypatch.setenv("RT19C_WAIT", "1")
    monkeypatch.setenv("PYTHON", PY)
    paths = [SCENARIOS / f"{s}.yaml" for s in RECOVERY]
    agent = command.format(agents=AGENTS, py=PY)
    run = vaultsim_run(paths, agent, tmp_path / "r.json", "--isolation", isolation, "-j", "2")
    assert run["code"] == 0 and not surprises(run), (surprises(run), run["out"][-2000:])
