"""CLI habits a user expects, each with real processes and real signals.

    nohup vaultsim daemon --foreground   a SIGHUP ignored at start (nohup) stopped the daemon when
                                         the terminal closed; `remote` and `mcp` alike
    Ctrl-C on remote, mcp, daemon        exit 0 (remote, mcp) where the help says 130; now 130 and
                                         one line on stderr, no traceback
    --json on an error                   nothing on stdout: a script parsing it got nothing; now
                                         {"error": ..., "exit_code": N} with the same exit code
    "1 prompts"                          counts in human output are pluralised
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from helpers import PY, ROOT, Sandbox, wait_for
from vault.cli.approver import format_stats


def _ignore_hup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does before it execs


def _spawn(sandbox: Sandbox, *args: str, preexec: Callable[[], None] | None = None,
           stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
    proc = subprocess.Popen([PY, "-m", "vault.cli.main", *args], cwd=ROOT, env=sandbox.env, text=True,
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=preexec)
    sandbox.procs.append(proc)  # ended by the sandbox whatever the test does
    return proc


def _finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _assert_one_interrupt_line(err: str, name: str) -> None:
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == f"vaultsim {name}: interrupted (Ctrl-C); stopped", err


def _start_foreground_daemon(sandbox: Sandbox, preexec: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    proc = _spawn(sandbox, "daemon", "--foreground", "--unlocked", preexec=preexec)
    wait_for(lambda: sandbox.status() is not None or proc.poll() is not None, timeout=60, what="the daemon")
    assert proc.poll() is None, proc.communicate()
    return proc


class TestHangUp:
    def test_daemon_under_nohup_outlives_its_terminal(self, sandbox: Sandbox) -> None:
        proc = _start_foreground_daemon(sandbox, preexec=_ignore_hup)
        os.kill(proc.pid, signal.SIGHUP)
        # a round trip through its event loop: a HUP it caught would have been acted on by then
        status = sandbox.status()
        assert status is not None and status["pid"] == proc.pid
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code, _, err = _finish(proc)
        assert 0 == code, err
        assert "stopping: signal SIGTERM" in err and "SIGHUP" not in err, err

    def test_daemon_hang_up_not_ignored_stops_it_cleanly(self, sandbox: Sandbox) -> None:
        proc = _start_foreground_daemon(sandbox)
        proc.send_signal(signal.SIGHUP)
        code, _, err = _finish(proc)
        assert 0 == code, err
        assert "stopping: signal SIGHUP" in err and "Traceback" not in err, err
        assert not sandbox.agent_sock.exists()  # stopped cleanly: its sockets removed

    def test_remote_under_nohup_outlives_its_terminal_and_stops_on_hup_otherwise(self, sandbox: Sandbox) -> None:
        for preexec, code_after_hup in ((_ignore_hup, None), (None, 0)):
            proc = _spawn(sandbox, "remote", preexec=preexec)
            assert proc.stdout is not None
            url = proc.stdout.readline().split("listening on ", 1)[1].strip()
            proc.send_signal(signal.SIGHUP)
            if code_after_hup is None:
                import httpx
                # answered after the HUP: still serving (a request is a turn of its event loop)
                assert 401 == httpx.get(f"{url}/v1/issues/X", trust_env=False, timeout=10).status_code
                assert proc.poll() is None
                proc.send_signal(signal.SIGTERM)
            code, _, err = _finish(proc)
            assert 0 == code, err
            assert "Traceback" not in err, err


class TestCtrlC:
    def test_remote_ctrl_c_is_130_with_one_line(self, sandbox: Sandbox) -> None:
        proc = _spawn(sandbox, "remote")
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("listening on ")
        proc.send_signal(signal.SIGINT)
        code, _, err = _finish(proc)
        assert 130 == code, err
        _assert_one_interrupt_line(err, "remote")

    def test_daemon_ctrl_c_is_130_after_a_clean_stop(self, sandbox: Sandbox) -> None:
        proc = _start_foreground_daemon(sandbox)
        proc.send_signal(signal.SIGINT)
        code, _, err = _finish(proc)
        assert 130 == code, err
        assert "stopping: signal SIGINT" in err
        _assert_one_interrupt_line(err, "daemon")
        assert not sandbox.agent_sock.exists()

    def test_mcp_stdio_ctrl_c_is_130_with_one_line(self, sandbox: Sandbox) -> None:
        pytest.importorskip("mcp.server.stdio", reason="the mcp SDK is not installed")
        proc = _spawn(sandbox, "mcp", "--wait", stdin=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
                         '"capabilities":{},"clientInfo":{"name":"raw-host","version":"0"}}}\n')
        proc.stdin.flush()
        assert '"id":1' in proc.stdout.readline().replace(" ", "")  # serving: its handlers are in place
        proc.send_signal(signal.SIGINT)
        code, _, err = _finish(proc)
        assert 130 == code, err
        _assert_one_interrupt_line(err, "mcp")

    def test_mcp_http_ctrl_c_is_130_term_and_hup_0(self, sandbox: Sandbox) -> None:
        """--http: uvicorn's own handling re-raised SIGTERM once stopped (killed by it, -15) and
        left SIGHUP to kill it with every session open; each now ends the sessions and returns."""
        pytest.importorskip("mcp.server.stdio", reason="the mcp SDK is not installed")
        for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, 0), (signal.SIGHUP, 0)):
            proc = _spawn(sandbox, "mcp", "--wait", "--http", "127.0.0.1:0")
            assert proc.stderr is not None
            assert "serving http://" in proc.stderr.readline()  # said once its handlers are in place
            proc.send_signal(sig)
            code, _, err = _finish(proc)
            assert expected == code, (sig, err)
            if sig == signal.SIGINT:
                _assert_one_interrupt_line(err, "mcp")
            else:
                assert "" == err, err

    def test_mcp_stdio_sigint_ignored_at_start_stays_ignored(self, sandbox: Sandbox) -> None:
        """A host that starts its servers with SIGINT ignored (a `&` job) keeps them through its Ctrl-C."""
        pytest.importorskip("mcp.server.stdio", reason="the mcp SDK is not installed")

        def ignore_int() -> None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        proc = _spawn(sandbox, "mcp", "--wait", stdin=subprocess.PIPE, preexec=ignore_int)
        assert proc.stdin is not None and proc.stdout is not None
        init = ('{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
                '"capabilities":{},"clientInfo":{"name":"raw-host","version":"0"}}}\n')
        proc.stdin.write(init % 1)
        proc.stdin.flush()
        assert '"id":1' in proc.stdout.readline().replace(" ", "")
        proc.send_signal(signal.SIGINT)
        proc.stdin.write('{"jsonrpc":"2.0","id":2,"method":"ping"}\n')  # answered: still serving
        proc.stdin.flush()
        assert '"id":2' in proc.stdout.readline().replace(" ", "")
        proc.send_signal(signal.SIGTERM)
        code, _, err = _finish(proc)
        assert 0 == code, err


class TestJsonErrors:
    def _json(self, out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        doc = json.loads(out.stdout)
        assert isinstance(doc, dict) and doc["error"] and doc["exit_code"] == out.returncode, out.stdout
        assert doc["error"] in out.stderr  # the human line is still on stderr
        return doc

    def test_no_daemon_is_exit_1_with_a_json_error(self, sandbox: Sandbox) -> None:
        for args in (("lock", "--json"), ("unlock", "--json"), ("stats", "--json")):
            out = sandbox.vaultsim(*args)
            assert 1 == out.returncode, out.stderr
            doc = self._json(out)
            assert "vaultsim daemon" in doc["hint"]

    def test_usage_and_bad_input_are_exit_2_with_a_json_error(self, sandbox: Sandbox, tmp_path: Path) -> None:
        for args in (("status", "--json", "--bogus"), ("secret", "list", "--json", "--bogus"),
                     ("audit", "verify", str(tmp_path / "missing.log"), "--json"),
                     ("daemon", "--foreground", "--json"),
                     ("policy", "suggest", str(tmp_path / "missing.json"), "--json")):
            out = sandbox.vaultsim(*args)
            assert 2 == out.returncode, (args, out.stderr)
            self._json(out)
        # without --json, stdout stays empty as before
        out = sandbox.vaultsim("status", "--bogus")
        assert (2, "") == (out.returncode, out.stdout)

    def test_a_daemon_already_serving_is_exit_1_with_a_json_error(self, sandbox: Sandbox) -> None:
        daemon = sandbox.start_daemon()
        out = sandbox.vaultsim("daemon", "--json")
        assert 1 == out.returncode, out.stderr
        assert daemon.pid == self._json(out)["pid"]


class TestPlurals:
    def test_stats_says_1_prompt(self) -> None:
        runs: dict[str, Any] = {"r1": {"prompts": 1, "read_prompts": 1, "repeated_scope_prompts": 1,
                                       "destructive_session_grants": 1, "unroutable": 0, "scopes_asked": {},
                                       "scopes_granted": {}, "decisions": {}},
                                "r2": {"prompts": 2, "read_prompts": 0, "repeated_scope_prompts": 2,
                                       "destructive_session_grants": 0, "unroutable": 0, "scopes_asked": {},
                                       "scopes_granted": {}, "decisions": {}}}
        text = format_stats({"runs": runs})
        assert "run r1: 1 prompt (1 for reads, 1 repeated scope, 1 destructive session grant," in text, text
        assert "run r2: 2 prompts (0 for reads, 2 repeated scopes, 0 destructive session grants," in text, text


class TestTuiHangUp:
    def _run_tui(self, sandbox: Sandbox, preexec: Callable[[], None] | None, signals: list[signal.Signals]) -> int:
        """The TUI on a pseudo-terminal; once it draws, each of `signals` in turn; its exit code."""
        pytest.importorskip("textual")
        import pty
        import select
        master, slave = pty.openpty()
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "tui"], cwd=ROOT, env={**sandbox.env, "TERM": "xterm"},
                                stdin=slave, stdout=subprocess.DEVNULL, stderr=slave, start_new_session=True,
                                preexec_fn=preexec)
        sandbox.procs.append(proc)
        os.close(slave)
        drawn = 0
        deadline = time.monotonic() + 60
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if select.select([master], [], [], 0.1)[0]:
                    try:
                        drawn += len(os.read(master, 65536))  # drained, or it would block drawing
                    except OSError:
                        break
                if drawn > 2000 and signals:  # it draws: its handlers are in place (set before it runs)
                    for sig in signals:  # pending together, HUP (1) is delivered before TERM (15)
                        proc.send_signal(sig)
                    signals = []
            return proc.wait(timeout=30)
        finally:
            os.close(master)

    def test_tui_under_nohup_outlives_its_terminal(self, sandbox: Sandbox) -> None:
        """Its HUP ignored (nohup): the TERM after it is what stops it (143)."""
        assert 143 == self._run_tui(sandbox, _ignore_hup, [signal.SIGHUP, signal.SIGTERM])

    def test_tui_hang_up_not_ignored_restores_the_terminal_as_term_does(self, sandbox: Sandbox) -> None:
        assert 128 + signal.SIGHUP == self._run_tui(sandbox, None, [signal.SIGHUP])
