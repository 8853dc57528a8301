"""Red team, fifteenth pass: careful agents never seen by the project must not get a false FAIL.

Written from docs/agent-contract.md and README alone. Found and fixed here: a final message
coloured with terminfo's sequences (`tput sgr0`, and curses-based colour libraries, reset colour
with xterm's `ESC ( B ESC [ m`) was read with `(B` as text: `✔ Status: done` with a reset after
the mark, or a `done` line followed by a line holding only the reset (a script resetting the
terminal as it exits), claimed nothing, FAIL_OUTCOME in every scenario whose agent is done or
waits. ESC and one or two bytes (a character set chosen, the cursor saved or restored, keypad
modes) now draw nothing, and a cursor restored to where it was saved (ESC 7 / ESC 8, CSI s / u: a
spinner) draws over what it wrote since. And past 4 MiB of progress redrawn after `\r` (a line end,
§7) with no `\n`, the runner's output tail took the first frame as the start of one long final
line: the `done` drawn last was lost (FAIL_OUTCOME), or a `waiting ...` frame claimed a wait.

Agents (tests/agents): rt15c_mcp.sh (bash and jq driving `vaultsim mcp` over stdio: no raw
socket; vault_resume, vault_lookup after every outcome_unknown; RT15_FINAL=tput colours the final
message with tput) and rt15c_spawn.py (helpers started with os.posix_spawn and waited for with a
deadline, a FIFO in state_dir per helper, state versioned with git in state_dir, a journal in
$TMPDIR, `vault.status` and `catalog` first, lookups by correlation id or idempotency key;
RT15_FINAL: yaml, table, spinner, cr, crlf, nonl, json, long). Each swept the whole suite in the jail and
with --isolation none: 42 of 42 as expected after the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import PY, ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.runner.claims import claim_of
from vault.runner.evidence import AgentRun

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"
SGR0 = "\x1b(B\x1b[m"  # `tput -T xterm sgr0`


def _final(stdout: str) -> str:
    return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final


def test_terminfo_resets_draw_nothing() -> None:
    """`ESC ( B` (xterm's sgr0 begins with it) drew `(B` before the fix: each of these claimed
    nothing, or the reset line alone was read as the final message."""
    for text, want in ((f"\x1b[32m✔{SGR0} \x1b[1mStatus:{SGR0} done (3 steps)\n", "done"),
                       (f"\x1b[1mStatus:{SGR0} waiting: r-1\n", "wait"),
                       (f"{SGR0}done: 3 steps\n", "done"),
                       (f"done: 3 steps\n{SGR0}\n", "done"),
                       (f"waiting: r-1\n{SGR0}\n\x1b7\x1b8\n", "wait"),
                       (f"\x1b[31m✘{SGR0} not done: denied\n{SGR0}\n", "not_done")):
        assert want == claim_of(_final("log\n" + text)), repr(text)


def test_a_cursor_restored_draws_over_what_it_saved() -> None:
    """A spinner saves the cursor (ESC 7 or CSI s), draws frames from there and its word last."""
    for text, want in (("\x1b7working |\x1b8working /\x1b8\x1b[Kdone: 3 steps\n", "done"),
                       ("\x1b[sworking\x1b[u\x1b[Kwaiting: r-1\n", "wait"),
                       ("\x1b7done\x1b8\x1b[Kfailed: denied\n", "not_done"),
                       ("not\x1b7 done\n", "not_done")):
        assert want == claim_of(_final(text)), repr(text)


@pytest.mark.timeout(600)
def test_an_mcp_shell_agent_coloured_by_tput_is_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rt15c_mcp.sh (bash and jq over `vaultsim mcp`) ends `✔ Status: done (…)` coloured with
    tput and a reset line: FAIL_OUTCOME in gate-1 (done) and gate-2 (a wait) before the fix."""
    monkeypatch.setenv("RT15_FINAL", "tput")
    monkeypatch.setenv("RT15_VAULTSIM", f"{PY} -m vault.cli.main")
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-1-healthy-delivery", "gate-2-legitimate-approval",
                                               "c03-delete-release-denied")]
    run = vaultsim_run(paths, f"bash {AGENTS / 'rt15c_mcp.sh'}", tmp_path / "r.json")
    assert run["code"] == 0 and not surprises(run), (surprises(run), run["out"][-2000:])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("final", ["yaml", "table", "spinner", "cr"])
def test_a_spawning_agent_with_git_state_is_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     final: str) -> None:
    """rt15c_spawn.py: helpers by posix_spawn, a FIFO and a git repository in state_dir, a YAML or
    markdown-table final message, a spinner's last frame (drawn from a saved cursor), or the word
    after 4.5 MiB of progress redrawn after `\r` (both claimed nothing before the fix); across a
    restart, a lost answer, a rate limit and a denial."""
    monkeypatch.setenv("RT15_FINAL", final)
    paths = [SCENARIOS / f"{s}.yaml" for s in ("gate-4-lost-answer", "gate-6-restart-resumes-receipt",
                                               "c07-update-record-rate-limited", "c03-delete-release-denied")]
    run = vaultsim_run(paths, f"{PY} {AGENTS / 'rt15c_spawn.py'}", tmp_path / "r.json", "--isolation", "none")
    assert run["code"] == 0 and not surprises(run), (surprises(run), run["out"][-2000:])


@pytest.mark.parametrize("mib", [2, 5])
def test_progress_redrawn_after_cr_is_not_the_final_line(tmp_path: Path, mib: int) -> None:
    """A `\\r` ends a line (§7). Past 4 MiB of progress redrawn after `\\r` with no `\\n`, the runner
    took the first frame as the start of one long final line: `waiting for approval ...` claimed a
    wait, and the `done` drawn last was lost."""
    from vault.runner.trial import output_tail
    frames = "".join(f"\rwaiting for approval r-1: {i / 1000:.3f}s" for i in range(mib * (1 << 20) // 36))
    out = tmp_path / "stdout"
    out.write_text("log\n" + frames + "\rdone: 3 steps\n")
    assert "done" == claim_of(_final(output_tail(out)))
    out.write_text("log\n" + frames + "\r\ndone: 3 steps")
    assert "done" == claim_of(_final(output_tail(out)))
