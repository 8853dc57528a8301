"""`vaultsim approve` and the stop signals, with a real daemon and real signals.

    SIGTERM, SIGHUP     killed it (-15, -1): no clean disconnect, nothing said; now it closes
                        its connection (the daemon sees it leave at once) and exits 0
    SIGINT (Ctrl-C)     130 and one line on stderr, as every command
    nohup               a SIGHUP ignored at start stays ignored: it goes on answering

`vaultsim demo`'s signals are tested in a terminal: tests/test_tui_demo.py (TestDemoSignals).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Callable

from helpers import PY, ROOT, Sandbox, wait_for


def _ignore_hup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does before it execs


def _approvers(sandbox: Sandbox) -> int:
    return int((sandbox.status() or {}).get("approvers", -1))


def _start_approve(sandbox: Sandbox, rules: list[dict[str, object]], log: Path,
                   preexec: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    script = sandbox.write("rules.yaml", {"name": "ci", "rules": rules})
    before = _approvers(sandbox)
    proc = subprocess.Popen([PY, "-m", "vault.cli.main", "approve", "--script", str(script), "--log", str(log)],
                            cwd=ROOT, env=sandbox.env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=preexec)
    sandbox.procs.append(proc)  # ended by the sandbox whatever the test does
    wait_for(lambda: _approvers(sandbox) > before or proc.poll() is not None, timeout=60,
             what="the approver to subscribe")
    assert proc.poll() is None, proc.communicate()
    return proc


class TestApproveSignals:
    def test_term_and_hang_up_disconnect_cleanly_ctrl_c_is_130(self, sandbox: Sandbox) -> None:
        sandbox.start_daemon()
        for sig, expected in ((signal.SIGTERM, 0), (signal.SIGHUP, 0), (signal.SIGINT, 130)):
            proc = _start_approve(sandbox, [{"decide": "deny"}], sandbox.root / f"{sig.name}.log")
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=30)
            assert expected == proc.returncode, (sig, err)
            assert "Traceback" not in err, err
            if sig == signal.SIGINT:
                assert err.strip().splitlines() == ["vaultsim approve: interrupted (Ctrl-C); stopped"], err
            else:
                assert err.strip().splitlines() == [f"vaultsim approve: {sig.name}: disconnected from the "
                                                    "daemon; exiting"], err
            # its connection closed: the daemon counts no approver (a killed one leaves that to the kernel)
            wait_for(lambda: _approvers(sandbox) == 0, timeout=10, what="the daemon to see the approver leave")

    def test_a_hang_up_ignored_at_start_stays_ignored(self, sandbox: Sandbox) -> None:
        """Under nohup a HUP changes nothing: the approver still answers the next prompt."""
        sandbox.start_daemon()
        log = sandbox.root / "decisions.log"
        proc = _start_approve(sandbox, [{"match": {"operation": "create_issue"}, "decide": "deny",
                                         "reason": "not now"}], log, preexec=_ignore_hup)
        proc.send_signal(signal.SIGHUP)  # discarded by the kernel: nothing of ours runs
        run = sandbox.run_agent([{"call": "create_issue", "params": {"title": "after the HUP"}}])
        assert "approval_denied" == run.results[0]["category"], run.proc.stdout
        assert proc.poll() is None
        decisions = [json.loads(line) for line in log.read_text().splitlines()]
        assert [("create_issue", "deny", True)] == [(d["operation"], d["decision"], d["accepted"])
                                                   for d in decisions]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert 0 == proc.returncode, err


_PROGRAM = """
import pathlib, signal, sys, time
ready = pathlib.Path(sys.argv[1])
disposition = "ignored" if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else "default"
ready.with_suffix(".tmp").write_text(disposition)
ready.with_suffix(".tmp").rename(ready)
while True:
    time.sleep(60)  # ended by the signal the test sends
"""


class TestExecSignals:
    """`vaultsim exec` under nohup: its keeper and its program keep SIGHUP ignored.

    A HUP, then a TERM, are sent at once: pending together, HUP is delivered first
    (lower number). `exec` ends as its program did (by the same signal). Before, the
    keeper passed the HUP on and the program died of it (-1); now the HUP is
    discarded and the TERM ends it (-15). Without nohup the HUP is passed on (-1)."""

    def _exec(self, sandbox: Sandbox, isolation: str, preexec: Callable[[], None] | None) -> tuple[int, str]:
        ready = sandbox.root / f"ready-{isolation}-{preexec is not None}"
        argv = [PY, "-m", "vault.cli.main", "exec", "--isolation", isolation, "--workdir", str(sandbox.root),
                "--", PY, "-c", _PROGRAM, str(ready)]
        proc = subprocess.Popen(argv, cwd=ROOT, env=sandbox.env, text=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=preexec)
        sandbox.procs.append(proc)
        wait_for(lambda: ready.exists() or proc.poll() is not None, timeout=60, what="the program to start")
        assert proc.poll() is None, proc.communicate()
        disposition = ready.read_text()
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err
        return proc.returncode, disposition

    def test_a_hang_up_ignored_at_start_stays_ignored_for_the_program(self, sandbox: Sandbox) -> None:
        sandbox.start_daemon()
        for isolation in ("none", "auto"):
            code, disposition = self._exec(sandbox, isolation, _ignore_hup)
            assert (-signal.SIGTERM, "ignored") == (code, disposition), isolation

    def test_a_hang_up_not_ignored_is_passed_on(self, sandbox: Sandbox) -> None:
        sandbox.start_daemon()
        code, disposition = self._exec(sandbox, "none", None)
        assert (-signal.SIGHUP, "default") == (code, disposition)
