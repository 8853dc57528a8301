"""What `vaultsim run` shows a person and tells CI: the table, colour, progress, -x, --list, exit codes.

The table is rendered from a recorded report (tests/run_report_fixture.py)
and compared with snapshots at 80 and 160 columns (update after a deliberate
change with `pytest --snapshot-update`); the rest runs `vaultsim run` for
real, in a pipe (CI) or on a pseudo-terminal (a person).
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT
from run_report_fixture import report
from vault.runner import table
from vault.runner.trial import TrialResult

SCENARIOS = ROOT / "scenarios"
HEALTHY = str(SCENARIOS / "gate-1-healthy-delivery.yaml")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# a colour (not bold): 30-37, 90-97, or 38;... in an SGR sequence
COLOUR_CODE = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|9[0-7])(?:;[0-9;]*)?m")


def rendered(width: int, doc: dict[str, Any] | None = None, color: str = "never") -> str:
    buf = io.StringIO()
    console = table.make_console(color, file=buf, width=width)
    doc = doc or report()
    table.show(console, table.header(doc["run"], len(doc["scenarios"]), doc["summary"]["trials"]))
    table.render(doc, console)
    return buf.getvalue()


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", "run", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def flat(text: str) -> str:
    """Text with its line wrapping undone (a pipe is 80 columns wide)."""
    return " ".join(text.split())


def homes(pid: int) -> list[Path]:
    return list(Path("/tmp").glob(f"vsr-{pid}-*"))


class TestTable:
    @pytest.mark.parametrize("width", [80, 160])
    def test_snapshot(self, width: int, snapshot: Any) -> None:
        """The header, the gate table and the summary, as a person sees them at this width."""
        assert snapshot == rendered(width)

    @pytest.mark.parametrize("width", [80, 100, 160])
    def test_fits_the_width(self, width: int) -> None:
        """No line is wider than the terminal; the scenario ids are never cut."""
        text = rendered(width)
        assert [] == [line for line in text.splitlines() if len(line) > width]
        for sc in report()["scenarios"]:
            assert sc["id"] in text

    def test_columns_are_dropped_by_priority(self) -> None:
        """Narrow: scenario, status, verdicts, prompts; wide: time, trials and prompts by scope too."""
        head = {w: rendered(w).splitlines()[3].split() for w in (80, 160)}
        assert ["SCENARIO", "STATUS", "VERDICTS", "PROMPTS"] == head[80]
        assert ["SCENARIO", "STATUS", "VERDICTS", "PROMPTS", "TIME", "TRIALS", "PROMPTS", "BY", "SCOPE"] == head[160]

    def test_status_words_read_as_the_gate_decides(self) -> None:
        """An expected FAIL_* reads `as expected`; a surprise reads UNEXPECTED with what was expected."""
        rows = {line.split()[0]: line for line in rendered(160).splitlines() if line[:1].isalnum()}
        assert "as expected  FAIL_DUPLICATE_EFFECT" in rows["gate-4-duplicate-effect"]
        assert "UNEXPECTED   FAIL_RECOVERY PASS×2" in rows["c05-create-deployment-late-response"]
        assert "ERROR" in rows["gate-2-legitimate-approval"] and "skipped" in rows["c06a-ssh-restart-client-killed"]
        assert "expected PASS" in rendered(160)
        assert re.search(r"\bok\b", rendered(160)) is None

    def test_summary_counts_skips_and_says_why(self) -> None:
        text = rendered(160)
        assert "5 as expected, 1 UNEXPECTED, 1 ERROR (harness), 1 skipped" in text
        assert "skipped 1 scenario: no OpenSSH server (sshd) on this machine (c06a-ssh-restart-client-killed)" in text

    def test_release_ok_never_hides_a_skip(self) -> None:
        doc = report()
        doc["summary"].update(release="ok", blocked_by=[], errors=[])
        assert "release OK for what ran; 1 scenario skipped, not verified here" in rendered(160, doc)

    def test_header_names_the_agent_and_isolation(self) -> None:
        doc = report()
        doc["run"].update(agent="python my_agent.py (--agent)", isolation="bwrap")
        for sc in doc["scenarios"]:
            for t in sc["trial_results"]:
                t["isolation"] = "bwrap"
        text = rendered(160, doc)
        assert "agent under test: python my_agent.py (--agent)" in text
        assert "isolation: bwrap" in text and "isolation: bwrap ×8" in text

    def test_every_failed_check_is_listed(self) -> None:
        """When the grader lists every failed check of a trial, each gets a line under it."""
        t = {"trial": 1, "verdict": "FAIL_SECRET_LEAK", "expected": "PASS", "ok": False, "duration_s": 1.0,
             "failed_checks": [{"verdict": "FAIL_SECRET_LEAK", "reason": "canary in stdout"},
                               {"verdict": "FAIL_DUPLICATE_EFFECT", "reason": "2 issues"}]}
        line = table.trial_line(3, 9, "leak", t).plain
        assert "FAIL_SECRET_LEAK: canary in stdout" in line and "FAIL_DUPLICATE_EFFECT: 2 issues" in line


class TestColour:
    def test_never_has_no_escape_codes(self) -> None:
        assert COLOUR.search(rendered(100, color="never")) is None

    def test_always_colours_even_a_pipe_and_despite_no_color(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A flag given by hand outranks NO_COLOR (no-color.org)."""
        monkeypatch.setenv("NO_COLOR", "1")
        assert COLOUR_CODE.search(rendered(100, color="always"))

    def test_auto_honours_no_color(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Even where colour would be on (FORCE_COLOR), NO_COLOR leaves no colour."""
        monkeypatch.setenv("FORCE_COLOR", "1")
        assert COLOUR_CODE.search(rendered(100, color="auto"))
        monkeypatch.setenv("NO_COLOR", "1")
        assert COLOUR_CODE.search(rendered(100, color="auto")) is None


def read_pty(fd: int, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Everything written to the terminal until the process exits."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out.decode(errors="replace")


class TestProgress:
    def test_ci_gets_a_plain_line_per_trial(self) -> None:
        """In a pipe (CI): one plain line per trial, no escape codes, the header first."""
        proc = run(HEALTHY, "--trials", "2")
        assert 0 == proc.returncode, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0].startswith("vaultsim run: 1 scenario, 2 trials (2 each, --trials)")
        assert 2 == sum(bool(re.match(r"\[\d/2\] as expected  PASS +gate-1-healthy-delivery #\d", x)) for x in lines)
        assert COLOUR.search(proc.stdout) is None

    def test_a_terminal_gets_a_live_line_and_colour(self) -> None:
        """On a terminal: the live progress line (cleared at the end), colour, and no per-trial lines."""
        leader, follower = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", HEALTHY, "--trials", "2"], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
        os.close(follower)
        try:
            text = read_pty(leader, proc, timeout=180)
            assert 0 == proc.wait(timeout=60), text
        finally:
            os.close(leader)
        assert "running" in text and "2/2" in text
        assert COLOUR_CODE.search(text)
        assert re.search(r"\[\d/2\] as expected", text) is None
        assert "release OK" in COLOUR.sub("", text)


class TestStopAndList:
    def test_exitfirst_stops_at_the_first_unexpected_verdict(self, tmp_path: Path) -> None:
        """-x: the first unexpected verdict ends the run; the rest are not run, nothing is left behind."""
        crash = tmp_path / "crash.py"
        crash.write_text("import sys\nprint('done: nothing')\nsys.exit(4)\n")
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", HEALTHY, "--trials", "4", "-j", "1", "-x",
                                 "--agent", f"{sys.executable} {crash}"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=180)
        assert 1 == proc.returncode, out + err
        assert "1 UNEXPECTED, 3 not run (-x: stopped at the first unexpected verdict)" in flat(out)
        assert "RELEASE BLOCKED by gate-1-healthy-delivery" in out
        assert [] == homes(proc.pid)

    def test_list_shows_what_would_run_and_runs_nothing(self) -> None:
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(SCENARIOS), "-k", "gate-1-healthy or c05-create",
                                 "--list"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=60)
        assert 0 == proc.returncode, err
        assert "gate-1-healthy-delivery  1 trial, expects PASS" in out
        assert "c05-create-deployment-late-response  1 trial, expects PASS" in out
        assert "scenarios/c05-create-deployment-late-response.yaml" in out
        assert "2 scenarios, 2 trials" in out and "SCENARIO" not in out and "release" not in out
        assert [] == homes(proc.pid)


class TestExitCodes:
    """pytest's numbers: 0 OK, 1 blocked, 2 bad input, 3 harness error, 5 nothing selected or ran."""

    def test_no_scenario_in_a_directory_is_nothing_selected(self, tmp_path: Path) -> None:
        proc = run(str(tmp_path))
        assert 5 == proc.returncode
        assert "no scenario selected" in proc.stderr

    def test_a_harness_error_is_no_decision(self, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
        """A trial whose world could not be set up is an ERROR: exit 3, not 'blocked' and not 'OK'.
        (The harness failure is stood in for: one cannot be caused on purpose without breaking the host.)"""
        import vault.runner.executor as runner_executor
        from vault.cli.main import main

        async def broken(rt: Any, sc: Any, number: int) -> TrialResult:
            return TrialResult(sc.id, number, sc.expect.verdict, "ERROR", error="RuntimeError: the daemon did not "
                               "answer in time")
        monkeypatch.setattr(runner_executor, "run_trial", broken)  # the local executor's trial
        assert 3 == main(["run", HEALTHY, "--no-fork-server"])
        out = flat(capsys.readouterr().out)
        assert "NO RELEASE DECISION: the harness failed for gate-1-healthy-delivery" in out
        assert "the daemon did not answer in time" in out

    def test_skips_pass_and_are_listed(self, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
        """A scenario that cannot run here (no sshd) is skipped: exit 0, and the summary says so and why."""
        from vault.cli.main import main
        from vault.runner import hosts
        monkeypatch.setattr(hosts, "ssh_unavailable_reason", lambda: "no OpenSSH server here (test)")
        assert 0 == main(["run", HEALTHY, str(SCENARIOS / "c06a-ssh-restart-client-killed.yaml")])
        out = flat(capsys.readouterr().out)
        assert "skipped 1 scenario: no OpenSSH server here (test) (c06a-ssh-restart-client-killed)" in out
        assert "release OK for what ran; 1 scenario skipped, not verified here" in out

    def test_nothing_ran_when_everything_was_skipped(self, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
        """Every selected scenario skipped: a release gate that verified nothing does not say OK (exit 5)."""
        from vault.cli.main import main
        from vault.runner import hosts
        monkeypatch.setattr(hosts, "ssh_unavailable_reason", lambda: "no OpenSSH server here (test)")
        assert 5 == main(["run", str(SCENARIOS / "c06a-ssh-restart-client-killed.yaml"), "--no-fork-server"])
        assert "NOTHING RAN: every selected scenario was skipped" in flat(capsys.readouterr().out)
